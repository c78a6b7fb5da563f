"""Exercises of the *Claims tested* lab: the paired t-interval of seed-by-seed differences, the
attention weights of tied query and key maps, BatchNorm over the batch and the tokens, and the
normalised entropy of causal attention rows.

Chapter: *Claims tested* (Turner 2023 footnote 9 and fig. 5; the lecture notes on Bishop and Bishop's
chapter 12, ``bishop2024notes``, sec. 2.10). Every input is float64 so the checkers can use tight
tolerances.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..claims import student_t_quantile
from . import Mistake, exercise, randn

# ---------------------------------------------------------------------------------------------------
# 1. The paired t-interval


def _paired_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, float]:
    n = (5, 3, 8)[trial % 3]
    x = 2.0 + 0.1 * randn(gen, n)  # the baseline's loss, one per seed
    y = x + 0.02 + 0.03 * randn(gen, n) + 0.05 * randn(gen, 1)  # the variant's, same seeds
    return x, y, student_t_quantile(0.975, n - 1)


def _interval(d: Tensor, sd: Tensor, t_crit: float, root_n: bool = True) -> Tensor:
    n = len(d)
    half = t_crit * sd / (math.sqrt(n) if root_n else n)
    return torch.stack([d.mean(), d.mean() - half, d.mean() + half])


@exercise(
    name="claims.paired_t_interval",
    prompt=(
        "x and y are (n,) figures of the baseline and the variant, one per seed (x[s] and y[s] come "
        "from the same seed s); t_crit is the t quantile with n - 1 degrees of freedom. Return "
        "torch.stack([mean, low, high]): the mean of the differences d = y - x and the interval "
        "mean -/+ t_crit * s_d / sqrt(n), with s_d the sample standard deviation (divide by n - 1)."
    ),
    make_inputs=_paired_inputs,
    mistakes=[
        Mistake(
            "you treated the two samples as independent (standard error sqrt(s_x^2/n + s_y^2/n)): "
            "the runs are paired by seed, so the interval is built from the spread of the differences "
            "d = y - x. Variation the two arms share from seed to seed cancels in them, and the "
            "paired interval stays valid whether they share any or not.",
            lambda x, y, t: _interval(
                y - x, torch.sqrt(x.var() + y.var()), t
            ),  # (s_x^2/n + s_y^2/n)^(1/2) = sqrt(s_x^2 + s_y^2)/sqrt(n)
        ),
        Mistake(
            "the standard deviation divides by n; the sample standard deviation of a t-interval "
            "divides by n - 1 (torch's default, unbiased=True).",
            lambda x, y, t: _interval(y - x, (y - x).std(unbiased=False), t),
        ),
        Mistake(
            "you divided the standard deviation by n; the standard error of a mean is s_d / sqrt(n).",
            lambda x, y, t: _interval(y - x, (y - x).std(), t, root_n=False),
        ),
        Mistake(
            "the differences point the wrong way: d = y - x is the variant minus the baseline, so a "
            "variant with a lower loss gives a negative mean.",
            lambda x, y, t: _interval(x - y, (x - y).std(), t),
        ),
        Mistake(
            "you used the normal quantile 1.96; with a handful of seeds the t quantile (t_crit, "
            "larger: 2.78 for five seeds) is the right multiplier.",
            lambda x, y, t: _interval(y - x, (y - x).std(), 1.959963984540054),
        ),
    ],
)
def paired_t_interval(x: Tensor, y: Tensor, t_crit: float) -> Tensor:
    d = y - x  # (n,): one difference per seed
    half = t_crit * d.std(unbiased=True) / math.sqrt(len(d))  # t * s_d / sqrt(n)
    return torch.stack([d.mean(), d.mean() - half, d.mean() + half])


# ---------------------------------------------------------------------------------------------------
# 2. Attention weights with W_k = W_q


def _tied_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor]:
    B, N, D, d_k = ((2, 5, 6, 3), (1, 4, 8, 4), (3, 6, 4, 2))[trial % 3]
    return randn(gen, B, N, D), randn(gen, D, d_k) / math.sqrt(D)


def _tied(X, W, scale=True, causal=True, dim=-1, upper=False, project=True, d=None):
    Q = X @ W if project else X
    S = Q @ Q.transpose(-2, -1)
    if scale:
        S = S / (d if d is not None else math.sqrt(W.shape[1]))
    if causal:
        N = X.shape[-2]
        keep = torch.ones(N, N, dtype=torch.bool).tril()
        S = S.masked_fill(~(keep.T if upper else keep), float("-inf"))
    return torch.softmax(S, dim=dim)


@exercise(
    name="claims.tied_qk_weights",
    prompt=(
        "X is (B, N, D) and W is (D, d_k), the one map used for both queries and keys (W_q = W_k = W). "
        "Return the causal attention weights A (B, N, N): the scores (X W)(X W)^T / sqrt(d_k), the "
        "entries above the diagonal (key m > query n) set to -inf, then a softmax over each row."
    ),
    make_inputs=_tied_inputs,
    rows_sum_to_one=True,
    mistakes=[
        Mistake(
            "the 1/sqrt(d_k) scale is missing: divide the scores by sqrt(d_k) before the softmax.",
            lambda X, W: _tied(X, W, scale=False),
        ),
        Mistake(
            "you divided by d_k; the scale is 1/sqrt(d_k) (the standard deviation of a dot product "
            "of d_k unit-variance entries).",
            lambda X, W: _tied(X, W, d=W.shape[1]),
        ),
        Mistake(
            "the causal mask is missing: query n may attend only to keys m <= n.",
            lambda X, W: _tied(X, W, causal=False),
        ),
        Mistake(
            "the mask is transposed: you hid the past (m < n) instead of the future. With rows as "
            "queries the kept entries form a lower triangle (Turner's upper triangle is for his "
            "column convention).",
            lambda X, W: _tied(X, W, upper=True),
        ),
        Mistake(
            "the scores must be computed from the projected tokens Q = X W (and K = Q), not from X "
            "itself.",
            lambda X, W: _tied(X, W, project=False),
        ),
    ],
)
def tied_qk_weights(X: Tensor, W: Tensor) -> Tensor:
    Q = X @ W  # (B, N, d_k); the keys are the same vectors, K = Q
    S = Q @ Q.transpose(-2, -1) / math.sqrt(W.shape[1])  # (B, N, N), symmetric before masking
    N = X.shape[-2]
    future = ~torch.ones(N, N, dtype=torch.bool).tril()  # (N, N): True above the diagonal
    return torch.softmax(S.masked_fill(future, float("-inf")), dim=-1)


# ---------------------------------------------------------------------------------------------------
# 3. BatchNorm over the batch and the tokens


def _bn_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, Tensor, float]:
    B, N, D = ((3, 4, 5), (2, 6, 3), (4, 3, 6))[trial % 3]
    shift = 2.0 * randn(gen, 1, N, 1) + randn(gen, B, 1, 1)  # positions and sequences differ
    X = shift + torch.exp(randn(gen, 1, 1, D)) * randn(gen, B, N, D)
    return X, 1.0 + 0.5 * randn(gen, D), 0.5 * randn(gen, D), (0.1, 1e-3, 0.01)[trial % 3]


def _bn(X, gamma, beta, eps, dim=(0, 1), unbiased=False, inside=True):
    mu = X.mean(dim=dim, keepdim=True)
    var = X.var(dim=dim, keepdim=True, unbiased=unbiased)
    denom = torch.sqrt(var + eps) if inside else torch.sqrt(var) + eps
    return gamma * (X - mu) / denom + beta


@exercise(
    name="claims.token_batch_norm",
    prompt=(
        "X is (B, N, D), gamma and beta are (D,), eps a float. Return BatchNorm(X) in training mode, "
        "as nn.BatchNorm1d(D) computes it for sequences: for every feature d, the mean and the biased "
        "variance over all B*N tokens of the batch, then gamma * (X - mean) / sqrt(var + eps) + beta."
    ),
    make_inputs=_bn_inputs,
    mistakes=[
        Mistake(
            "you normalised each token over its D features (dim=-1): that is LayerNorm. BatchNorm "
            "takes each feature's statistics over the batch and the tokens (dims 0 and 1).",
            lambda X, g, b, eps: _bn(X, g, b, eps, dim=-1),
        ),
        Mistake(
            "you took the statistics over the batch only (dim=0), one mean per position: "
            "nn.BatchNorm1d on sequences pools every token of every sequence (dims 0 and 1).",
            lambda X, g, b, eps: _bn(X, g, b, eps, dim=0),
        ),
        Mistake(
            "you took the statistics over the tokens of each sequence (dim=1): that is instance "
            "normalisation. BatchNorm pools the whole batch as well (dims 0 and 1).",
            lambda X, g, b, eps: _bn(X, g, b, eps, dim=1),
        ),
        Mistake(
            "you used the unbiased variance (divide by B*N - 1); BatchNorm normalises with the biased "
            "one (divide by B*N). It keeps the unbiased one only for its running average.",
            lambda X, g, b, eps: _bn(X, g, b, eps, unbiased=True),
        ),
        Mistake(
            "eps is outside the square root: divide by sqrt(var + eps), not sqrt(var) + eps.",
            lambda X, g, b, eps: _bn(X, g, b, eps, inside=False),
        ),
    ],
)
def token_batch_norm(X: Tensor, gamma: Tensor, beta: Tensor, eps: float) -> Tensor:
    mu = X.mean(dim=(0, 1), keepdim=True)  # (1, 1, D): one mean per feature
    var = ((X - mu) ** 2).mean(dim=(0, 1), keepdim=True)  # (1, 1, D), biased
    return gamma * (X - mu) / torch.sqrt(var + eps) + beta  # (B, N, D)


# ---------------------------------------------------------------------------------------------------
# 4. The normalised entropy of causal attention rows


def _entropy_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor]:
    B, N = ((2, 5), (3, 4), (1, 7))[trial % 3]
    S = (1.0, 3.0, 0.5)[trial % 3] * randn(gen, B, N, N)
    keep = torch.ones(N, N, dtype=torch.bool).tril()
    return (torch.softmax(S.masked_fill(~keep, float("-inf")), dim=-1),)


def _plogp(A: Tensor) -> Tensor:
    return torch.where(A > 0, A * torch.log(A), torch.zeros_like(A))


@exercise(
    name="claims.normalised_entropy",
    prompt=(
        "A is (B, N, N): causal attention weights, row n (counting from 1) spread over the n keys "
        "m <= n. For each row n = 2..N compute its entropy -sum_m a_nm log a_nm divided by log n (the "
        "entropy of a uniform row over n keys), and return the mean over those N - 1 rows, shape (B,). "
        "Row 1 is left out: it has one key, so its entropy is always 0 out of a maximum of 0. "
        "Treat 0 log 0 as 0."
    ),
    make_inputs=_entropy_inputs,
    mistakes=[
        Mistake(
            "the entropies are not normalised: divide row n's entropy by log n, the largest entropy "
            "a row with n keys can have, so that 1 means uniform for every row.",
            lambda A: -_plogp(A).sum(-1)[..., 1:].mean(-1),
        ),
        Mistake(
            "you divided every row by log N; row n can attend to only n keys, so its largest entropy "
            "is log n.",
            lambda A: (-_plogp(A).sum(-1)[..., 1:] / math.log(A.shape[-1])).mean(-1),
        ),
        Mistake(
            "you averaged over all N rows with row 1 counted as 0: leave row 1 out (it has no choice "
            "to make) and average over the N - 1 others.",
            lambda A: torch.cat(
                [
                    torch.zeros(*A.shape[:-2], 1, dtype=A.dtype),
                    -_plogp(A).sum(-1)[..., 1:]
                    / torch.log(torch.arange(2, A.shape[-1] + 1, dtype=A.dtype)),
                ],
                dim=-1,
            ).mean(-1),
        ),
        Mistake(
            "you summed over the queries (dim=-2) instead of over the keys of each row (dim=-1).",
            lambda A: (
                -_plogp(A).sum(-2)[..., 1:]
                / torch.log(torch.arange(2, A.shape[-1] + 1, dtype=A.dtype))
            ).mean(-1),
        ),
    ],
)
def normalised_entropy(A: Tensor) -> Tensor:
    N = A.shape[-1]
    plogp = torch.where(A > 0, A * torch.log(A), torch.zeros_like(A))  # 0 log 0 = 0
    H = -plogp.sum(dim=-1)[..., 1:]  # (B, N - 1): rows 2..N
    return (H / torch.log(torch.arange(2, N + 1, dtype=A.dtype))).mean(dim=-1)  # (B,)
