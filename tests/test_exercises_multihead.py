"""Exercises of the *Multi-head self-attention* lab: each solution passes its checker, each listed
mistake is diagnosed with its own explanation, and the solutions agree with the package."""

from __future__ import annotations

import pytest
import torch

import transformer_course as tc
from transformer_course.exercises import multihead as mh

NAMES = [
    "multihead.attention",
    "multihead.merge_heads",
    "multihead.param_count",
    "multihead.split_heads",
    "multihead.turner_V",
]


def test_all_exercises_are_registered():
    assert tc.exercises.list_exercises("multihead.") == NAMES


def test_split_and_merge_equal_the_package_and_invert_each_other():
    T = torch.randn(2, 5, 12, dtype=torch.float64)
    for H in (1, 2, 3, 4, 6, 12):
        split = mh.split_heads(T, H)
        assert split.shape == (2, H, 5, 12 // H)
        assert torch.equal(split, tc.multihead.split_heads(T, H))
        assert torch.equal(mh.merge_heads(split), T)
        assert torch.equal(mh.merge_heads(split), tc.multihead.merge_heads(split))
        d = 12 // H
        for h in range(H):  # head h owns the contiguous block h*d:(h+1)*d
            assert torch.equal(split[:, h], T[..., h * d : (h + 1) * d])


def test_forgotten_transpose_in_split_keeping_n_h_order_is_a_shape_error():
    def no_transpose(T, H):
        B, N, HD = T.shape
        return T.reshape(B, N, H, HD // H)  # (B, N, H, d): the transpose to (B, H, N, d) is missing

    feedback = tc.exercises.check("multihead.split_heads", no_transpose)
    assert feedback.status == "incorrect" and "wrong shape" in feedback.message


def test_attention_solution_equals_package_reference_and_module():
    for trial in range(3):
        X, W_q, W_k, W_v, W_o, H = mh._mha_inputs(torch.Generator().manual_seed(5), trial)
        Y = mh.multi_head_attention(X, W_q, W_k, W_v, W_o, H)
        ref = tc.multihead.multi_head_attention_reference(X, W_q, W_k, W_v, W_o, H)
        torch.testing.assert_close(Y, ref, atol=1e-12, rtol=0)
        module = tc.multihead.MultiHeadAttention(X.shape[1], H, bias=False).double()
        with torch.no_grad():
            module.in_proj.weight.copy_(torch.cat([W_q.T, W_k.T, W_v.T]))  # nn.Linear: (out, in)
            module.out_proj.weight.copy_(W_o.T)
        torch.testing.assert_close(module(X[None])[0], Y, atol=1e-12, rtol=0)


def test_attention_inputs_do_not_saturate_the_softmax():
    # With order-one scores the scale mistake is visible; saturated softmaxes would hide it.
    X, W_q, W_k, W_v, W_o, H = mh._mha_inputs(torch.Generator().manual_seed(1000), 0)
    Y = mh.multi_head_attention(X, W_q, W_k, W_v, W_o, H)
    assert (Y - mh._mha_scale_sqrt_D(X, W_q, W_k, W_v, W_o, H)).abs().max() > 1e-3


def test_turner_V_equals_package_is_low_rank_and_gives_the_same_layer():
    W_v, W_o, H = mh._V_inputs(torch.Generator().manual_seed(2), 2)
    D, K = W_v.shape[0], W_v.shape[0] // H
    V = mh.turner_V(W_v, W_o, H)
    torch.testing.assert_close(V, tc.conventions.low_rank_V(W_v, W_o, H), atol=1e-12, rtol=0)
    assert all(int(torch.linalg.matrix_rank(V[h])) == K for h in range(H))
    torch.testing.assert_close(V.sum(0), (W_v @ W_o).T, atol=1e-12, rtol=0)
    # Turner's sum over heads with these V_h is the concat form, transposed (Bishop exercise 5)
    W_q, W_k = torch.randn(D, D, dtype=torch.float64), torch.randn(D, D, dtype=torch.float64)
    X = torch.randn(5, D, dtype=torch.float64)
    U_q = W_q.T.reshape(H, K, D)  # head h's K x D query map: rows h*K:(h+1)*K of W_q^T
    U_k = W_k.T.reshape(H, K, D)
    Y_cols = tc.conventions.turner_multi_head_self_attention(X.T, U_q, U_k, V)
    Y = tc.multihead.multi_head_attention_reference(X, W_q, W_k, W_v, W_o, H)
    torch.testing.assert_close(Y_cols.T, Y, atol=1e-10, rtol=0)


@pytest.mark.parametrize(("D", "H"), [(8, 1), (8, 2), (12, 3), (64, 8)])
@pytest.mark.parametrize("bias", [True, False])
def test_param_count_matches_the_modules(D, H, bias):
    P_concat, P_turner = (int(p) for p in mh.param_count(D, H, bias))
    ours = tc.multihead.MultiHeadAttention(D, H, bias=bias)
    theirs = torch.nn.MultiheadAttention(D, H, bias=bias)
    assert P_concat == sum(p.numel() for p in ours.parameters())
    assert P_concat == sum(p.numel() for p in theirs.parameters())
    K = D // H
    turner = [torch.empty(H, K, D), torch.empty(H, K, D), torch.empty(H, D, D)]  # U_q, U_k, V
    assert P_turner == sum(t.numel() for t in turner)


def test_param_count_accepts_a_tuple_of_ints():
    def as_ints(D, H, bias):
        return 4 * D * D + 4 * D * bias, H * (2 * (D // H) * D + D * D)

    assert tc.exercises.check("multihead.param_count", as_ints)
