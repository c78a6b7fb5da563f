"""Blocks equal torch.nn.TransformerEncoderLayer; LayerNorm equals nn.LayerNorm; equivariance."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import transformer_course as tc
from transformer_course.block import (
    MLP,
    LayerNorm,
    PostNormBlock,
    PreNormBlock,
    TransformerStack,
    gelu,
    layer_norm_reference,
)
from transformer_course.exercises import _sizes
from transformer_course.exercises import block as eb
from transformer_course.self_attention import causal_mask

# ----------------------------------------------------------------------------------------------
# The module


def _layers(norm_first: bool, activation: str, D=16, H=4, d_ff=24, seed=0):
    torch.manual_seed(seed)
    theirs = nn.TransformerEncoderLayer(
        D, H, d_ff, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    ).double()
    cls = PreNormBlock if norm_first else PostNormBlock
    ours = cls(D, H, d_ff=d_ff, activation=activation).double().load_from_torch(theirs)
    return ours, theirs


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("masked", [False, True])
def test_blocks_equal_torch_encoder_layer(norm_first, activation, masked):
    ours, theirs = _layers(norm_first, activation)
    theirs.eval()  # torch's fused inference fast path must agree too
    X = torch.randn(3, 7, 16, dtype=torch.float64, requires_grad=True)
    X2 = X.detach().clone().requires_grad_(True)
    mask = causal_mask(7) if masked else None
    Y = ours(X, mask=mask)
    theirs.train()  # the training path, for gradients
    Y_t = theirs(X2, src_mask=None if mask is None else ~mask)
    torch.testing.assert_close(Y, Y_t, atol=1e-10, rtol=0)
    Y.square().sum().backward()
    Y_t.square().sum().backward()
    torch.testing.assert_close(X.grad, X2.grad, atol=1e-10, rtol=0)
    torch.testing.assert_close(
        ours.mlp.fc1.weight.grad, theirs.linear1.weight.grad, atol=1e-10, rtol=0
    )
    with torch.no_grad():
        theirs.eval()
        torch.testing.assert_close(
            ours(X, mask=mask), theirs(X2, src_mask=None if mask is None else ~mask)
        )


def test_layernorm_equals_torch_and_the_formula():
    torch.manual_seed(0)
    X = torch.randn(4, 5, 8, dtype=torch.float64) * 3 + 1
    ln = nn.LayerNorm(8).double()
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    ours = LayerNorm(8).double()
    ours.load_state_dict(ln.state_dict())
    torch.testing.assert_close(ours(X), ln(X), atol=1e-12, rtol=0)
    # by hand for one token
    x = X[1, 2]
    mu = x.mean()
    var = ((x - mu) ** 2).mean()
    expected = ln.weight * (x - mu) / torch.sqrt(var + 1e-5) + ln.bias
    torch.testing.assert_close(ours(X)[1, 2], expected, atol=1e-12, rtol=0)


def test_layernorm_module_equals_the_reference_formula():
    torch.manual_seed(1)
    ln = LayerNorm(16).double()
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    X = torch.randn(3, 5, 16, dtype=torch.float64) * 4 - 2
    torch.testing.assert_close(
        ln(X), layer_norm_reference(X, ln.weight, ln.bias), atol=1e-12, rtol=0
    )


def test_layernorm_normalises_each_token():
    Y = layer_norm_reference(torch.randn(6, 32) * 5 + 3, torch.ones(32), torch.zeros(32), eps=0.0)
    torch.testing.assert_close(Y.mean(-1), torch.zeros(6), atol=1e-6, rtol=0)
    torch.testing.assert_close(Y.var(-1, unbiased=False), torch.ones(6), atol=1e-5, rtol=0)


def test_gelu_is_x_times_the_normal_cdf_not_its_tanh_approximation():
    """eq-block-gelu: exact GELU, x (1 + erf(x / sqrt 2)) / 2, entry by entry; the MLP uses it."""
    import math

    x = torch.linspace(-6, 6, 241, dtype=torch.float64)
    by_erf = torch.tensor(
        [v / 2 * (1 + math.erf(v / math.sqrt(2))) for v in x.tolist()], dtype=torch.float64
    )
    torch.testing.assert_close(gelu(x), by_erf, atol=1e-15, rtol=0)
    tanh_form = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    assert (gelu(x) - tanh_form).abs().max() > 1e-5  # the approximation is another function
    # derivative Phi(x) + x phi(x): non-zero for negative x except at GELU's minimum (x ~ -0.75)
    x_neg = torch.tensor([-3.0, -1.5, -0.5, -0.1], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(gelu(x_neg).sum(), x_neg)
    cdf = 0.5 * (1 + torch.erf(x_neg.detach() / math.sqrt(2)))
    pdf = torch.exp(-(x_neg.detach() ** 2) / 2) / math.sqrt(2 * math.pi)
    torch.testing.assert_close(g, cdf + x_neg.detach() * pdf, atol=1e-15, rtol=0)
    assert (g != 0).all()
    torch.manual_seed(0)
    mlp = MLP(4, 8, "gelu").double()
    X = torch.randn(3, 4, dtype=torch.float64)
    W_1, b_1 = mlp.fc1.weight.detach().T, mlp.fc1.bias.detach()
    W_2, b_2 = mlp.fc2.weight.detach().T, mlp.fc2.bias.detach()
    torch.testing.assert_close(mlp(X), gelu(X @ W_1 + b_1) @ W_2 + b_2, atol=1e-14, rtol=0)


def test_mlp_is_token_wise():
    torch.manual_seed(0)
    mlp = MLP(8, 16, "gelu")
    X = torch.randn(2, 5, 8)
    per_token = torch.stack([torch.stack([mlp(x) for x in seq]) for seq in X])
    torch.testing.assert_close(mlp(X), per_token)


@settings(max_examples=15, deadline=None)
@given(
    N=st.integers(1, 9),
    B=st.integers(1, 3),
    pre=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_blocks_are_permutation_equivariant(N, B, pre, seed):
    """Permuting the tokens permutes the outputs: block(P X) = P block(X) (no positions, no mask)."""
    torch.manual_seed(seed)
    block = (PreNormBlock if pre else PostNormBlock)(8, 2, d_ff=16).double()
    X = torch.randn(B, N, 8, dtype=torch.float64)
    perm = torch.randperm(N)
    torch.testing.assert_close(block(X[:, perm]), block(X)[:, perm], atol=1e-10, rtol=0)


def test_stack():
    torch.manual_seed(0)
    stack = TransformerStack(PreNormBlock, 3, 8, 2, d_ff=16)
    assert len(stack.blocks) == 3 and isinstance(stack.final_norm, LayerNorm)
    X = torch.randn(2, 4, 8)
    Y = X
    for block in stack.blocks:
        Y = block(Y)
    torch.testing.assert_close(stack(X), stack.final_norm(Y))
    assert isinstance(TransformerStack(PostNormBlock, 1, 8, 2).final_norm, nn.Identity)


def test_bad_input_is_explained():
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        MLP(8, 16, "swish")
    with pytest.raises(ValueError, match=r"LayerNorm\(8\) got tokens of width 6"):
        LayerNorm(8)(torch.randn(2, 6))
    with pytest.raises(ValueError, match="not divisible by H=3"):
        PreNormBlock(8, 3)
    with pytest.raises(ValueError, match="at least one block"):
        TransformerStack(PreNormBlock, 0, 8, 2)


# ----------------------------------------------------------------------------------------------
# Exercises

NAMES = [
    "block.layer_norm",
    "block.prenorm_block",
    "block.flattened_linear",
    "block.param_count",
]


def test_all_exercises_are_registered():
    assert tc.exercises.list_exercises("block.") == sorted(NAMES)


def test_layer_norm_solution_equals_torch_and_package():
    for trial in range(3):
        X, gamma, beta, eps = eb._layer_norm_inputs(torch.Generator().manual_seed(5), trial)
        Y = eb.layer_norm(X, gamma, beta, eps)
        expected = nn.functional.layer_norm(X, (X.shape[-1],), gamma, beta, eps)
        torch.testing.assert_close(Y, expected, atol=1e-12, rtol=0)
        torch.testing.assert_close(Y, tc.block.layer_norm_reference(X, gamma, beta, eps))


def test_layer_norm_inputs_make_eps_visible():
    # Some tokens vary little, so sigma + eps and sqrt(var + eps) differ well beyond the tolerance.
    X, gamma, beta, eps = eb._layer_norm_inputs(torch.Generator().manual_seed(1000), 0)
    assert X.std(dim=-1).min() < 3 * eps**0.5
    dramko = eb._ln(X, gamma, beta, eps, inside=False)
    assert (dramko - eb.layer_norm(X, gamma, beta, eps)).abs().max() > 1e-3


def test_cnn_style_layer_norm_over_tokens_and_features_is_named():
    """Turner's fig. 6: a CNN's 'LayerNorm' also averages over positions, here the tokens."""

    def whole_sequence(X, gamma, beta, eps):
        mu = X.mean(dim=(-2, -1), keepdim=True)
        var = X.var(dim=(-2, -1), unbiased=False, keepdim=True)
        return gamma * (X - mu) / torch.sqrt(var + eps) + beta

    feedback = tc.exercises.check("block.layer_norm", whole_sequence)
    assert feedback.status == "incorrect" and "tokens and features together" in feedback.message


def test_torch_layernorm_module_is_accepted():
    def with_torch(X, gamma, beta, eps):
        ln = nn.LayerNorm(X.shape[-1], eps=eps).double()
        with torch.no_grad():
            ln.weight.copy_(gamma)
            ln.bias.copy_(beta)
        return ln(X)

    assert tc.exercises.check("block.layer_norm", with_torch)


def test_prenorm_solution_equals_package_block_and_torch():
    torch.manual_seed(0)
    D, H = 8, 2
    theirs = nn.TransformerEncoderLayer(
        D, H, 16, dropout=0.0, batch_first=True, norm_first=True
    ).double()
    ours = tc.block.PreNormBlock(D, H, d_ff=16).double().load_from_torch(theirs)
    X = 3 * torch.randn(2, 5, D, dtype=torch.float64)
    Y = eb.prenorm_block(X, ours.attn, ours.mlp, ours.norm1, ours.norm2)
    torch.testing.assert_close(Y, ours(X), atol=1e-12, rtol=0)
    torch.testing.assert_close(Y, theirs(X), atol=1e-10, rtol=0)


def test_block_inputs_print_by_name_not_address():
    args = eb._block_inputs(torch.Generator().manual_seed(0), 0)
    assert repr(args[1]).startswith("attn (SelfAttention")
    assert "0x" not in _sizes(args)  # the checker's message lists the inputs by these names
    assert all(not p.requires_grad for p in args[1].module.parameters())


def test_kron_of_w_is_diagnosed_also_when_its_shape_is_transposed():
    # Trial 1 has D_in != D_out: kron(I, W) then has the transposed shape of the answer, and the
    # checker still names the mistake rather than only the shape.
    ex = tc.exercises._get("block.flattened_linear")
    W, N = ex.make_inputs(torch.Generator().manual_seed(0), 1)
    assert W.shape[0] != W.shape[1]
    got = torch.kron(torch.eye(N, dtype=W.dtype), W)
    verdict = ex._compare(got, ex.solution(W, N), (W, N))
    assert verdict is not None and "the diagonal blocks must be W^T" in verdict
    # and its transpose, kron(I, W)^T = kron(I, W^T), is a correct answer
    assert tc.exercises.check(
        "block.flattened_linear", lambda W, N: torch.kron(torch.eye(N, dtype=W.dtype), W).T
    )


def test_flattened_linear_acts_like_the_token_wise_map():
    W = torch.randn(3, 5, dtype=torch.float64)
    X = torch.randn(4, 3, dtype=torch.float64)
    M = eb.flattened_linear(W, 4)
    assert M.shape == (4 * 5, 4 * 3)
    torch.testing.assert_close(M @ X.reshape(-1), (X @ W).reshape(-1))
    # block-diagonal: exactly N * D_in * D_out of the (N D)^2 entries can be non-zero
    assert int((M != 0).sum()) == 4 * 3 * 5


@pytest.mark.parametrize(("D", "H", "d_ff"), [(16, 4, 64), (12, 3, 20), (8, 1, 8)])
def test_param_count_matches_torch_and_package(D, H, d_ff):
    expected = eb.param_count(D, H, d_ff).item()
    for block in (
        tc.block.PreNormBlock(D, H, d_ff=d_ff),
        tc.block.PostNormBlock(D, H, d_ff=d_ff),
        nn.TransformerEncoderLayer(D, H, d_ff),
    ):
        assert sum(p.numel() for p in block.parameters()) == expected


def test_param_count_accepts_a_python_int():
    assert tc.exercises.check(
        "block.param_count", lambda D, H, d_ff: 4 * D * D + 2 * D * d_ff + 9 * D + d_ff
    )
