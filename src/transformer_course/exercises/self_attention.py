"""Exercises of the *Self-attention* lab: scores, a row softmax, masked self-attention, the variance
of ``q . k``, absorbing a bias into a weight matrix, and the whole single-head layer (optionally causal)
in about ten lines.

Chapter: *Self-attention* (the lecture notes on Bishop & Bishop, ``bishop2024notes``, sec. 2.8-2.10 and
Algorithm 1; MIT 6.390 sec. 9.3-9.4.1).
Every input is float64 so the checkers can use tight tolerances; the Monte Carlo exercise compares with
a relative tolerance instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from . import Mistake, exercise, randn

_SIZES = ((4, 4, 3), (3, 6, 5), (7, 5, 8))  # (N, M, d_k) per trial: square first, then not


# ---------------------------------------------------------------------------------------------------
# 1. The score matrix S = Q K^T / sqrt(d_k)


def _score_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor]:
    N, M, d_k = _SIZES[trial % 3]
    return randn(gen, N, d_k), randn(gen, M, d_k)


@exercise(
    name="self_attention.scores",
    prompt=(
        "Given queries Q (N, d_k) and keys K (M, d_k), return the scaled scores "
        "S = Q K^T / sqrt(d_k) of shape (N, M): S[n, m] = q_n . k_m / sqrt(d_k)."
    ),
    make_inputs=_score_inputs,
    mistakes=[
        Mistake(
            "queries and keys are swapped: you computed K Q^T; row n of S must belong to query n, "
            "so S = Q K^T.",
            lambda Q, K: K @ Q.T / math.sqrt(Q.shape[1]),
        ),
        Mistake(
            "the 1/sqrt(d_k) scale is missing: divide Q K^T by sqrt(d_k).",
            lambda Q, K: Q @ K.T,
        ),
        Mistake(
            "you divided by d_k; the scale is 1/sqrt(d_k) (the standard deviation of q . k), not "
            "1/d_k.",
            lambda Q, K: Q @ K.T / Q.shape[1],
        ),
        Mistake(
            "you multiplied by sqrt(d_k); the scores are divided by sqrt(d_k).",
            lambda Q, K: Q @ K.T * math.sqrt(Q.shape[1]),
        ),
    ],
)
def scores(Q: Tensor, K: Tensor) -> Tensor:
    d_k = Q.shape[-1]
    return Q @ K.T / math.sqrt(d_k)  # (N, M): row n = query n, column m = key m


# ---------------------------------------------------------------------------------------------------
# 2. A numerically stable row softmax


def _softmax_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor]:
    N, M, _ = _SIZES[trial % 3]
    S = 3.0 * randn(gen, N, M)
    if trial == 2:
        S = S + 800.0  # exp(800) overflows float64: only a stable softmax survives
    return (S,)


@exercise(
    name="self_attention.softmax_rows",
    prompt=(
        "Given scores S (N, M), return A (N, M) with A[n, m] = exp(S[n, m]) / sum_m' exp(S[n, m']), "
        "written with torch.exp (not torch.softmax). Each row must sum to one, and it must work for "
        "large scores such as 800 (subtract each row's maximum first)."
    ),
    make_inputs=_softmax_inputs,
    rows_sum_to_one=True,
    mistakes=[
        Mistake(
            "you normalised each column (dim=0); each query's row must sum to one (sum over dim=-1, "
            "with keepdim=True).",
            lambda S: torch.exp(S - S.amax()) / torch.exp(S - S.amax()).sum(0),
        ),
        Mistake(
            "you divided by the sum of the whole matrix; normalise each row separately "
            "(sum over dim=-1 with keepdim=True).",
            lambda S: torch.exp(S - S.amax()) / torch.exp(S - S.amax()).sum(),
        ),
        Mistake(
            "the exponential is missing: S / S.sum(...) is not a softmax (and can be negative).",
            lambda S: S / S.sum(-1, keepdim=True),
        ),
    ],
)
def softmax_rows(S: Tensor) -> Tensor:
    S = S - S.amax(
        dim=-1, keepdim=True
    )  # shift each row: softmax is unchanged, exp cannot overflow
    E = torch.exp(S)  # (N, M), largest entry of each row is exactly 1
    return E / E.sum(dim=-1, keepdim=True)  # rows sum to one


# ---------------------------------------------------------------------------------------------------
# 3. Scaled dot-product self-attention with a boolean mask (the notes' Algorithm 1 plus a mask)


def _masked_inputs(
    gen: torch.Generator, trial: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    N, D, d_k, d_v = ((5, 4, 3, 2), (6, 3, 4, 5), (8, 6, 2, 3))[trial % 3]
    X, W_q, W_k, W_v = randn(gen, N, D), randn(gen, D, d_k), randn(gen, D, d_k), randn(gen, D, d_v)
    if trial == 0:
        mask = torch.ones(N, N, dtype=torch.bool).tril()  # causal
    else:
        mask = torch.rand(N, N, generator=gen) < 0.5
    idx = torch.arange(N)
    mask[idx, idx] = True  # every query may attend to itself: no row is empty
    mask[idx, (idx + 1) % N] = False  # and each row masks something: the inverted mask is not empty
    return X, W_q, W_k, W_v, mask


def _masked_attention(X, W_q, W_k, W_v, mask, keep, scale=True, renormalise=True):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    S = Q @ K.T / (math.sqrt(Q.shape[1]) if scale else 1.0)
    if keep is None:
        return torch.softmax(S, dim=-1) @ V
    if not renormalise:
        return (torch.softmax(S, dim=-1) * keep) @ V
    return torch.softmax(S.masked_fill(~keep, float("-inf")), dim=-1) @ V


@exercise(
    name="self_attention.masked_self_attention",
    prompt=(
        "X is (N, D), W_q and W_k are (D, d_k), W_v is (D, d_v), mask is a bool (N, N) tensor with "
        "True where query n may attend to key m (every row has at least one True). Return "
        "Y = softmax(S) V of shape (N, d_v), S = Q K^T / sqrt(d_k), where masked scores are -inf "
        "so that their weights are exactly zero and each row of weights still sums to one."
    ),
    make_inputs=_masked_inputs,
    mistakes=[
        Mistake(
            "the mask is inverted: True means 'may attend', so fill the scores where the mask is "
            "False: S.masked_fill(~mask, float('-inf')).",
            lambda X, W_q, W_k, W_v, mask: _masked_attention(X, W_q, W_k, W_v, ~mask, ~mask),
        ),
        Mistake(
            "the mask is ignored: every query attended to every key.",
            lambda X, W_q, W_k, W_v, mask: _masked_attention(X, W_q, W_k, W_v, mask, None),
        ),
        Mistake(
            "you zeroed the weights after the softmax, so rows no longer sum to one; mask the scores "
            "with -inf before the softmax instead.",
            lambda X, W_q, W_k, W_v, mask: _masked_attention(
                X, W_q, W_k, W_v, mask, mask, renormalise=False
            ),
        ),
        Mistake(
            "the 1/sqrt(d_k) scale is missing: divide Q K^T by sqrt(d_k) before masking.",
            lambda X, W_q, W_k, W_v, mask: _masked_attention(
                X, W_q, W_k, W_v, mask, mask, scale=False
            ),
        ),
    ],
)
def masked_self_attention(X: Tensor, W_q: Tensor, W_k: Tensor, W_v: Tensor, mask: Tensor) -> Tensor:
    Q, K, V = X @ W_q, X @ W_k, X @ W_v  # (N, d_k), (N, d_k), (N, d_v)
    S = Q @ K.T / math.sqrt(Q.shape[-1])  # (N, N) scores
    S = S.masked_fill(~mask, float("-inf"))  # False = may not attend: exp(-inf) = 0
    A = torch.softmax(S, dim=-1)  # (N, N), rows sum to one, masked entries exactly 0
    return A @ V  # (N, d_v)


# ---------------------------------------------------------------------------------------------------
# 4. The variance of q . k, by Monte Carlo


def _variance_inputs(gen: torch.Generator, trial: int) -> tuple[int, int, int]:
    d_k = (4, 16, 32)[trial % 3]
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    return d_k, 50_000, seed


def _products(d_k: int, num_samples: int, seed: int) -> Tensor:
    """q * k for the draws the prompt asks for (queries first): (num_samples, d_k), one row a pair."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(num_samples, d_k, generator=g, dtype=torch.float64)
    k = torch.randn(num_samples, d_k, generator=g, dtype=torch.float64)
    return q * k


@exercise(
    name="self_attention.qk_variance",
    prompt=(
        "Estimate Var(q . k) by Monte Carlo for q, k in R^{d_k} with independent standard normal "
        "entries: draw num_samples pairs with g = torch.Generator().manual_seed(seed) and "
        "torch.randn(num_samples, d_k, generator=g, dtype=torch.float64) (first all queries, then "
        "all keys), take the num_samples dot products and return their sample variance as a "
        "0-dim tensor. The checker accepts any estimate within 5% of the reference estimate."
    ),
    make_inputs=_variance_inputs,
    atol=0.0,
    rtol=0.05,
    mistakes=[
        Mistake(
            "your answer is the standard deviation of q . k (about sqrt(d_k)); return the variance "
            "(.var(), not .std()).",
            lambda d_k, n, seed: _products(d_k, n, seed).sum(dim=-1).std(),
        ),
        Mistake(
            "your answer is the variance of q . k / sqrt(d_k), the scaled score (about 1, like a "
            "single product q_i k_i); the unscaled dot product sums d_k such terms.",
            lambda d_k, n, seed: (_products(d_k, n, seed).sum(dim=-1) / math.sqrt(d_k)).var(),
        ),
        Mistake(
            "you summed over the samples (dim=0) instead of over the d_k coordinates (dim=-1) of "
            "each pair, so your answer is of the order of num_samples.",
            lambda d_k, n, seed: _products(d_k, n, seed).sum(dim=0).var(),
        ),
    ],
)
def qk_variance(d_k: int, num_samples: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(num_samples, d_k, generator=g, dtype=torch.float64)  # (num_samples, d_k)
    k = torch.randn(num_samples, d_k, generator=g, dtype=torch.float64)  # (num_samples, d_k)
    dots = (q * k).sum(dim=-1)  # (num_samples,): one q . k per pair
    return dots.var()  # close to d_k


# ---------------------------------------------------------------------------------------------------
# 5. Absorbing a bias into the weights (the notes, sec. 2.9.2)


def _bias_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor]:
    D, d = ((3, 2), (5, 4), (4, 6))[trial % 3]
    return randn(gen, D, d), randn(gen, d)


@exercise(
    name="self_attention.absorb_bias",
    prompt=(
        "Given W (D, d) and a bias b (d,), return W_aug (D + 1, d) such that "
        "torch.cat([X, torch.ones(N, 1)], dim=1) @ W_aug == X @ W + b for every X (N, D): the "
        "constant feature 1 is appended as the LAST column of X."
    ),
    make_inputs=_bias_inputs,
    mistakes=[
        Mistake(
            "b is in the first row of W_aug, but the constant 1 is the LAST feature of [X, 1], so b "
            "must be the last row: torch.cat([W, b[None, :]], dim=0).",
            lambda W, b: torch.cat([b[None, :], W], dim=0),
        ),
        Mistake(
            "the last row is all ones; it must hold the bias b (the ones are in X's extra column, "
            "not in W_aug).",
            lambda W, b: torch.cat([W, torch.ones_like(b)[None, :]], dim=0),
        ),
    ],
)
def absorb_bias(W: Tensor, b: Tensor) -> Tensor:
    return torch.cat([W, b[None, :]], dim=0)  # (D + 1, d): the last row multiplies the constant 1


# ---------------------------------------------------------------------------------------------------
# 6. The whole layer: one head of scaled dot-product self-attention, optionally causal


def _single_head_inputs(
    gen: torch.Generator, trial: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, bool]:
    # Not causal first (the scale and the axes are judged there), then causal (the mask is judged);
    # d_k is never 1 (where 1/d_k = 1/sqrt(d_k)), and d_v = D once so that V = X has the right shape.
    N, D, d_k, d_v, causal = (
        (5, 4, 3, 2, False),
        (6, 5, 4, 5, True),
        (7, 6, 2, 3, False),
        (8, 3, 5, 4, True),
    )[trial % 4]
    X = randn(gen, N, D)
    # weights scaled by 1/sqrt(D) keep the scores of order one: no softmax saturates, so a wrong
    # scale changes the output wherever a query sees more than one key
    W_q, W_k, W_v = (randn(gen, D, d) / math.sqrt(D) for d in (d_k, d_k, d_v))
    return X, W_q, W_k, W_v, causal


def _single_head_variant(
    X,
    W_q,
    W_k,
    W_v,
    causal,
    *,
    scale=lambda d_k: 1 / math.sqrt(d_k),
    keys_times_queries=False,
    softmax_dim=-1,
    scale_after_softmax=False,
    values_are_X=False,
    keys_from_W_q=False,
    mask="tril",  # "tril" (right), "triu" (the future), or None (ignored)
    always_masked=False,  # the mask applied whatever the flag says
    fill=float("-inf"),  # what masked scores become; None: zero the weights after the softmax
):
    """One head with each typical mistake switchable, for the checker's known mistakes."""
    Q, K = X @ W_q, X @ (W_q if keys_from_W_q else W_k)
    V = X if values_are_X else X @ W_v
    S = K @ Q.T if keys_times_queries else Q @ K.T
    if scale_after_softmax:
        return torch.softmax(S, dim=softmax_dim) * scale(Q.shape[1]) @ V
    S = S * scale(Q.shape[1])
    if not (causal or always_masked) or mask is None:
        return torch.softmax(S, dim=softmax_dim) @ V
    N = X.shape[0]
    keep = torch.ones(N, N, dtype=torch.bool)
    keep = keep.tril() if mask == "tril" else keep.triu()
    if fill is None:
        return (torch.softmax(S, dim=softmax_dim) * keep) @ V
    return torch.softmax(S.masked_fill(~keep, fill), dim=softmax_dim) @ V


def _mistake(**variant: Any) -> Callable[..., Tensor]:
    return lambda X, W_q, W_k, W_v, causal: _single_head_variant(
        X, W_q, W_k, W_v, causal, **variant
    )


@exercise(
    name="self_attention.single_head",
    prompt=(
        "Write one head of self-attention, optionally causal: Y = softmax_row(Q K^T / sqrt(d_k)) V "
        "with Q = X W_q, K = X W_k, V = X W_v. X is (N, D), W_q and W_k are (D, d_k), W_v is "
        "(D, d_v), Y is (N, d_v). With causal=True, token n attends only to tokens 0..n: set the "
        "scores above the diagonal to -inf before the softmax."
    ),
    make_inputs=_single_head_inputs,
    trials=4,
    mistakes=[
        Mistake(
            "the 1/sqrt(d_k) scale is missing: divide Q K^T by sqrt(d_k) before the softmax.",
            _mistake(scale=lambda d_k: 1.0),
        ),
        Mistake(
            "you divided the scores by d_k; the scale is 1/sqrt(d_k) (the standard deviation of "
            "q . k), not 1/d_k.",
            _mistake(scale=lambda d_k: 1 / d_k),
        ),
        Mistake(
            "you scaled the weights after the softmax, so their rows sum to 1/sqrt(d_k); divide the "
            "scores by sqrt(d_k) before the softmax.",
            _mistake(scale_after_softmax=True),
        ),
        Mistake(
            "the softmax normalised over the queries (dim=0): each query's row of weights must sum "
            "to one, so take the softmax over the keys, dim=-1.",
            _mistake(softmax_dim=0),
        ),
        Mistake(
            "queries and keys are swapped: you computed K Q^T; row n of the scores belongs to "
            "query n, so S = Q K^T.",
            _mistake(keys_times_queries=True),
        ),
        Mistake(
            "the values are X itself: project them, V = X W_v (the output has d_v columns).",
            _mistake(values_are_X=True),
        ),
        Mistake(
            "the keys were made with W_q: K = X W_k (queries and keys have separate maps).",
            _mistake(keys_from_W_q=True),
        ),
        Mistake(
            "with causal=True the mask is missing: token n attended to the tokens after it. Set "
            "the scores above the diagonal to -inf before the softmax.",
            _mistake(mask=None),
        ),
        Mistake(
            "with causal=False you masked anyway: without the flag every token attends to every "
            "token; apply the mask only when causal is True.",
            _mistake(always_masked=True),
        ),
        Mistake(
            "the causal mask points the wrong way: you kept the upper triangle, so token n sees "
            "tokens n..N-1 (the future). Keep the lower triangle: "
            "torch.ones(N, N, dtype=torch.bool).tril() is True where query n may see key m <= n.",
            _mistake(mask="triu"),
        ),
        Mistake(
            "you zeroed the weights after the softmax, so the rows no longer sum to one; set the "
            "masked scores to -inf before the softmax instead.",
            _mistake(fill=None),
        ),
        Mistake(
            "the masked scores were set to 0, not -inf: exp(0) = 1, so the later tokens still get "
            "weight. Use S.masked_fill(~mask, float('-inf')).",
            _mistake(fill=0.0),
        ),
    ],
)
def single_head(X: Tensor, W_q: Tensor, W_k: Tensor, W_v: Tensor, causal: bool = False) -> Tensor:
    Q, K, V = X @ W_q, X @ W_k, X @ W_v  # (N, d_k), (N, d_k), (N, d_v)
    S = Q @ K.T / math.sqrt(Q.shape[-1])  # (N, N) scores: row n = query n, column m = key m
    if causal:
        N = X.shape[0]
        mask = torch.ones(N, N, dtype=torch.bool, device=X.device).tril()  # True where m <= n
        S = S.masked_fill(~mask, float("-inf"))  # exp(-inf) = 0: no weight on later tokens
    A = torch.softmax(S, dim=-1)  # (N, N), each row sums to one
    return A @ V  # (N, d_v)
