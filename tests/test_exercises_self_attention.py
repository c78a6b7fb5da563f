"""Exercises of the *Self-attention* lab: each solution passes its checker, each listed mistake is
diagnosed with its own explanation, and the solutions agree with the package's attention functions."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_course as tc
from transformer_course.exercises import self_attention as sa

NAMES = [
    "self_attention.scores",
    "self_attention.softmax_rows",
    "self_attention.masked_self_attention",
    "self_attention.qk_variance",
    "self_attention.absorb_bias",
]


def test_all_exercises_are_registered():
    assert tc.exercises.list_exercises("self_attention.") == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes_its_checker(name):
    ex = tc.exercises._get(name)
    feedback = tc.exercises.check(name, ex.solution)
    assert feedback, feedback.message
    assert feedback.status == "correct"


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
        torch.testing.assert_close(Y, tc.self_attention_reference(X, W_q, W_k, W_v, mask))
        torch.testing.assert_close(Y, tc.self_attention(X, W_q, W_k, W_v, mask))
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
