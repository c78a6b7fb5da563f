"""Attention: hand-computed cases, reference vs efficient vs torch, masks, bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course.exercises import self_attention as sa
from transformer_course.self_attention import (
    attention_weights,
    scaled_dot_product_attention,
    scaled_dot_product_attention_reference,
    single_head,
    single_head_reference,
)

# ----------------------------------------------------------------------------------------------
# The module

TOL = {torch.float64: dict(atol=1e-10, rtol=0), torch.float32: dict(atol=1e-5, rtol=0)}


def loop_attention(Q, K, V, mask=None):
    """Direct evaluation of Y_n = sum_m A_nm v_m with A_nm = exp(s_nm) / sum_m' exp(s_nm'), by loops."""
    N, M, d_k = Q.shape[0], K.shape[0], Q.shape[1]
    Y = torch.zeros(N, V.shape[1], dtype=Q.dtype)
    for n in range(N):
        allowed = [m for m in range(M) if mask is None or mask[n, m]]
        if not allowed:
            continue
        s = {m: float(Q[n] @ K[m]) / math.sqrt(d_k) for m in allowed}
        z = sum(math.exp(v) for v in s.values())
        for m in allowed:
            Y[n] += math.exp(s[m]) / z * V[m]
    return Y


def test_hand_computed_two_tokens():
    # Two orthogonal keys; query aligned with the first: scores (2/sqrt2, 0) -> weights by hand.
    Q = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    K = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    V = torch.tensor([[10.0, 0.0], [0.0, 10.0]], dtype=torch.float64)
    a = math.exp(math.sqrt(2)) / (math.exp(math.sqrt(2)) + 1.0)
    A = attention_weights(Q, K)
    torch.testing.assert_close(A, torch.tensor([[a, 1 - a]], dtype=torch.float64))
    Y = scaled_dot_product_attention_reference(Q, K, V)
    torch.testing.assert_close(Y, torch.tensor([[10 * a, 10 * (1 - a)]], dtype=torch.float64))


def test_equal_scores_give_uniform_average():
    X = torch.arange(12.0, dtype=torch.float64).reshape(4, 3)
    Q = torch.zeros(4, 2, dtype=torch.float64)  # all scores 0 -> A = 1/M everywhere
    K = torch.randn(4, 2, dtype=torch.float64)
    Y = scaled_dot_product_attention(Q, K, X)
    torch.testing.assert_close(Y, X.mean(0, keepdim=True).expand(4, 3))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(5, 5, 3, 4), (1, 7, 8, 2), (6, 2, 4, 4)])
@pytest.mark.parametrize("masked", [False, True])
def test_reference_matches_loops(dtype, shape, masked, gen):
    N, M, d_k, d_v = shape
    Q, K = (torch.randn(n, d_k, generator=gen, dtype=dtype) for n in (N, M))
    V = torch.randn(M, d_v, generator=gen, dtype=dtype)
    mask = torch.rand(N, M, generator=gen) < 0.6 if masked else None
    Y = scaled_dot_product_attention_reference(Q, K, V, mask)
    torch.testing.assert_close(
        Y, loop_attention(Q.double(), K.double(), V.double(), mask).to(dtype), **TOL[dtype]
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batch", [(), (1,), (3,), (2, 4)])
@pytest.mark.parametrize("mask_kind", [None, "causal", "random", "random-batched"])
@pytest.mark.parametrize("NM", [(1, 1), (6, 6), (5, 9)])
def test_reference_efficient_and_torch_agree(dtype, batch, mask_kind, NM, gen):
    N, M = NM
    d_k, d_v = 8, 5
    Q = torch.randn(*batch, N, d_k, generator=gen, dtype=dtype)
    K = torch.randn(*batch, M, d_k, generator=gen, dtype=dtype)
    V = torch.randn(*batch, M, d_v, generator=gen, dtype=dtype)
    mask = None
    if mask_kind == "causal":
        mask = torch.ones(N, M, dtype=torch.bool).tril()
    elif mask_kind == "random":
        mask = torch.rand(N, M, generator=gen) < 0.7
        mask[:, 0] = True  # keep every row attendable so torch's own result is defined
    elif mask_kind == "random-batched":
        mask = torch.rand(*batch, N, M, generator=gen) < 0.7
        mask[..., 0] = True
    ref = scaled_dot_product_attention_reference(Q, K, V, mask)
    eff = scaled_dot_product_attention(Q, K, V, mask)
    torch.testing.assert_close(eff, ref, **TOL[dtype])
    if mask is not None and mask.dim() == 2 and batch:
        mask = mask.expand(*batch, N, M)
    torch.testing.assert_close(
        ref, F.scaled_dot_product_attention(Q, K, V, attn_mask=mask), **TOL[dtype]
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_self_attention_reference_vs_efficient(dtype, gen):
    X = torch.randn(3, 7, 16, generator=gen, dtype=dtype)
    W_q, W_k = (torch.randn(16, 4, generator=gen, dtype=dtype) for _ in range(2))
    W_v = torch.randn(16, 6, generator=gen, dtype=dtype)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    for mask in (None, causal):
        ref = single_head_reference(X, W_q, W_k, W_v, mask)
        assert ref.shape == (3, 7, 6)
        torch.testing.assert_close(single_head(X, W_q, W_k, W_v, mask), ref, **TOL[dtype])
        expected = torch.stack(
            [
                loop_attention(x @ W_q.double(), x @ W_k.double(), x @ W_v.double(), mask)
                for x in X.double()
            ]
        ).to(dtype)
        torch.testing.assert_close(ref, expected, **TOL[dtype])


def test_weights_are_row_stochastic_and_masked_entries_are_zero(gen):
    Q, K = torch.randn(6, 4, generator=gen), torch.randn(9, 4, generator=gen)
    mask = torch.rand(6, 9, generator=gen) < 0.5
    mask[:, 3] = True
    A = attention_weights(Q, K, mask)
    assert (A >= 0).all()
    torch.testing.assert_close(A.sum(-1), torch.ones(6))
    assert (A[~mask] == 0).all()


def test_orthogonal_inputs_give_identity_in_the_limit():
    # Bishop ex. 3: with X X^T = c I and no scale, A = softmax(c I) -> I as c grows.
    X = 30.0 * torch.eye(5, dtype=torch.float64)
    A = attention_weights(X, X, scale=1.0)
    torch.testing.assert_close(A, torch.eye(5, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(
        scaled_dot_product_attention(X, X, X, scale=1.0), X, atol=1e-9, rtol=0
    )


@pytest.mark.parametrize(
    "fn", [scaled_dot_product_attention_reference, scaled_dot_product_attention]
)
def test_fully_masked_rows_give_zeros_not_nan(fn, gen):
    Q = torch.randn(2, 4, 3, generator=gen, requires_grad=True)
    K = torch.randn(2, 5, 3, generator=gen)
    V = torch.randn(2, 5, 2, generator=gen)
    mask = torch.ones(2, 4, 5, dtype=torch.bool)
    mask[0, 1] = False  # query 1 of batch 0 may attend to nothing
    Y = fn(Q, K, V, mask)
    assert torch.isfinite(Y).all()
    assert (Y[0, 1] == 0).all()
    Y.sum().backward()
    assert torch.isfinite(Q.grad).all()
    assert attention_weights(Q, K, mask)[0, 1].abs().sum() == 0


def test_gradients_agree(gen):
    args = [
        torch.randn(2, 5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    ]
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    g_ref = torch.autograd.grad(
        scaled_dot_product_attention_reference(*args, mask).square().sum(), args
    )
    g_eff = torch.autograd.grad(scaled_dot_product_attention(*args, mask).square().sum(), args)
    for a, b in zip(g_ref, g_eff, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        (((4, 8), (4, 6), (4, 3)), r"queries have d_k=8 .* keys have d_k=6"),
        (((4, 8), (5, 8), (4, 3)), r"K has M=5 tokens .* V has 4"),
        (((2, 4, 8), (3, 4, 8), (3, 4, 2)), r"batch dimensions differ"),
        (((8,), (4, 8), (4, 2)), r"at least 2 dims"),
    ],
)
@pytest.mark.parametrize(
    "fn", [scaled_dot_product_attention_reference, scaled_dot_product_attention]
)
def test_bad_shapes_are_named(shapes, match, fn):
    Q, K, V = (torch.randn(*s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        fn(Q, K, V)


@pytest.mark.parametrize("fn", [single_head, single_head_reference])
@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_gives_each_sequence_its_own_answer(fn, causal, gen):
    # book eq. eq-sa-padding: with mask[b, n, m] = m < N_b the real rows of a padded batch equal the
    # sequences run one by one, whatever the placeholders hold.
    D, lengths = 4, [3, 5, 1]
    N = max(lengths)
    W_q, W_k, W_v = (torch.randn(D, D, generator=gen, dtype=torch.float64) for _ in range(3))
    seqs = [torch.randn(n_b, D, generator=gen, dtype=torch.float64) for n_b in lengths]
    real = torch.arange(N)[None, :] < torch.tensor(lengths)[:, None]  # (B, N)
    mask = real[:, None, :].expand(len(lengths), N, N)
    if causal:
        mask = mask & tc.self_attention.causal_mask(N)
    outputs = []
    for scale in (1.0, 1000.0):  # two fillings of the padded positions
        X = torch.stack(
            [
                torch.cat(
                    [x, scale * torch.randn(N - len(x), D, generator=gen, dtype=torch.float64)]
                )
                for x in seqs
            ]
        )
        outputs.append(fn(X, W_q, W_k, W_v, mask))
    for b, x in enumerate(seqs):
        alone_mask = tc.self_attention.causal_mask(len(x)) if causal else None
        alone = loop_attention(x @ W_q, x @ W_k, x @ W_v, alone_mask)
        torch.testing.assert_close(outputs[0][b, : len(x)], alone, **TOL[torch.float64])
    torch.testing.assert_close(outputs[0][real], outputs[1][real], **TOL[torch.float64])


def test_bad_masks_are_explained():
    Q, K, V = torch.randn(4, 8), torch.randn(5, 8), torch.randn(5, 2)
    with pytest.raises(
        ValueError, match=r"mask has shape \(5, 4\) but must be \(N, M\) = \(4, 5\)"
    ):
        scaled_dot_product_attention(Q, K, V, torch.ones(5, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        scaled_dot_product_attention(Q, K, V, torch.ones(4, 5))
    with pytest.raises(TypeError, match="share one dtype"):
        scaled_dot_product_attention(Q, K.double(), V)
    with pytest.raises(TypeError, match="floating point"):
        attention_weights(torch.ones(4, 8, dtype=torch.long), K)


def test_transposed_weight_is_diagnosed():
    X = torch.randn(5, 16)
    with pytest.raises(ValueError, match=r"W_q has shape \(4, 16\) .* looks transposed"):
        single_head(X, torch.randn(4, 16), torch.randn(16, 4), torch.randn(16, 4))
    with pytest.raises(ValueError, match="same width d_k"):
        single_head_reference(X, torch.randn(16, 4), torch.randn(16, 3), torch.randn(16, 4))


def test_top_level_exports():
    assert tc.self_attention.single_head is single_head
    assert tc.attention_weights is attention_weights
    assert tc.scaled_dot_product_attention_reference is scaled_dot_product_attention_reference


def test_key_padding_mask_hides_exactly_the_placeholder_keys():
    # book eq. eq-sa-padding: mask[i, n, m] = [m < N_i], the same for every query n
    lengths, N = [3, 5, 1], 5
    mask = tc.self_attention.key_padding_mask(lengths, N)
    assert mask.shape == (3, N, N) and mask.dtype == torch.bool
    for i, n_i in enumerate(lengths):
        for n in range(N):
            for m in range(N):
                assert bool(mask[i, n, m]) == (m < n_i)
    # what it is for: one batched call gives each sequence its own answer
    gen = torch.Generator().manual_seed(0)
    D = 4
    W_q, W_k, W_v = (torch.randn(D, D, generator=gen, dtype=torch.float64) for _ in range(3))
    X = torch.randn(len(lengths), N, D, generator=gen, dtype=torch.float64)
    Y = single_head(X, W_q, W_k, W_v, mask & tc.self_attention.causal_mask(N))
    for i, n_i in enumerate(lengths):
        x = X[i, :n_i]
        alone = loop_attention(x @ W_q, x @ W_k, x @ W_v, tc.self_attention.causal_mask(n_i))
        torch.testing.assert_close(Y[i, :n_i], alone, **TOL[torch.float64])


@pytest.mark.parametrize(
    "lengths, N, match",
    [([0, 2], 3, "between 1 and N=3"), ([2, 4], 3, "between 1 and N=3"), ([1.5], 3, "ints")],
)
def test_key_padding_mask_refuses_impossible_lengths(lengths, N, match):
    with pytest.raises(ValueError, match=match):
        tc.self_attention.key_padding_mask(lengths, N)


def test_causal_mask():
    m = tc.self_attention.causal_mask(3)
    assert m.tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    m = tc.self_attention.causal_mask(2, 4)  # the last 2 of 4 positions
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]
    with pytest.raises(ValueError, match="0 <= N <= M"):
        tc.self_attention.causal_mask(4, 2)


# ----------------------------------------------------------------------------------------------
# Exercises

NAMES = [
    "self_attention.scores",
    "self_attention.softmax_rows",
    "self_attention.masked_self_attention",
    "self_attention.qk_variance",
    "self_attention.absorb_bias",
    "self_attention.single_head",
]


def test_all_exercises_are_registered():
    assert tc.exercises.list_exercises("self_attention.") == sorted(NAMES)


def test_not_attempted_and_crashing_answers():
    def stub(Q, K):
        raise NotImplementedError

    assert tc.exercises.check("self_attention.scores", stub).status == "not attempted"

    def crashes(Q, K):
        return Q @ K  # (N, d_k) @ (M, d_k): not conformable

    feedback = tc.exercises.check("self_attention.scores", crashes)
    assert feedback.status == "error" and "RuntimeError" in feedback.message


def test_scores_k_q_transpose_on_rectangular_input_is_named():
    # Trial 1 has N != M, where K Q^T has the transposed shape: the listed mistake still names it.
    ex = tc.exercises._get("self_attention.scores")
    args = ex.make_inputs(torch.Generator().manual_seed(0), 1)
    Q, K = args
    assert Q.shape[0] != K.shape[0]
    verdict = ex._compare(K @ Q.T / math.sqrt(Q.shape[1]), ex.solution(*args), args)
    assert verdict is not None and "queries and keys are swapped" in verdict


def test_naive_softmax_overflows_and_is_told_so():
    def naive(S):
        E = torch.exp(S)  # overflows to inf for S = 800
        return E / E.sum(dim=-1, keepdim=True)

    feedback = tc.exercises.check("self_attention.softmax_rows", naive)
    assert feedback.status == "incorrect"
    assert "NaN or inf" in feedback.message and "overflow" in feedback.message


def test_softmax_solution_is_torch_softmax_and_stable():
    S = torch.tensor([[800.0, 801.0, 799.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    A = sa.softmax_rows(S)
    torch.testing.assert_close(A, torch.softmax(S, dim=-1), atol=1e-15, rtol=0)
    torch.testing.assert_close(A[1], torch.full((3,), 1 / 3, dtype=torch.float64))


def test_masked_solution_equals_package_and_masks_exactly():
    for trial in range(3):
        X, W_q, W_k, W_v, mask = sa._masked_inputs(torch.Generator().manual_seed(7), trial)
        assert mask.any(dim=-1).all() and (~mask).any(dim=-1).all()  # both masks have no empty row
        Y = sa.masked_self_attention(X, W_q, W_k, W_v, mask)
        torch.testing.assert_close(
            Y, tc.self_attention.single_head_reference(X, W_q, W_k, W_v, mask)
        )
        torch.testing.assert_close(Y, tc.self_attention.single_head(X, W_q, W_k, W_v, mask))
        A = tc.attention_weights(X @ W_q, X @ W_k, mask)
        assert torch.all(A[~mask] == 0)


def test_qk_variance_solution_is_close_to_d_k():
    for d_k in (1, 8, 32):
        estimate = float(sa.qk_variance(d_k, 50_000, seed=3))
        assert abs(estimate - d_k) < 0.05 * d_k  # std error ~ d_k * sqrt(2 / 50000) < 0.007 d_k


def test_qk_variance_accepts_an_independent_sample():
    def other_order(d_k, num_samples, seed):
        g = torch.Generator().manual_seed(seed + 1)
        qk = torch.randn(num_samples, 2, d_k, generator=g, dtype=torch.float64)  # (S, 2, d_k)
        return (qk[:, 0] * qk[:, 1]).sum(-1).var().item()  # a Python float is accepted too

    assert tc.exercises.check("self_attention.qk_variance", other_order)


def test_absorbed_bias_reproduces_linear_layer():
    W, b = sa._bias_inputs(torch.Generator().manual_seed(1), 1)
    X = torch.randn(6, W.shape[0], dtype=torch.float64)
    X_aug = torch.cat([X, torch.ones(6, 1, dtype=torch.float64)], dim=1)  # (N, D + 1)
    torch.testing.assert_close(X_aug @ sa.absorb_bias(W, b), X @ W + b)
    linear = torch.nn.Linear(W.shape[0], W.shape[1]).double()
    with torch.no_grad():
        linear.weight.copy_(W.T)  # nn.Linear stores (out, in)
        linear.bias.copy_(b)
    torch.testing.assert_close(X_aug @ sa.absorb_bias(W, b), linear(X))


def test_transposed_bias_answer_is_called_a_transpose():
    feedback = tc.exercises.check("self_attention.absorb_bias", lambda W, b: sa.absorb_bias(W, b).T)
    assert feedback.status == "incorrect" and "off by a transpose" in feedback.message


def _package_single_head(X, W_q, W_k, W_v, causal=False):
    """The chapter's layer behind the exercise's signature (a flag instead of a mask)."""
    mask = tc.self_attention.causal_mask(X.shape[0]) if causal else None
    return single_head(X, W_q, W_k, W_v, mask)


def test_single_head_solution_is_the_packages_layer():
    ex = tc.exercises._get("self_attention.single_head")
    assert {ex.make_inputs(torch.Generator().manual_seed(0), t)[-1] for t in range(ex.trials)} == {
        False,
        True,
    }
    for trial in range(ex.trials):
        X, W_q, W_k, W_v, causal = ex.make_inputs(torch.Generator().manual_seed(5), trial)
        mask = tc.self_attention.causal_mask(X.shape[0]) if causal else None
        Y = sa.single_head(X, W_q, W_k, W_v, causal)
        torch.testing.assert_close(Y, single_head_reference(X, W_q, W_k, W_v, mask), **TOL[X.dtype])
        torch.testing.assert_close(Y, loop_attention(X @ W_q, X @ W_k, X @ W_v, mask))
    # the package's layers, called through the exercise's signature, pass the checker as they are
    assert tc.exercises.check("self_attention.single_head", _package_single_head)


def test_single_head_mistakes_are_told_apart_wherever_they_show():
    """Each mistake changes the output on some trial; on every trial where it does, it differs from
    every other mistake too, so the checker names it whichever trial catches it. Only the mask's
    mistakes ever match the reference: on the trials without the causal flag, and masking anyway on
    the trials with it."""
    ex = tc.exercises._get("self_attention.single_head")
    mask_mistakes = {m.why for m in ex.mistakes if "mask" in m.why}
    assert len(ex.mistakes) >= 5 and len(mask_mistakes) == 5
    shows = {m.why: 0 for m in ex.mistakes}
    for trial in range(ex.trials):
        args = ex.make_inputs(torch.Generator().manual_seed(1000 + trial), trial)
        expected = ex.solution(*args)
        outs = {m.why: torch.as_tensor(m.wrong(*args)) for m in ex.mistakes}

        def same(a, b):
            return a.shape == b.shape and torch.allclose(a, b, atol=ex.atol, rtol=ex.rtol)

        for why, out in outs.items():
            if same(out, expected):  # the mask's mistakes show only where the flag asks for it
                masked_anyway = why.startswith("with causal=False")
                assert why in mask_mistakes and args[-1] == masked_anyway, (trial, why)
                continue
            shows[why] += 1
            others = [w for w, o in outs.items() if w != why and same(o, out)]
            assert not others, (trial, why, others)
    assert all(shows.values()), shows


def test_single_head_typical_answers_get_their_own_diagnosis():
    def with_tc_causal_mask(X, W_q, W_k, W_v, causal=False):
        S = (X @ W_q) @ (X @ W_k).T / math.sqrt(W_q.shape[1])
        if causal:
            S = S.masked_fill(~tc.self_attention.causal_mask(X.shape[0]), float("-inf"))
        return torch.softmax(S, dim=-1) @ (X @ W_v)

    def softmax_over_queries(X, W_q, W_k, W_v, causal=False):
        return F.softmax((X @ W_q) @ (X @ W_k).T / math.sqrt(W_q.shape[1]), dim=0) @ (X @ W_v)

    assert tc.exercises.check("self_attention.single_head", with_tc_causal_mask)
    feedback = tc.exercises.check("self_attention.single_head", softmax_over_queries)
    assert feedback.status == "incorrect" and "over the queries (dim=0)" in feedback.message
    assert "False]" in feedback.message  # caught on the first trial, the one without the flag
