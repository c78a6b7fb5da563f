"""Multi-head attention: reference (loop over heads) == module == torch.nn.MultiheadAttention."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from transformer_course.attention import causal_mask
from transformer_course.multihead import (
    MultiHeadAttention,
    merge_heads,
    multi_head_attention_reference,
    split_heads,
)

TOL = {torch.float64: dict(atol=1e-10, rtol=0), torch.float32: dict(atol=1e-5, rtol=1e-5)}


def _pair(D, H, dtype, bias=True, seed=0):
    torch.manual_seed(seed)
    ours = MultiHeadAttention(D, H, bias=bias).to(dtype)
    theirs = nn.MultiheadAttention(D, H, bias=bias, batch_first=True).to(dtype)
    ours.load_from_torch(theirs)
    return ours, theirs


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    ("B", "N", "D", "H"), [(1, 1, 4, 1), (2, 5, 8, 2), (3, 7, 12, 4), (2, 6, 16, 16)]
)
@pytest.mark.parametrize("masked", [False, True])
def test_module_equals_torch_outputs_and_gradients(dtype, B, N, D, H, masked):
    ours, theirs = _pair(D, H, dtype)
    X = torch.randn(B, N, D, dtype=dtype, requires_grad=True)
    X2 = X.detach().clone().requires_grad_(True)
    mask = causal_mask(N) if masked else None
    Y = ours(X, mask=mask)
    Y_t, _ = theirs(X2, X2, X2, attn_mask=None if mask is None else ~mask, need_weights=False)
    torch.testing.assert_close(Y, Y_t, **TOL[dtype])
    g = torch.randn_like(Y)
    Y.backward(g)
    Y_t.backward(g)
    torch.testing.assert_close(X.grad, X2.grad, **TOL[dtype])
    torch.testing.assert_close(ours.in_proj.weight.grad, theirs.in_proj_weight.grad, **TOL[dtype])
    torch.testing.assert_close(ours.out_proj.weight.grad, theirs.out_proj.weight.grad, **TOL[dtype])
    torch.testing.assert_close(ours.in_proj.bias.grad, theirs.in_proj_bias.grad, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_reference_equals_module(dtype):
    torch.manual_seed(1)
    mha = MultiHeadAttention(12, 3, bias=False).to(dtype)
    X = torch.randn(2, 5, 12, dtype=dtype)
    mask = torch.rand(2, 5, 5) < 0.7
    mask[..., 0] = True
    ref = multi_head_attention_reference(X, **mha.weights, H=3, mask=mask)
    torch.testing.assert_close(mha(X, mask=mask), ref, **TOL[dtype])


def test_cross_attention_equals_torch():
    ours, theirs = _pair(8, 2, torch.float64)
    X, Z = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 7, 8, dtype=torch.float64)
    Y = ours(X, Z)
    assert Y.shape == (2, 3, 8)
    torch.testing.assert_close(Y, theirs(X, Z, Z, need_weights=False)[0], atol=1e-10, rtol=0)
    ours.in_proj.bias = None  # the reference has no biases: compare without them
    ours.out_proj.bias = None
    ref = multi_head_attention_reference(X, **ours.weights, H=2, Z=Z)
    torch.testing.assert_close(ours(X, Z), ref, atol=1e-10, rtol=0)


def test_batched_mask_equals_torch_per_head_mask():
    ours, theirs = _pair(8, 2, torch.float64)
    X = torch.randn(3, 4, 8, dtype=torch.float64)
    mask = torch.rand(3, 4, 4) < 0.6
    mask[..., 1] = True
    torch_mask = (~mask).repeat_interleave(2, dim=0)  # torch wants (B*H, N, M), True = blocked
    expected = theirs(X, X, X, attn_mask=torch_mask, need_weights=False)[0]
    torch.testing.assert_close(ours(X, mask=mask), expected, atol=1e-10, rtol=0)


def test_round_trip_to_torch():
    torch.manual_seed(2)
    ours = MultiHeadAttention(8, 4)
    back = MultiHeadAttention(8, 4).load_from_torch(ours.to_torch())
    X = torch.randn(2, 3, 8)
    torch.testing.assert_close(back(X), ours(X))


def test_split_and_merge_heads_are_inverse():
    T = torch.randn(2, 5, 12)
    S = split_heads(T, 3)
    assert S.shape == (2, 3, 5, 4)
    assert torch.equal(S[:, 1], T[..., 4:8])  # head 1 owns features 4..7
    assert torch.equal(merge_heads(S), T)


def test_bad_input_is_explained():
    with pytest.raises(
        ValueError, match=r"D=10 is not divisible by H=4 .* choose H from \[1, 2, 5, 10\]"
    ):
        MultiHeadAttention(10, 4)
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"expects \(B, N, 8\); add a batch dimension"):
        mha(torch.randn(5, 8))
    with pytest.raises(
        ValueError, match=r"mask has shape \(4, 5\) but must be \(N, M\) = \(5, 5\)"
    ):
        mha(torch.randn(1, 5, 8), mask=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"Z has shape \(2, 3, 6\)"):
        mha(torch.randn(2, 4, 8), torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match="W_o has shape"):
        w = torch.randn(8, 8)
        multi_head_attention_reference(torch.randn(3, 8), w, w, w, torch.randn(8, 4), H=2)


def test_fully_masked_query_gives_zero_attention_output():
    torch.manual_seed(3)
    mha = MultiHeadAttention(8, 2, bias=False)
    mask = torch.ones(1, 3, 3, dtype=torch.bool)
    mask[0, 2] = False
    Y = mha(torch.randn(1, 3, 8), mask=mask)
    assert torch.isfinite(Y).all()
    assert (Y[0, 2] == 0).all()  # no bias: a zero attention output stays zero after W_o
