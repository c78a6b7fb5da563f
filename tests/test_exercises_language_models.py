"""Exercises of the *Autoregressive language models* lab: the five are registered, every listed mistake
differs from the solution on every trial, acceptable variants pass, and the solutions agree with the
package (``tests/test_exercises.py`` checks every solution and mistake against its checker)."""

from __future__ import annotations

import math

import torch

import transformer_course as tc
from transformer_course.attention import attention_weights, causal_mask
from transformer_course.exercises import language_models as el
from transformer_course.generate import next_token
from transformer_course.models import GPT, TINY

NAMES = [
    "lm.mit_causal_weights",
    "lm.turner_causal_weights",
    "lm.temperature_probs",
    "lm.top_k_probs",
    "lm.teacher_forcing_loss",
]


def test_all_exercises_are_registered():
    assert tc.exercises.list_exercises("lm.") == sorted(NAMES)


def test_causal_solutions_match_the_package_and_are_transposes():
    g = torch.Generator().manual_seed(0)
    N, d_k = 6, 3
    Q = torch.randn(N, d_k, generator=g, dtype=torch.float64)
    K = torch.randn(N, d_k, generator=g, dtype=torch.float64)
    S = Q @ K.T / math.sqrt(d_k)
    A = el.mit_causal_weights(S[None])[0]
    torch.testing.assert_close(A, attention_weights(Q, K, causal_mask(N)), atol=1e-12, rtol=0)
    A_cols = el.turner_causal_weights(S.T.contiguous())
    torch.testing.assert_close(A_cols, A.T, atol=1e-12, rtol=0)
    assert torch.equal(A_cols == 0, ~torch.ones(N, N, dtype=torch.bool).triu())


def test_large_negative_mask_is_accepted():
    """A finite mask value such as -1e9 is not a mistake: exp(-1e9) underflows to exactly 0."""

    def finite_mask(S):
        N = S.shape[-1]
        M = torch.zeros(N, N, dtype=S.dtype).masked_fill(~causal_mask(N), -1e9)
        return torch.softmax(S + M, dim=-1)

    assert tc.exercises.check("lm.mit_causal_weights", finite_mask)


def test_filtering_probabilities_and_renormalising_is_accepted():
    def filter_probs(z, k):
        p = torch.softmax(z, dim=-1)
        kth = torch.topk(p, k, dim=-1).values[..., -1:]
        p = p * (p >= kth)
        return p / p.sum(dim=-1, keepdim=True)

    assert tc.exercises.check("lm.top_k_probs", filter_probs)


def test_powered_probabilities_are_the_temperature_softmax():
    def powered(z, tau):
        p = torch.softmax(z, dim=-1) ** (1 / tau)
        return p / p.sum(dim=-1, keepdim=True)

    assert tc.exercises.check("lm.temperature_probs", powered)


def test_sampling_solutions_match_next_token_frequencies():
    """The distributions the exercises ask for are the ones tc.generate.next_token samples from."""
    z = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]], dtype=torch.float64)
    reps = 40_000
    for kwargs, p in (
        ({"temperature": 0.7}, el.temperature_probs(z, 0.7)),
        ({"temperature": 1.0, "top_k": 2}, el.top_k_probs(z, 2)),
    ):
        g = torch.Generator().manual_seed(0)
        draws = next_token(z.expand(reps, -1), generator=g, **kwargs)[:, 0]
        freq = torch.bincount(draws, minlength=z.shape[-1]).double() / reps
        torch.testing.assert_close(freq, p[0], atol=0.01, rtol=0)
    assert el.top_k_probs(z, 2)[0, 2:].eq(0).all()


def test_teacher_forcing_solution_equals_the_model_loss():
    torch.manual_seed(0)
    model = GPT(TINY).eval()
    tokens = torch.randint(0, TINY.vocab_size, (2, 11), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits, loss = model(tokens[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(el.teacher_forcing_loss(logits, tokens), loss)
