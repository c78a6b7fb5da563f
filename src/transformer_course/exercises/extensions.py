"""Exercises of the *Extensions* lab: rotary position embeddings, RMSNorm, grouped-query attention,
the online-softmax recurrence, and the top-k router and load-balancing loss of a mixture of experts.

Chapter: *Extensions* (Su et al. 2024; Zhang & Sennrich 2019; Shazeer 2019; Ainslie et al. 2023;
Milakov & Gimelshein 2018; Shazeer et al. 2017; Fedus et al. 2022). Every input is float64 so the
checkers can use tight tolerances, and each input is chosen so that every listed mistake gives
different numbers from the solution: positions are not ``0 .. N-1`` (a solution that ignores them
differs), tokens are not centred (subtracting the mean matters), there are at least two key-value heads
serving at least two query heads each (the two ways of sharing them differ), the scores are large (an
exponential without a maximum overflows), and routers have k >= 1 of N_e >= 4 experts with skewed
probabilities (so counts, fractions and the factor N_e all differ).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..extensions import repeat_kv
from . import Mistake, exercise, randn

# ---------------------------------------------------------------------------------------------------
# 1. Rotary position embeddings


def _rope_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, float]:
    B, N, d = ((2, 5, 8), (1, 6, 4), (3, 4, 12))[trial % 3]
    positions = torch.randperm(40, generator=gen)[:N] + 1  # not 0 .. N-1, and never 0
    return randn(gen, B, N, d), positions, (10_000.0, 100.0, 10.0)[trial % 3]


def _rope_wrong(X, positions, base, *, layout="pairs", sign=1.0, exponent=2.0, pos=None):
    d = X.shape[-1]
    p = (positions if pos is None else pos).double()[:, None]  # (N, 1)
    angles = sign * p * base ** (-exponent * torch.arange(d // 2, dtype=torch.float64) / d)
    c, s = torch.cos(angles), torch.sin(angles)
    if layout == "halves":
        x0, x1 = X[..., : d // 2], X[..., d // 2 :]
        return torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    x0, x1 = X[..., 0::2], X[..., 1::2]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


@exercise(
    name="extensions.rope",
    prompt=(
        "X is (B, N, d) with d even, positions an integer tensor (N,), base a float. Return X with "
        "rotary position embeddings applied: for each token n and each pair of adjacent features "
        "(2i, 2i+1), rotate (x_2i, x_2i+1) by the angle positions[n] * base**(-2i/d): "
        "(x_2i cos - x_2i+1 sin, x_2i sin + x_2i+1 cos)."
    ),
    make_inputs=_rope_inputs,
    mistakes=[
        Mistake(
            "you paired feature i with feature i + d/2 (the 'halves' layout of GPT-NeoX and Hugging "
            "Face's LLaMA); this exercise pairs adjacent features (2i, 2i+1), as Su et al. do. The two "
            "are the same rotation up to a permutation of the features, but not the same numbers.",
            lambda X, positions, base: _rope_wrong(X, positions, base, layout="halves"),
        ),
        Mistake(
            "you rotated the wrong way (by -angle): the first feature of a pair becomes "
            "x_2i cos + x_2i+1 sin instead of x_2i cos - x_2i+1 sin. Scores still depend on offsets "
            "only, but the result is Theta_{-n} x, not Theta_n x.",
            lambda X, positions, base: _rope_wrong(X, positions, base, sign=-1.0),
        ),
        Mistake(
            "the frequencies are base**(-i/d); RoPE uses omega_i = base**(-2i/d) for pair i "
            "(i = 0 .. d/2 - 1), so the slowest pair turns at base**(-(d-2)/d), not base**(-1/2).",
            lambda X, positions, base: _rope_wrong(X, positions, base, exponent=1.0),
        ),
        Mistake(
            "you used the positions 0 .. N-1 instead of the given `positions` (they are the tokens' "
            "places in the sequence, e.g. after a key-value cache, and need not start at 0).",
            lambda X, positions, base: _rope_wrong(
                X, positions, base, pos=torch.arange(X.shape[-2])
            ),
        ),
    ],
)
def rope(X: Tensor, positions: Tensor, base: float) -> Tensor:
    d = X.shape[-1]
    theta = base ** (-2.0 * torch.arange(d // 2, dtype=torch.float64) / d)  # (d/2,)
    angles = positions.double()[:, None] * theta  # (N, d/2): one angle per token and pair
    c, s = torch.cos(angles), torch.sin(angles)
    x0, x1 = X[..., 0::2], X[..., 1::2]  # (B, N, d/2): first and second feature of each pair
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)  # (B, N, d)


# ---------------------------------------------------------------------------------------------------
# 2. RMSNorm


def _rms_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, float]:
    B, N, D = ((2, 3, 5), (3, 4, 6), (2, 6, 8))[trial % 3]
    eps = (0.1, 1e-3, 0.01)[trial % 3]
    scale = torch.exp(randn(gen, B, N, 1))  # (B, N, 1): tokens of different sizes, some small
    X = 1.5 + scale * randn(gen, B, N, D)  # not centred: subtracting the mean changes the result
    return X, 1.0 + 0.5 * randn(gen, D), eps


def _rms(X, gamma, eps, *, centre=False, inside=True, reduce="mean", dim=-1):
    Z = X - X.mean(dim=-1, keepdim=True) if centre else X
    sq = (Z**2).mean(dim=dim, keepdim=True) if reduce == "mean" else (Z**2).sum(dim, keepdim=True)
    denom = torch.sqrt(sq + eps) if inside else torch.sqrt(sq) + eps
    return gamma * Z / denom


@exercise(
    name="extensions.rms_norm",
    prompt=(
        "X is (B, N, D), gamma (D,), eps a float. Return RMSNorm(X) of shape (B, N, D): divide every "
        "token by the root of the mean of its squared features plus eps, "
        "sqrt(mean_d X[b, n, d]**2 + eps), then multiply by gamma. No mean is subtracted, no beta."
    ),
    make_inputs=_rms_inputs,
    mistakes=[
        Mistake(
            "you subtracted each token's mean first: that is LayerNorm (without beta). RMSNorm keeps "
            "the mean and divides by the root mean square of the raw features.",
            lambda X, g, eps: _rms(X, g, eps, centre=True),
        ),
        Mistake(
            "eps is outside the square root (you divided by rms + eps); RMSNorm, like "
            "torch.nn.RMSNorm, divides by sqrt(mean(x**2) + eps).",
            lambda X, g, eps: _rms(X, g, eps, inside=False),
        ),
        Mistake(
            "you divided by the root of the SUM of squares (the Euclidean norm): RMSNorm takes the "
            "MEAN over the D features, so the result is sqrt(D) times larger than a unit vector.",
            lambda X, g, eps: _rms(X, g, eps, reduce="sum"),
        ),
        Mistake(
            "you took the mean square over the tokens of a sequence (dim=-2); RMSNorm normalises each "
            "token over its own D features (dim=-1).",
            lambda X, g, eps: _rms(X, g, eps, dim=-2),
        ),
        Mistake(
            "gamma is missing: multiply the normalised tokens by the learned gain gamma.",
            lambda X, g, eps: _rms(X, torch.ones_like(g), eps),
        ),
    ],
)
def rms_norm(X: Tensor, gamma: Tensor, eps: float) -> Tensor:
    rms = torch.sqrt((X**2).mean(dim=-1, keepdim=True) + eps)  # (B, N, 1): one value per token
    return gamma * X / rms


# ---------------------------------------------------------------------------------------------------
# 3. Grouped-query attention


def _gqa_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, Tensor]:
    B, H, H_kv, N, d = ((2, 4, 2, 5, 4), (1, 6, 3, 4, 6), (2, 8, 2, 3, 4))[trial % 3]
    return randn(gen, B, H, N, d), randn(gen, B, H_kv, N, d), randn(gen, B, H_kv, N, d)


def _attend(Q, K, V, scale=True):
    S = Q @ K.mT / (math.sqrt(Q.shape[-1]) if scale else 1.0)
    return torch.softmax(S, dim=-1) @ V


def _tile(T: Tensor, H: int) -> Tensor:  # head h reads key-value head h % H_kv
    return T.repeat(1, H // T.shape[1], 1, 1)


def _first(T: Tensor, H: int) -> Tensor:  # every head reads key-value head 0
    return T[:, :1].expand(-1, H, -1, -1)


def _grouped(T: Tensor, Q: Tensor) -> Tensor:  # the right sharing: head h reads h // (H // H_kv)
    return repeat_kv(T, Q.shape[1] // T.shape[1])


@exercise(
    name="extensions.gqa",
    prompt=(
        "Q is (B, H, N, d), K and V are (B, H_kv, N, d) with H_kv dividing H. Return grouped-query "
        "attention (B, H, N, d): the query heads form H_kv groups of H // H_kv consecutive heads, and "
        "group g (query heads g*H//H_kv .. (g+1)*H//H_kv - 1) uses key-value head g; each head is "
        "softmax(Q_h K_g^T / sqrt(d)) V_g. No mask."
    ),
    make_inputs=_gqa_inputs,
    mistakes=[
        Mistake(
            "the heads share the wrong key-value heads: you gave query head h the key-value head "
            "h % H_kv (K.repeat(...) tiles the heads: 0, 1, 0, 1, ...). Consecutive query heads form "
            "a group: head h uses key-value head h // (H // H_kv) (repeat_interleave: 0, 0, 1, 1, ...).",
            lambda Q, K, V: _attend(Q, _tile(K, Q.shape[1]), _tile(V, Q.shape[1])),
        ),
        Mistake(
            "every query head used key-value head 0: that is multi-query attention with the other "
            "key-value heads thrown away. Group g of query heads uses key-value head g.",
            lambda Q, K, V: _attend(Q, _first(K, Q.shape[1]), _first(V, Q.shape[1])),
        ),
        Mistake(
            "the scores are not scaled: divide Q_h K_g^T by sqrt(d) before the softmax.",
            lambda Q, K, V: _attend(Q, _grouped(K, Q), _grouped(V, Q), scale=False),
        ),
    ],
)
def gqa(Q: Tensor, K: Tensor, V: Tensor) -> Tensor:
    n_rep = Q.shape[1] // K.shape[1]  # query heads per key-value head
    K, V = K.repeat_interleave(n_rep, dim=1), V.repeat_interleave(n_rep, dim=1)  # (B, H, N, d)
    return torch.softmax(Q @ K.mT / math.sqrt(Q.shape[-1]), dim=-1) @ V


# ---------------------------------------------------------------------------------------------------
# 4. The online-softmax recurrence


def _online_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor]:
    N, M = ((3, 7), (4, 10), (2, 12))[trial % 3]
    return (800.0 + 10.0 * randn(gen, N, M),)  # exp(800) overflows even in float64


def _online_wrong(S, *, rescale="right", final_max=True):
    mu = torch.full(S.shape[:-1], float("-inf"), dtype=S.dtype)
    lam = torch.zeros(S.shape[:-1], dtype=S.dtype)
    running = []
    for j in range(S.shape[-1]):
        mu_new = torch.maximum(mu, S[:, j])
        factor = {"right": torch.exp(mu - mu_new), "none": 1.0,
                  "inverted": torch.exp(mu_new - mu).nan_to_num(posinf=0.0)}[rescale]  # fmt: skip
        lam = lam * factor + torch.exp(S[:, j] - mu_new)
        mu = mu_new
        running.append(mu.clone())
    base = mu[:, None] if final_max else torch.stack(running, dim=-1)
    return torch.exp(S - base) / lam[:, None]


@exercise(
    name="extensions.online_softmax",
    prompt=(
        "S is (N, M) with large scores (around 800). Return softmax(S) over each row, computed in one "
        "pass over the columns j = 0 .. M-1 with a running maximum mu and a running sum lam (lambda): "
        "mu_new = max(mu, S[:, j]); lam = lam * exp(mu - mu_new) + exp(S[:, j] - mu_new); "
        "mu = mu_new; at the end, exp(S - mu) / lam. Start with mu = -inf and lam = 0."
    ),
    make_inputs=_online_inputs,
    mistakes=[
        Mistake(
            "the running sum is never rescaled: when the maximum grows from mu to mu_new, the terms "
            "already summed were exp(s - mu) and must become exp(s - mu_new), so multiply lam by "
            "exp(mu - mu_new) before adding the new term.",
            lambda S: _online_wrong(S, rescale="none"),
        ),
        Mistake(
            "the rescaling factor is upside down: multiply the old sum by exp(mu - mu_new) (at most "
            "1, since the maximum only grows), not by exp(mu_new - mu).",
            lambda S: _online_wrong(S, rescale="inverted"),
        ),
        Mistake(
            "each output used the maximum seen up to its own column, exp(S[:, j] - mu_j); the sum "
            "lam is relative to the FINAL maximum, so every output must be exp(S[:, j] - mu_final) "
            "/ lam.",
            lambda S: _online_wrong(S, final_max=False),
        ),
    ],
)
def online_softmax(S: Tensor) -> Tensor:
    mu = torch.full((S.shape[0],), float("-inf"), dtype=S.dtype)  # running maximum of each row
    lam = torch.zeros(S.shape[0], dtype=S.dtype)  # running sum of exp(s - mu)
    for j in range(S.shape[1]):
        mu_new = torch.maximum(mu, S[:, j])
        lam = lam * torch.exp(mu - mu_new) + torch.exp(S[:, j] - mu_new)  # rescale, then add
        mu = mu_new
    return torch.exp(S - mu[:, None]) / lam[:, None]


# ---------------------------------------------------------------------------------------------------
# 5. Mixture of experts: top-k routing and the load-balancing loss


def _router_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, int]:
    N, D, n_experts, k = ((6, 5, 4, 2), (9, 4, 6, 3), (5, 6, 5, 2))[trial % 3]
    return randn(gen, N, D), randn(gen, D, n_experts), k


def _router_wrong(X, W_r, k, *, mistake):
    S = X @ W_r  # (N, N_e) logits
    if mistake == "not renormalised":
        G = torch.softmax(S, dim=-1)
        top, idx = G.topk(k, dim=-1)
        return torch.zeros_like(G).scatter(-1, idx, top)
    if mistake == "softmax over tokens":
        G = torch.softmax(S, dim=0)
        top, idx = G.topk(k, dim=-1)
        return torch.zeros_like(G).scatter(-1, idx, top / top.sum(-1, keepdim=True))
    if mistake == "zeros not -inf":  # the other logits set to 0 before the softmax
        idx = S.topk(k, dim=-1).indices
        kept = torch.zeros_like(S).scatter(-1, idx, S.gather(-1, idx))
        G = torch.softmax(kept, dim=-1)
        return torch.zeros_like(G).scatter(-1, idx, G.gather(-1, idx))
    raise ValueError(mistake)


@exercise(
    name="extensions.top_k_router",
    prompt=(
        "X is (N, D) tokens, W_r (D, N_e) the router's map, k an int. Return the (N, N_e) matrix of "
        "routing weights: G = softmax of X @ W_r over the experts; keep the k largest entries of "
        "each row, divided by their sum so that they sum to 1; every other entry is 0."
    ),
    make_inputs=_router_inputs,
    mistakes=[
        Mistake(
            "the k kept probabilities are not renormalised: each row of your weights sums to less "
            "than 1. Divide the kept G_ni by their sum (this exercise follows Shazeer et al. and "
            "GShard; only the Switch Transformer, with k = 1, keeps the raw probability).",
            lambda X, W_r, k: _router_wrong(X, W_r, k, mistake="not renormalised"),
        ),
        Mistake(
            "the softmax ran over the tokens (dim=0) instead of over the experts (dim=-1): each "
            "token's probabilities must sum to 1 across the N_e experts.",
            lambda X, W_r, k: _router_wrong(X, W_r, k, mistake="softmax over tokens"),
        ),
        Mistake(
            "you set the logits of the experts not chosen to 0 and then took the softmax over all "
            "experts: a logit of 0 still gets weight exp(0). Set them to -inf (or take the softmax "
            "over the k kept logits only, or renormalise the kept probabilities).",
            lambda X, W_r, k: _router_wrong(X, W_r, k, mistake="zeros not -inf"),
        ),
    ],
)
def top_k_router(X: Tensor, W_r: Tensor, k: int) -> Tensor:
    G = torch.softmax(X @ W_r, dim=-1)  # (N, N_e): each token's probabilities over the experts
    top, idx = G.topk(k, dim=-1)  # (N, k): the k most probable experts of each token
    return torch.zeros_like(G).scatter(-1, idx, top / top.sum(dim=-1, keepdim=True))


def _balance_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, float]:
    N, n_experts, k = ((12, 4, 2), (10, 5, 1), (16, 6, 3))[trial % 3]
    probs = torch.softmax(2.0 * randn(gen, N, n_experts) + randn(gen, n_experts), dim=-1)
    return probs, probs.topk(k, dim=-1).indices, (0.01, 0.1, 1.0)[trial % 3]


def _balance_wrong(probs, experts, alpha, *, mistake):
    N, n_experts = probs.shape
    k = experts.shape[1]
    counts = torch.zeros(n_experts, dtype=probs.dtype)
    for i in experts.reshape(-1).tolist():
        counts[i] += 1
    f = counts if mistake == "counts" else counts / (k * N)
    P = probs.mean(dim=0)
    if mistake == "P twice":
        f = P
    scale = 1.0 if mistake == "no E" else n_experts
    return alpha * scale * (f * P).sum()


@exercise(
    name="extensions.load_balancing_loss",
    prompt=(
        "probs is (N, N_e), each row a token's router probabilities; experts is (N, k), the experts "
        "each token was sent to; alpha a float. Return the Switch load-balancing loss (a scalar "
        "tensor) alpha * N_e * sum_i f_i * P_i, where f_i is the fraction of the k*N choices that "
        "went to expert i and P_i the mean of probs[:, i] over the tokens."
    ),
    make_inputs=_balance_inputs,
    mistakes=[
        Mistake(
            "f_i counts the choices of expert i instead of their fraction: divide by the k*N "
            "choices, so that the f_i sum to 1 (otherwise the loss grows with the batch).",
            lambda probs, experts, alpha: _balance_wrong(probs, experts, alpha, mistake="counts"),
        ),
        Mistake(
            "the factor N_e is missing: without it the loss at perfect balance is alpha / N_e, "
            "and changes with the number of experts; with it, perfect balance gives alpha.",
            lambda probs, experts, alpha: _balance_wrong(probs, experts, alpha, mistake="no E"),
        ),
        Mistake(
            "you used the mean probability P_i in both factors (N_e sum_i P_i^2): the first factor "
            "must be f_i, the fraction of choices actually dispatched to expert i.",
            lambda probs, experts, alpha: _balance_wrong(probs, experts, alpha, mistake="P twice"),
        ),
    ],
)
def load_balancing_loss(probs: Tensor, experts: Tensor, alpha: float) -> Tensor:
    (N, n_experts), k = probs.shape, experts.shape[1]
    counts = torch.zeros(n_experts, dtype=probs.dtype)  # choices per expert
    counts.index_add_(0, experts.reshape(-1), torch.ones(k * N, dtype=probs.dtype))
    f = counts / (k * N)  # fraction of the k*N choices per expert
    P = probs.mean(dim=0)  # mean router probability per expert
    return alpha * n_experts * (f * P).sum()
