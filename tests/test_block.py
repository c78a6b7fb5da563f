"""Blocks equal torch.nn.TransformerEncoderLayer; LayerNorm equals nn.LayerNorm; equivariance."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from transformer_course.attention import causal_mask
from transformer_course.block import (
    MLP,
    LayerNorm,
    PostNormBlock,
    PreNormBlock,
    TransformerStack,
    layer_norm_reference,
)


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
