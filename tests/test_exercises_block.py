"""Exercises of the *Transformer block* lab: each solution passes its checker, each listed mistake is
diagnosed with its own explanation, and the solutions agree with the package and with PyTorch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import transformer_course as tc
from transformer_course.exercises import _sizes
from transformer_course.exercises import block as eb

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
    assert repr(args[1]).startswith("attn (MultiHeadAttention")
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
