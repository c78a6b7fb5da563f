"""Claims tested: design claims of the sources as seeded, paired experiments on a small language model.

Chapter: *Claims tested*. Each claim becomes one function that trains the same small character model
(:class:`ClaimsLM`, built from the package's blocks, stack and position codes) on tiny-shakespeare with
the one training loop (:func:`.train.train`), once per variant and seed, and returns every run
(:class:`ClaimResult`). Runs that share a seed share the order of the training batches, so variants are
compared seed by seed (:meth:`ClaimResult.compare`: the paired difference, a t-interval and an exact sign
test, computed here without scipy and tested against it).

The claims and their functions (``CLAIMS`` maps the short names the benchmark uses to them):

* ``tied_qk``, :func:`separate_vs_tied_qk`: one map for queries and keys, ``W_q = W_k``, against two
  (Turner 2023, footnote 9);
* ``batchnorm``, :func:`layernorm_vs_batchnorm`: BatchNorm in place of LayerNorm (Turner fig. 5; Shen
  et al. 2020);
* ``concat``, :func:`added_vs_concatenated`: position codes added to or concatenated with the token
  vectors (Turner footnote 19; Bishop & Bishop 2024 sec. 2.14.1);
* ``norm_position``, :func:`pre_vs_post_norm`: pre-norm against post-norm blocks as depth grows, with
  and without learning-rate warm-up (Bishop eqs. 20-23; Xiong et al. 2020);
* ``scale``, :func:`scaled_vs_unscaled`: attention with and without the ``1/sqrt(d_k)`` scale, and the
  saturation of the softmax it prevents (Bishop sec. 2.10);
* ``length``, :func:`length_generalisation`: positions beyond the training length for sinusoidal,
  learned and no position codes (Bishop sec. 2.14.4); the scheme is an argument, so other chapters can
  add theirs.

Every setting is fixed here, in ``SETTINGS["small"]`` for the book's live runs and the tests and
``SETTINGS["large"]`` for ``bench/claims.py``, whose results the chapter reads (:func:`load_recorded`).
They were fixed before the recorded runs, except three groups of arms added after a first look, to test
a mechanism (BatchNorm at a small batch, concatenation with GPT-2's embedding initialisation, post-norm
from Xavier weights); the functions' docstrings and the chapter say which.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .block import PostNormBlock, PreNormBlock, TransformerStack
from .data import get_batch, tinyshakespeare_text, train_val_split
from .language_models import gpt2_init
from .multihead import SelfAttention, split_heads
from .position import sinusoidal_encoding
from .results import load as load_results
from .runtime import eval_mode, machine
from .tokens import CharTokenizer
from .train import Recipe, TrainConfig, train

__all__ = [
    "CLAIMS",
    "EMBEDDING_STD",
    "LARGE",
    "LR_GRID",
    "POSITION_SCHEMES",
    "SETTINGS",
    "SMALL",
    "AddedPositions",
    "BatchNormBlock",
    "ClaimResult",
    "ClaimsConfig",
    "ClaimsLM",
    "ClaimsRecipe",
    "ConcatenatedPositions",
    "NoPositions",
    "PairedComparison",
    "Run",
    "SinusoidalPositions",
    "TiedQKBlock",
    "TiedQKSelfAttention",
    "TokenBatchNorm",
    "UnscaledBlock",
    "UnscaledSelfAttention",
    "Variant",
    "added_vs_concatenated",
    "at_best_rates",
    "at_rate",
    "attention_maps",
    "best_rates",
    "fc2_gradient_norms",
    "layernorm_vs_batchnorm",
    "length_generalisation",
    "load_lr_grid",
    "load_recorded",
    "loss_by_position",
    "normalised_entropy",
    "paired_t_interval",
    "plot_seeds",
    "pre_vs_post_norm",
    "run_variants",
    "scaled_vs_unscaled",
    "separate_vs_tied_qk",
    "sign_test",
    "student_t_cdf",
    "student_t_quantile",
    "unit_variance_qk_",
    "xavier_linear_",
]

# ---------------------------------------------------------------------------------------------------
# Statistics of paired runs (no scipy: the tests compare each function with scipy.stats)


def _as_float64(values: Sequence[float] | Tensor, name: str) -> Tensor:
    t = torch.as_tensor(values, dtype=torch.float64).flatten()
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} holds NaN or inf ({t.tolist()}); drop diverged runs first")
    return t


def student_t_cdf(t: float, df: int) -> float:
    r"""The Student t distribution's CDF :math:`F_\nu(z)` at ``t`` :math:`= z` for an integer ``df``
    :math:`= \nu \ge 1`, book eq. ``eq-claims-t-cdf``, in closed form (Abramowitz & Stegun 1964,
    26.7.3-4):

    .. math:: \chi = \arctan\frac{|z|}{\sqrt\nu},\qquad
              \Pr(|t| \le |z|) = \begin{cases}
              \frac{2}{\pi}\Big(\chi + \sin\chi\sum_{j=0}^{(\nu-3)/2}
              \frac{(2j)!!}{(2j+1)!!}\cos^{2j+1}\chi\Big) & \nu \text{ odd}\\[4pt]
              \sin\chi \sum_{j=0}^{(\nu-2)/2} \frac{(2j-1)!!}{(2j)!!} \cos^{2j}\chi
              & \nu \text{ even}
              \end{cases},\qquad F_\nu(z) = \tfrac12 + \tfrac12\operatorname{sign}(z)\,\Pr(|t| \le |z|)

    (the code builds the double-factorial ratios as running products). Raises ``ValueError`` for
    ``df < 1`` or a non-integer ``df``.

    Implements: eq-claims-t-cdf
    """
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be an integer >= 1 (n - 1 for n paired seeds), got {df!r}")
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:  # odd
        total, coef, power = 0.0, 1.0, c
        for j in range((df - 1) // 2):
            if j > 0:
                coef *= 2 * j / (2 * j + 1)
            total += coef * power
            power *= c * c
        G = 2.0 / math.pi * (theta + s * total)
    else:  # even
        total, coef, power = 0.0, 1.0, 1.0
        for j in range(df // 2):
            if j > 0:
                coef *= (2 * j - 1) / (2 * j)
            total += coef * power
            power *= c * c
        G = s * total
    return 0.5 + math.copysign(0.5 * G, t)


def student_t_quantile(p: float, df: int) -> float:
    """The ``p``-quantile of Student's t with ``df`` degrees of freedom: the ``t`` with
    :func:`student_t_cdf` ``(t, df) = p``, found by bisection to float64 precision.

    Raises ``ValueError`` unless ``0 < p < 1``.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie strictly between 0 and 1, got {p}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < p:  # bracket the quantile
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if student_t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    return 0.5 * (lo + hi)


def paired_t_interval(
    baseline: Sequence[float] | Tensor, variant: Sequence[float] | Tensor, confidence: float = 0.95
) -> tuple[float, float, float]:
    r"""Mean paired difference and its t-interval, book eq. ``eq-claims-paired-t``:

    .. math:: d_i = y_i - x_i,\quad \bar d = \frac1n\sum_i d_i,\quad
              s_d^2 = \frac{1}{n-1}\sum_i (d_i - \bar d)^2,\quad
              \bar d \pm t_{n-1,\,(1+c)/2}\,\frac{s_d}{\sqrt n}

    with :math:`n` (the book's :math:`n_\text{seeds}`) pairs and confidence :math:`c`,
    ``x`` the baseline's figure and ``y`` the variant's for the same seed ``i``.

    Implements: eq-claims-paired-t

    Returns:
        ``(mean, low, high)``.

    Raises:
        ValueError: for fewer than two pairs, sequences of different lengths, non-finite values, or a
            confidence outside (0, 1).
    """
    x, y = _as_float64(baseline, "baseline"), _as_float64(variant, "variant")
    if x.shape != y.shape:
        raise ValueError(
            f"paired samples need one baseline value per variant value, got {len(x)} and {len(y)}"
        )
    if len(x) < 2:
        raise ValueError(f"a t-interval needs at least 2 pairs, got {len(x)}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    d = y - x  # (n,)
    n = len(d)
    mean = d.mean().item()
    sd = d.std(unbiased=True).item()  # divide by n - 1
    half = student_t_quantile((1.0 + confidence) / 2.0, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def sign_test(baseline: Sequence[float] | Tensor, variant: Sequence[float] | Tensor) -> float:
    r"""Two-sided exact sign test of paired figures, book eq. ``eq-claims-sign``: with :math:`n`
    non-zero differences of which :math:`k` are positive,

    .. math:: p = \min\Big(1,\ 2\sum_{i=0}^{\min(k,\,n-k)} \binom{n}{i}\, 2^{-n}\Big).

    Ties (equal figures) are dropped. With :math:`n` pairs the smallest attainable ``p`` is
    :math:`2^{1-n}` (0.0625 for five seeds). Returns 1.0 when every pair ties.

    Implements: eq-claims-sign
    """
    x, y = _as_float64(baseline, "baseline"), _as_float64(variant, "variant")
    if x.shape != y.shape:
        raise ValueError(
            f"paired samples need one baseline value per variant value, got {len(x)} and {len(y)}"
        )
    d = y - x
    n = int((d != 0).sum())
    if n == 0:
        return 1.0
    k = int((d > 0).sum())
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2**n
    return min(1.0, 2.0 * tail)


# ---------------------------------------------------------------------------------------------------
# Variants: small classes, each tested against its definition in tests/test_claims.py


class TiedQKSelfAttention(SelfAttention):
    r"""Self-attention with one map for queries and keys, :math:`W_k = W_q` (and :math:`b_k = b_q`),
    book eq. ``eq-claims-tied`` (Turner 2023, the symmetric form before his eq. 3 and footnote 9):

    .. math:: S_h = \frac{Q_h Q_h^\top}{\sqrt{d_k}},\qquad Q_h = X W_q^{(h)}

    so every head's scores are symmetric, :math:`S_h = S_h^\top`. ``in_proj`` holds
    ``[W_q^T; W_v^T]`` (``(2D, D)``): the layer has ``D^2 + D`` parameters fewer than
    :class:`.multihead.SelfAttention`, which it equals when that layer's ``W_k`` is set to ``W_q``.
    ``weights`` reports ``W_k = W_q``; :meth:`to_torch` gives the equal ``nn.MultiheadAttention``.
    Loading from a torch module raises ``TypeError`` (it has a separate ``W_k``).

    Implements: eq-claims-tied
    """

    def __init__(
        self, d_model: int, H: int, causal: bool = False, bias: bool = True, dropout: float = 0.0
    ) -> None:
        super().__init__(d_model, H, causal, bias, dropout)
        self.in_proj = nn.Linear(d_model, 2 * d_model, bias=bias)  # [W_q^T; W_v^T]: no W_k

    def project(self, X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        self._check_tokens(X)
        Q, V = self.in_proj(X).split(self.d_model, dim=-1)  # (B, N, D) each
        Q, V = split_heads(Q, self.H), split_heads(V, self.H)  # (B, H, N, d_k)
        return Q, Q, V  # the keys are the queries

    @property
    def weights(self) -> dict[str, Tensor]:
        W_q, W_v = self.in_proj.weight.detach().split(self.d_model, dim=0)
        return {"W_q": W_q.T, "W_k": W_q.T, "W_v": W_v.T, "W_o": self.out_proj.weight.detach().T}

    def load_from_torch(self, module: nn.MultiheadAttention) -> TiedQKSelfAttention:
        raise TypeError(
            "a tied layer has no W_k of its own; copy a torch module into a SelfAttention instead"
        )

    def to_torch(self) -> nn.MultiheadAttention:
        """An ``nn.MultiheadAttention(batch_first=True)`` with ``W_k = W_q`` and this layer's weights."""
        p, b = self.in_proj.weight, self.in_proj.bias
        module = nn.MultiheadAttention(
            self.d_model,
            self.H,
            bias=b is not None,
            batch_first=True,
            device=p.device,
            dtype=p.dtype,
        )
        D = self.d_model
        with torch.no_grad():
            module.in_proj_weight.copy_(torch.cat([p[:D], p[:D], p[D:]]))  # W_q, W_k = W_q, W_v
            module.out_proj.weight.copy_(self.out_proj.weight)
            if b is not None:
                module.in_proj_bias.copy_(torch.cat([b[:D], b[:D], b[D:]]))
                module.out_proj.bias.copy_(self.out_proj.bias)
        return module


class UnscaledSelfAttention(SelfAttention):
    r"""Self-attention without the scale, book eq. ``eq-claims-unscaled``:
    :math:`A_h = \operatorname{softmax}_\text{row}(Q_h K_h^\top)` instead of
    :math:`\operatorname{softmax}_\text{row}(Q_h K_h^\top/\sqrt{d_k})`.

    The package's one attention function always divides by :math:`\sqrt{d_k}`, so this layer hands it
    queries multiplied by :math:`\sqrt{d_k}`: the scores are then exactly :math:`Q_h K_h^\top`, in the
    fused kernel and in :meth:`attention_map` alike. (The same identity shows that the scale can be
    absorbed into :math:`W_q`, as Turner's footnote 8 does; the claim is about training, not about
    what the layer can express.)

    Implements: eq-claims-unscaled
    """

    def project(self, X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        Q, K, V = super().project(X)
        return Q * math.sqrt(self.d_k), K, V  # (sqrt(d_k) Q) K^T / sqrt(d_k) = Q K^T


class TokenBatchNorm(nn.Module):
    r"""BatchNorm of every feature over all tokens of all sequences, book eq. ``eq-block-batchnorm``:
    ``X (..., N, D)`` is normalised as the ``(B N, D)`` matrix of its tokens by ``nn.BatchNorm1d(D)``
    (training mode: the batch's statistics, and running averages are updated; evaluation mode: the
    running averages). ``weight`` and ``bias`` are :math:`\gamma` and :math:`\beta`.

    In a causal model this lets every token see the batch's later tokens through the statistics, in
    training mode only (the chapter measures it).
    """

    def __init__(self, d_model: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(d_model, eps=eps, momentum=momentum)

    @property
    def weight(self) -> nn.Parameter:
        return self.bn.weight

    @property
    def bias(self) -> nn.Parameter:
        return self.bn.bias

    def forward(self, X: Tensor) -> Tensor:
        if X.shape[-1] != self.bn.num_features:
            raise ValueError(
                f"TokenBatchNorm({self.bn.num_features}) got tokens of width {X.shape[-1]} "
                f"(X {tuple(X.shape)})"
            )
        return self.bn(X.reshape(-1, X.shape[-1])).reshape(X.shape)  # (B*N, D) -> (..., N, D)


class TiedQKBlock(PreNormBlock):
    """A pre-norm block whose attention is :class:`TiedQKSelfAttention` (everything else as
    :class:`.block.PreNormBlock`)."""

    def __init__(self, d_model: int, H: int, **kwargs: Any) -> None:
        super().__init__(d_model, H, **kwargs)
        self.attn = TiedQKSelfAttention(
            d_model, H, causal=kwargs.get("causal", False), dropout=kwargs.get("dropout", 0.0)
        )


class UnscaledBlock(PreNormBlock):
    """A pre-norm block whose attention is :class:`UnscaledSelfAttention`."""

    def __init__(self, d_model: int, H: int, **kwargs: Any) -> None:
        super().__init__(d_model, H, **kwargs)
        self.attn = UnscaledSelfAttention(
            d_model, H, causal=kwargs.get("causal", False), dropout=kwargs.get("dropout", 0.0)
        )


class BatchNormBlock(PreNormBlock):
    """A pre-norm block with :class:`TokenBatchNorm` in place of both LayerNorms. ``Norm`` tells
    :class:`ClaimsLM` to use it for the stack's final normalisation too."""

    Norm = TokenBatchNorm

    def __init__(self, d_model: int, H: int, **kwargs: Any) -> None:
        super().__init__(d_model, H, **kwargs)
        eps = kwargs.get("eps", 1e-5)
        self.norm1, self.norm2 = TokenBatchNorm(d_model, eps), TokenBatchNorm(d_model, eps)


# ---------------------------------------------------------------------------------------------------
# Position layers: each maps the token vectors (B, N, d_tok) to X^(0) (B, N, D); d_extra = D - d_tok


class AddedPositions(nn.Module):
    r"""Learned positions added to the tokens, book eq. ``eq-pos-learned``: :math:`X^{(0)} = X + R`,
    ``R`` of ``max_len`` rows (``table.weight``, ``(max_len, D)``).

    Beyond the table a learned code needs a rule. With ``clamp=True`` every position
    ``n >= max_len`` reuses the last row, :math:`\mathbf r_n = \mathbf r_{C-1}`; otherwise such a
    sequence raises ``ValueError``. (A table longer than the training windows is the other rule: its
    extra rows never receive a gradient.)
    """

    d_extra = 0

    def __init__(self, max_len: int, d_model: int, clamp: bool = False) -> None:
        super().__init__()
        self.max_len, self.clamp = max_len, clamp
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, X: Tensor) -> Tensor:
        N = X.shape[-2]
        if N > self.max_len and not self.clamp:
            raise ValueError(
                f"{N} positions but only {self.max_len} learned rows; use clamp=True or a longer table"
            )
        n = torch.arange(N, device=X.device).clamp(max=self.max_len - 1)
        return X + self.table(n)  # (B, N, D) + (N, D)


class ConcatenatedPositions(nn.Module):
    r"""Learned positions concatenated with the tokens, book eq. ``eq-claims-concat``:
    :math:`\mathbf x^{(0)}_n = [\mathbf x_n;\ \mathbf r_n]`, ``R`` of shape ``(max_len, d_pos)``;
    the tokens are ``D - d_pos`` wide, ``X^(0)`` is ``D`` wide (``d_extra = d_pos``).

    Implements: eq-claims-concat
    """

    def __init__(self, max_len: int, d_pos: int) -> None:
        super().__init__()
        self.max_len, self.d_extra = max_len, d_pos
        self.table = nn.Embedding(max_len, d_pos)

    def forward(self, X: Tensor) -> Tensor:
        B, N = X.shape[:-2], X.shape[-2]
        if N > self.max_len:
            raise ValueError(f"{N} positions but only {self.max_len} learned rows")
        R = self.table(torch.arange(N, device=X.device))  # (N, d_pos)
        return torch.cat([X, R.expand(*B, N, self.d_extra)], dim=-1)  # (B, N, d_tok + d_pos)


class SinusoidalPositions(nn.Module):
    r"""Sinusoidal codes added to the tokens, book eq. ``eq-pos-sinusoid``, for any length ``N``
    (computed on the fly by :func:`.position.sinusoidal_encoding`; base :math:`\Omega` = ``base``)."""

    d_extra = 0

    def __init__(self, d_model: int, base: float = 10_000.0) -> None:
        super().__init__()
        self.d_model, self.base = d_model, base

    def forward(self, X: Tensor) -> Tensor:
        R = sinusoidal_encoding(X.shape[-2], self.d_model, self.base, X.device, X.dtype)  # (N, D)
        return X + R


class NoPositions(nn.Module):
    """No position code at all: :math:`X^{(0)} = X` (a causal mask still tells tokens apart by how
    many others each one sees)."""

    d_extra = 0

    def forward(self, X: Tensor) -> Tensor:
        return X


# ---------------------------------------------------------------------------------------------------
# The model every claim trains

EMBEDDING_STD = 2**-0.5
"""Initial standard deviation of every learned embedding table (tokens, positions): the root mean
square of a sinusoidal code's entries, so every kind of position code meets token vectors of its own
size at initialisation."""


@dataclass(frozen=True)
class ClaimsConfig:
    """Sizes of a :class:`ClaimsLM`: ``vocab_size`` :math:`|\\mathcal V|`, ``block_size`` the
    training windows' length :math:`C`, ``max_len`` the longest sequence it must take (default
    :math:`C`; the length claim evaluates on longer ones), ``n_layers`` :math:`L`, ``H`` heads, width
    ``d_model`` :math:`D`, ``d_pos`` the width of a concatenated position code, and
    ``embedding_std`` the initial standard deviation of every embedding table."""

    vocab_size: int = 65
    block_size: int = 64
    max_len: int | None = None
    n_layers: int = 2
    H: int = 4
    d_model: int = 64
    d_pos: int = 16
    embedding_std: float = EMBEDDING_STD

    def __post_init__(self) -> None:
        if self.d_model % self.H:
            raise ValueError(f"d_model={self.d_model} must be divisible by H={self.H}")
        if min(self.vocab_size, self.block_size, self.n_layers, self.H, self.d_pos) < 1:
            raise ValueError(f"every size must be positive: {self}")
        if self.max_len is not None and self.max_len < self.block_size:
            raise ValueError(f"max_len={self.max_len} is shorter than block_size={self.block_size}")

    @property
    def context(self) -> int:
        """The longest sequence the model takes: ``max_len``, or ``block_size`` when not set."""
        return self.max_len or self.block_size


class ClaimsLM(nn.Module):
    r"""The small causal character model of every claim: :math:`X^{(0)} = \mathrm{pos}(E[\mathbf t])`,
    then :math:`L` causal ``block``s (:class:`.block.TransformerStack`, GELU MLPs of width
    :math:`4D`, a final norm for pre-norm blocks), then a linear head to :math:`|\mathcal V|` logits.

    ``forward(idx (B, N), targets (B, N) | None) -> (logits (B, N, |V|), loss | None)``, the loss being
    the mean next-token cross-entropy (book eq. ``eq-lm-loss``).

    Args:
        config: the sizes (:class:`ClaimsConfig`).
        block: the block class (``PreNormBlock`` by default, or a variant); a class attribute ``Norm``
            also replaces the stack's final LayerNorm.
        positions: a position layer (default: :class:`AddedPositions` of ``config.context`` rows);
            its ``d_extra`` features are taken from the token table's width.

    Initialisation: GPT-2's (:func:`.language_models.gpt2_init`, residual projections scaled by
    :math:`1/\sqrt{2L}`), except that every embedding table starts at ``config.embedding_std``
    (:data:`EMBEDDING_STD` unless changed; GPT-2 uses 0.02). The head
    is not tied to the token table (whose width may be less than :math:`D`).
    """

    def __init__(
        self, config: ClaimsConfig, block: type = PreNormBlock, positions: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.config = c = config
        self.positions = (
            positions if positions is not None else AddedPositions(c.context, c.d_model)
        )
        d_tok = c.d_model - getattr(self.positions, "d_extra", 0)
        if d_tok < 1:
            raise ValueError(f"the position code takes all {c.d_model} features; widen d_model")
        self.tok_emb = nn.Embedding(c.vocab_size, d_tok)
        self.stack = TransformerStack(
            block, c.n_layers, c.d_model, c.H, activation="gelu", causal=True
        )
        Norm = getattr(block, "Norm", None)
        if Norm is not None and block.final_norm:
            self.stack.final_norm = Norm(c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(gpt2_init)
        for name, p in self.named_parameters():
            if name.endswith(("out_proj.weight", "fc2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layers))
        for m in self.modules():
            if isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=c.embedding_std)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        if idx.dim() != 2:
            raise ValueError(f"idx must be token ids of shape (B, N), got {tuple(idx.shape)}")
        X = self.positions(self.tok_emb(idx))  # (B, N, D)
        logits = self.lm_head(self.stack(X))  # (B, N, |V|)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def unit_variance_qk_(model: nn.Module) -> nn.Module:
    r"""Re-initialise every self-attention layer's query and key maps with entries
    :math:`\mathcal N(0, 1/D)`, in place: for tokens normalised to unit variance, queries and keys then
    have entries of unit variance, the premise of Bishop's argument for the scale (sec. 2.10).
    Returns ``model``."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, SelfAttention):
                rows = m.in_proj.out_features - m.d_model  # W_q and W_k (W_q alone when tied)
                m.in_proj.weight[:rows].normal_(0.0, 1.0 / math.sqrt(m.d_model))
    return model


def xavier_linear_(model: nn.Module) -> nn.Module:
    r"""Re-initialise every ``nn.Linear`` of ``model`` in place with Glorot & Bengio's uniform
    weights, :math:`\mathcal U(-a, a)` with :math:`a = \sqrt{6/(\text{fan}_\text{in} +
    \text{fan}_\text{out})}`, and zero biases: the initialisation Xiong et al. (2020) analyse, under
    which every branch of a block starts about as large as its input. Returns ``model``."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return model


# ---------------------------------------------------------------------------------------------------
# Measurements


def attention_maps(model: ClaimsLM, idx: Tensor) -> list[Tensor]:
    """Each block's attention weights ``(B, H, N, N)`` for the token ids ``idx`` ``(B, N)``, computed
    by each layer's own :meth:`.multihead.SelfAttention.attention_map` from the input its block hands
    it (evaluation mode, no gradients)."""
    inputs: list[Tensor] = []
    hooks = [
        blk.attn.register_forward_pre_hook(lambda mod, args: inputs.append(args[0]))
        for blk in model.stack.blocks
    ]
    try:
        with eval_mode(model):
            model(idx)
            return [
                blk.attn.attention_map(X) for blk, X in zip(model.stack.blocks, inputs, strict=True)
            ]
    finally:
        for h in hooks:
            h.remove()


def normalised_entropy(A: Tensor) -> Tensor:
    r"""Mean normalised entropy of causal attention rows, book eq. ``eq-claims-entropy``:

    .. math:: \bar{\mathcal H} = \frac{1}{N-1}\sum_{n=2}^{N}
              \frac{-\sum_{m\le n} a_{nm}\log a_{nm}}{\log n}

    (rows counted from 1; row 1 can attend only to itself and is left out). 1 means every query
    spreads its weight evenly over the keys it may see, 0 that each puts all of it on one key.

    Args:
        A: causal weights ``(..., N, N)``, ``N >= 2``. Returns a tensor of shape ``A.shape[:-2]``.

    Implements: eq-claims-entropy
    """
    if A.dim() < 2 or A.shape[-1] != A.shape[-2] or A.shape[-1] < 2:
        raise ValueError(
            f"A must be square causal weights (..., N, N) with N >= 2, got {tuple(A.shape)}"
        )
    N = A.shape[-1]
    plogp = torch.where(A > 0, A * torch.log(A), torch.zeros_like(A))  # 0 log 0 = 0
    H_rows = -plogp.sum(dim=-1)[..., 1:]  # (..., N - 1): rows 2..N
    n_keys = torch.arange(2, N + 1, dtype=A.dtype, device=A.device)  # keys row n may see
    return (H_rows / torch.log(n_keys)).mean(dim=-1)


def _attention_figures(model: ClaimsLM, idx: Tensor, when: str) -> dict[str, Any]:
    maps = attention_maps(model, idx)  # L x (B, H, N, N)
    ent = [normalised_entropy(A).mean().item() for A in maps]
    top = [A[..., 1:, :].amax(dim=-1).mean().item() for A in maps]  # rows 2..N
    diag = [A.diagonal(dim1=-2, dim2=-1)[..., 1:].mean().item() for A in maps]
    return {
        f"entropy_{when}": sum(ent) / len(ent),
        f"max_weight_{when}": sum(top) / len(top),
        f"self_weight_{when}": sum(diag) / len(diag),
        f"entropy_by_layer_{when}": ent,
    }


def fc2_gradient_norms(model: ClaimsLM, idx: Tensor, targets: Tensor) -> list[float]:
    r"""The Frobenius norm of :math:`\partial\mathcal L/\partial W_2^{(\ell)}` (each block's second MLP
    matrix) for one batch, block by block: the quantity whose size at initialisation
    Xiong et al. (2020) bound for post-norm and pre-norm stacks. Gradients are cleared afterwards."""
    model.zero_grad(set_to_none=True)
    model(idx, targets)[1].backward()
    norms = [blk.mlp.fc2.weight.grad.norm().item() for blk in model.stack.blocks]
    model.zero_grad(set_to_none=True)
    return norms


def loss_by_position(model: nn.Module, batches: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
    r"""Mean next-token loss at every position, book eq. ``eq-claims-position-loss``:
    :math:`\mathcal L_n = -\frac{1}{B_\text{val}}\sum_j \log p(t_{j,n+1} \mid t_{j,1..n})` over all
    :math:`B_\text{val}` windows of the ``batches`` (each ``(x, y)`` of shape ``(B, N)``). Returns
    ``(N,)`` float64.

    Implements: eq-claims-position-loss
    """
    total, count = None, 0
    with eval_mode(model):
        for x, y in batches:
            logits = model(x)[0]  # (B, N, |V|)
            nll = F.cross_entropy(logits.transpose(1, 2).float(), y, reduction="none")  # (B, N)
            total = nll.sum(0).double() if total is None else total + nll.sum(0).double()
            count += x.shape[0]
    if total is None:
        raise ValueError("no batches to evaluate")
    return total.cpu() / count


# ---------------------------------------------------------------------------------------------------
# Recipes: every setting, fixed before any result is seen


@dataclass(frozen=True)
class ClaimsRecipe(Recipe):
    """A claim's setting: the model's sizes, the optimisation (``train``: the course's CPU language
    model recipe, AdamW with warm-up over the first tenth of the steps and cosine decay), the batch
    size, the held-out batches, the seeds, the depths of the norm-position claim and the length factor
    of the length claim."""

    model: ClaimsConfig = ClaimsConfig()
    eval_batches: int = 16
    seeds: tuple[int, ...] = (0, 1, 2)
    depths: tuple[int, ...] = (2, 6)
    depth_seeds: tuple[int, ...] = (0, 1, 2)
    length_factor: int = 4


SMALL = ClaimsRecipe(
    model=ClaimsConfig(block_size=32, n_layers=2, H=2, d_model=32, d_pos=8),
    train=TrainConfig(max_steps=60, lr=8e-3, warmup_steps=6, weight_decay=0.1, grad_clip=1.0,
                      eval_interval=30),
    batch_size=16, eval_batches=4, seeds=(0, 1, 2), depths=(2, 4), depth_seeds=(0, 1, 2),
    length_factor=4,
)  # fmt: skip
"""The book's live runs and the tests: a few seconds per claim on two cores."""
LARGE = ClaimsRecipe(
    model=ClaimsConfig(block_size=64, n_layers=2, H=4, d_model=64, d_pos=16),
    train=TrainConfig(max_steps=400, lr=8e-3, warmup_steps=40, weight_decay=0.1, grad_clip=1.0,
                      eval_interval=100),
    batch_size=32, eval_batches=16, seeds=(0, 1, 2, 3, 4), depths=(2, 6), depth_seeds=(0, 1, 2),
    length_factor=4,
)  # fmt: skip
"""``bench/claims.py --setting large``: the recorded runs the chapter concludes from."""
SETTINGS = {"small": SMALL, "large": LARGE}
LR_GRID = (4e-3, 8e-3, 1.6e-2)
"""The learning rates every arm of the large setting is also trained at (``bench/claims.py --lr``):
the recipe's rate and a factor of two either side, a log grid as in a learning-rate sweep. The chapter
compares arms at their own best rate of the three (:func:`at_best_rates`)."""


def at_rate(setting: str | ClaimsRecipe, lr: float) -> ClaimsRecipe:
    """The setting with its peak learning rate replaced by ``lr`` (the schedule's shape unchanged)."""
    if not lr > 0 or not math.isfinite(lr):
        raise ValueError(f"the learning rate must be a positive number, got {lr}")
    recipe = _recipe(setting)
    return dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, lr=lr))


def _setting_name(recipe: ClaimsRecipe) -> str:
    """``large``, or ``large, lr 0.004`` for a named setting at another rate, or ``custom``."""
    for name, named in SETTINGS.items():
        if recipe == named:
            return name
        if recipe == at_rate(named, recipe.train.lr):
            return f"{name}, lr {recipe.train.lr:g}"
    return "custom"


def _recipe(setting: str | ClaimsRecipe) -> ClaimsRecipe:
    if isinstance(setting, ClaimsRecipe):
        return setting
    try:
        return SETTINGS[setting]
    except KeyError:
        raise ValueError(f"unknown setting {setting!r}; choose one of {sorted(SETTINGS)}") from None


def _schedule(recipe: ClaimsRecipe, steps: int | None, warmup: bool, seed: int) -> TrainConfig:
    """The recipe's optimisation for ``steps`` steps; warm-up keeps its share of the steps (or is
    switched off); the held-out loss is evaluated once, at the end."""
    t = recipe.train
    S = t.max_steps if steps is None else steps
    if S < 1:
        raise ValueError(f"steps must be >= 1, got {S}")
    W = max(1, round(t.warmup_steps * S / t.max_steps)) if warmup else 0
    return dataclasses.replace(t, max_steps=S, warmup_steps=W, eval_interval=S, seed=seed)


@functools.lru_cache(maxsize=1)
def _corpus() -> tuple[Tensor, Tensor, int]:
    """Tiny-shakespeare as character ids: the first 90 % for training, the rest held out."""
    text = tinyshakespeare_text()
    tok = CharTokenizer.from_text(text)
    train_ids, val_ids = train_val_split(tok.encode_tensor(text))
    return train_ids, val_ids, tok.vocab_size


def _held_out(length: int, recipe: ClaimsRecipe, device) -> list[tuple[Tensor, Tensor]]:
    """The same ``eval_batches`` held-out windows of ``length`` tokens for every run."""
    _, val_ids, _ = _corpus()
    gen = torch.Generator().manual_seed(1234)
    return [
        get_batch(val_ids, length, recipe.batch_size, gen, device)
        for _ in range(recipe.eval_batches)
    ]


# ---------------------------------------------------------------------------------------------------
# Runs and results


@dataclass
class Run:
    """One training run: the variant, the seed, the final held-out loss (``None`` if the run
    diverged, at step ``diverged_at``), the parameter count, the training seconds, the training loss
    averaged over twenty equal stretches of the steps (``curve``) and the claim's own figures
    (``extra``)."""

    variant: str
    seed: int
    val_loss: float | None
    diverged_at: int | None = None
    params: int = 0
    seconds: float = 0.0
    curve: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str) -> Any:
        """``val_loss``, ``params``, ``seconds`` or a key of ``extra``."""
        if key in ("val_loss", "params", "seconds"):
            return getattr(self, key)
        if key not in self.extra:
            raise KeyError(f"run has no figure {key!r}; it has val_loss, params, seconds, "
                           f"{', '.join(sorted(self.extra))}")  # fmt: skip
        return self.extra[key]


@dataclass(frozen=True)
class PairedComparison:
    """A variant against the baseline, seed by seed (:meth:`ClaimResult.compare`): the per-seed
    differences ``variant - baseline``, their mean, standard deviation, ``confidence`` t-interval,
    the exact sign test's ``p``, and how many seeds came out lower / higher. Seeds where either run
    diverged are left out and listed in ``dropped``."""

    variant: str
    baseline: str
    key: str
    seeds: tuple[int, ...]
    diffs: tuple[float, ...]
    mean: float
    sd: float
    low: float
    high: float
    confidence: float
    p_sign: float
    lower: int
    higher: int
    dropped: tuple[int, ...] = ()

    def describe(self) -> str:
        d = ", ".join(f"{x:+.3f}" for x in self.diffs)
        text = (
            f"{self.variant} - {self.baseline} ({self.key}), per seed: {d}\n"
            f"  mean {self.mean:+.4f}, sd {self.sd:.4f}, {self.confidence:.0%} t-interval "
            f"[{self.low:+.4f}, {self.high:+.4f}]; lower in {self.lower} of {len(self.diffs)} seeds, "
            f"sign test p = {self.p_sign:.3f}"
        )
        if self.dropped:
            text += f"; seeds {list(self.dropped)} left out (a run diverged)"
        return text


@dataclass
class ClaimResult:
    """Every run of one claim, with what it was run on. ``metric`` is the figure the claim is judged
    by (lower is better), ``baseline`` the variant the others are compared with."""

    claim: str
    setting: str
    metric: str
    baseline: str
    variants: list[str]
    runs: list[Run]
    machine: str = ""
    device: str = "cpu"
    seconds: float = 0.0
    recipe: dict[str, Any] = field(default_factory=dict)
    commit: str = ""
    date: str = ""

    def values(self, variant: str, key: str | None = None) -> dict[int, Any]:
        """``{seed: figure}`` of one variant (``None`` for a diverged run's losses)."""
        if variant not in self.variants:
            raise KeyError(f"no variant {variant!r}; this claim has {self.variants}")
        return {r.seed: r.get(key or self.metric) for r in self.runs if r.variant == variant}

    def compare(
        self, variant: str, baseline: str | None = None, key: str | None = None,
        confidence: float = 0.95,
    ) -> PairedComparison:  # fmt: skip
        """``variant`` against ``baseline`` (default: the claim's), seed by seed, on ``key``."""
        baseline, key = baseline or self.baseline, key or self.metric
        x, y = self.values(baseline, key), self.values(variant, key)
        seeds = sorted(set(x) & set(y))
        kept = [s for s in seeds if x[s] is not None and y[s] is not None]
        dropped = tuple(s for s in seeds if s not in kept)
        xs, ys = [x[s] for s in kept], [y[s] for s in kept]
        mean, low, high = paired_t_interval(xs, ys, confidence)
        diffs = [b - a for a, b in zip(xs, ys, strict=True)]
        sd = torch.tensor(diffs, dtype=torch.float64).std().item()
        return PairedComparison(
            variant, baseline, key, tuple(kept), tuple(diffs), mean, sd, low, high, confidence,
            sign_test(xs, ys), sum(d < 0 for d in diffs), sum(d > 0 for d in diffs), dropped,
        )  # fmt: skip

    def table(self, key: str | None = None) -> str:
        """Every seed of every variant, then mean and standard deviation over the seeds."""
        key = key or self.metric
        seeds = sorted({r.seed for r in self.runs})
        width = max(len(key), *(len(v) for v in self.variants)) + 2
        lines = [f"{key:<{width}}" + "".join(f"seed {s:<5}" for s in seeds) + "  mean     sd"]
        for v in self.variants:
            vals = self.values(v, key)
            cells = "".join(
                f"{'diverged':<10}" if vals.get(s) is None else f"{vals[s]:<10.4f}" for s in seeds
            )
            ok = [x for x in vals.values() if x is not None]
            t = torch.tensor(ok, dtype=torch.float64)
            sd = t.std().item() if len(ok) > 1 else float("nan")
            mean = t.mean().item() if ok else float("nan")
            lines.append(f"{v:<{width}}{cells}  {mean:<8.4f} {sd:.4f}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClaimResult:
        data = dict(data)
        data["runs"] = [Run(**r) for r in data["runs"]]
        return cls(**data)


@dataclass(frozen=True)
class Variant:
    """One arm of a claim: its ``name``, a function building the model from the (possibly changed)
    :class:`ClaimsConfig`, changes to that config (``config``, e.g. ``{"n_layers": 6}``), whether
    training warms the learning rate up, and the training batch size (``None``: the recipe's; the
    held-out batches are the same for every arm)."""

    name: str
    build: Callable[[ClaimsConfig], nn.Module]
    config: Mapping[str, Any] = field(default_factory=dict)
    warmup: bool = True
    batch_size: int | None = None


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 5)
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def _curve(losses: list[float], bins: int = 20) -> list[float]:
    if not losses:
        return []
    k = max(1, math.ceil(len(losses) / bins))
    return [
        round(sum(losses[i : i + k]) / len(losses[i : i + k]), 4) for i in range(0, len(losses), k)
    ]


def run_variants(
    claim: str,
    variants: Sequence[Variant],
    setting: str | ClaimsRecipe = "small",
    seeds: Sequence[int] | None = None,
    device: torch.device | str = "cpu",
    steps: int | None = None,
    measure: Callable[[nn.Module, str, ClaimsConfig], dict[str, Any]] | None = None,
    metric: str = "val_loss",
    log: Callable[[str], None] | None = None,
) -> ClaimResult:
    """Train every variant once per seed and collect the runs: the engine of every claim.

    For each seed ``s``: ``torch.manual_seed(s)``, build the variant's model, train it with
    :func:`.train.train` (the training batches drawn from a generator seeded with ``s``, so all
    variants see the same batches), and evaluate the mean loss on the fixed held-out batches.
    ``measure(model, when, config)``, if given, returns figures at ``when = "init"`` (before training)
    and ``"final"``; they go into :attr:`Run.extra`. A run whose loss becomes NaN or inf is recorded
    as diverged, not raised. ``log`` receives one line per run.
    """
    recipe = _recipe(setting)
    seeds = tuple(recipe.seeds if seeds is None else seeds)
    if not seeds or not variants:
        raise ValueError("need at least one seed and one variant")
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"variant names must differ, got {names}")
    train_ids, _, vocab = _corpus()
    device = torch.device(device)
    t_start = time.perf_counter()
    runs = []
    for seed in seeds:
        for v in variants:
            cfg = dataclasses.replace(recipe.model, vocab_size=vocab, **dict(v.config))
            C, B = cfg.block_size, v.batch_size or recipe.batch_size
            held_out = _held_out(C, recipe, device)
            torch.manual_seed(seed)
            model = v.build(cfg).to(device)
            extra: dict[str, Any] = {}
            if measure is not None:
                extra.update(measure(model, "init", cfg))

            def loss_fn(m: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
                return m(*batch)[1]

            def evaluate(m: nn.Module, held_out=held_out) -> dict[str, float]:
                return {"val_loss": sum(loss_fn(m, b).item() for b in held_out) / len(held_out)}

            tcfg = _schedule(recipe, steps, v.warmup, seed)
            diverged_at = None
            try:
                hist = train(model, lambda g, C=C, B=B: get_batch(train_ids, C, B, g, device),
                             loss_fn, tcfg, evaluate, progress=False)  # fmt: skip
                val_loss, losses, seconds = (
                    hist.evals["val_loss"][-1],
                    hist.train_loss,
                    hist.seconds,
                )
            except FloatingPointError as err:
                diverged_at = int(str(err).split(" at step ")[1].split()[0])
                val_loss, losses, seconds = None, [], 0.0
            if diverged_at is None and measure is not None:
                extra.update(measure(model, "final", cfg))
            params = sum(p.numel() for p in model.parameters())
            runs.append(Run(v.name, seed, None if val_loss is None else round(val_loss, 5),
                            diverged_at, params, round(seconds, 3), _curve(losses),
                            {k: _rounded(x) for k, x in extra.items()}))  # fmt: skip
            if log is not None:
                figure = val_loss if metric == "val_loss" else extra.get(metric)
                shown = "diverged" if figure is None else f"{figure:.4f}"
                log(f"{claim} | {v.name} | seed {seed}: {metric}={shown} ({seconds:.1f} s)")
    return ClaimResult(
        claim=claim, setting=_setting_name(recipe),
        metric=metric, baseline=names[0], variants=names, runs=runs, machine=machine(device),
        device=str(device), seconds=round(time.perf_counter() - t_start, 2),
        recipe=json.loads(json.dumps(dataclasses.asdict(recipe) | {"steps": tcfg.max_steps})),
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# The claims


def separate_vs_tied_qk(
    setting: str | ClaimsRecipe = "small", seeds: Sequence[int] | None = None,
    device: torch.device | str = "cpu", steps: int | None = None, log=None,
) -> ClaimResult:  # fmt: skip
    """Claim 1 (Turner 2023, footnote 9): separate query and key maps against one tied map.

    Variants ``separate`` (the baseline, :class:`.block.PreNormBlock`) and ``tied``
    (:class:`TiedQKBlock`). Figures: the held-out loss, and at initialisation and after training the
    mean weight a query puts on its own token (``self_weight_*``) with the attention entropy.
    """
    idx = _held_out(_recipe(setting).model.block_size, _recipe(setting), device)[0][0]

    def measure(model, when, cfg):
        return _attention_figures(model, idx, when)

    return run_variants(
        "tied_qk",
        [Variant("separate", lambda c: ClaimsLM(c)), Variant("tied", lambda c: ClaimsLM(c, TiedQKBlock))],
        setting, seeds, device, steps, measure, log=log,
    )  # fmt: skip


def layernorm_vs_batchnorm(
    setting: str | ClaimsRecipe = "small", seeds: Sequence[int] | None = None,
    device: torch.device | str = "cpu", steps: int | None = None, log=None,
    small_batch: int = 4,
) -> ClaimResult:  # fmt: skip
    """Claim 2 (Turner fig. 5; Shen et al. 2020): LayerNorm against BatchNorm in every pre-norm block
    and the final norm.

    Variants ``layernorm`` (baseline) and ``batchnorm`` (:class:`BatchNormBlock`) at the recipe's
    batch size, and the same two trained on batches of ``small_batch`` windows
    (``layernorm/B{small_batch}``, ``batchnorm/B{small_batch}``), where batch statistics fluctuate
    more: the mechanism Shen et al. blame. The held-out loss is measured in evaluation mode (BatchNorm
    uses its running averages) on the same held-out batches for every arm; ``val_loss_batch_stats`` is
    the same loss with BatchNorm using each held-out batch's own statistics (a copy of the model in
    training mode).
    """
    recipe = _recipe(setting)
    held = _held_out(recipe.model.block_size, recipe, device)

    def measure(model, when, cfg):
        if when != "final":
            return {}
        twin = copy.deepcopy(model).train()  # batch statistics; the copy's running averages move
        with torch.no_grad():
            loss = sum(twin(*b)[1].item() for b in held) / len(held)
        return {"val_loss_batch_stats": loss}

    b = small_batch
    return run_variants(
        "batchnorm",
        [Variant("layernorm", lambda c: ClaimsLM(c)),
         Variant("batchnorm", lambda c: ClaimsLM(c, BatchNormBlock)),
         Variant(f"layernorm/B{b}", lambda c: ClaimsLM(c), batch_size=b),
         Variant(f"batchnorm/B{b}", lambda c: ClaimsLM(c, BatchNormBlock), batch_size=b)],
        setting, seeds, device, steps, measure, log=log,
    )  # fmt: skip


def added_vs_concatenated(
    setting: str | ClaimsRecipe = "small", seeds: Sequence[int] | None = None,
    device: torch.device | str = "cpu", steps: int | None = None, log=None,
) -> ClaimResult:  # fmt: skip
    """Claim 3 (Turner footnote 19; Bishop sec. 2.14.1): learned positions added to the tokens, or
    concatenated with them.

    Variants ``added`` (baseline: width :math:`D`), ``concatenated`` (the same width :math:`D`: tokens
    of :math:`D - d_\\text{pos}` features and positions of :math:`d_\\text{pos}`) and
    ``concatenated_wider`` (tokens of :math:`D` features and :math:`d_\\text{pos}` more for the
    positions, so every later layer is :math:`D + d_\\text{pos}` wide: Bishop's "increase in
    computational cost"). Two more arms repeat ``added`` and ``concatenated`` with GPT-2's
    initialisation of the embedding tables (standard deviation 0.02 instead of
    :data:`EMBEDDING_STD`): ``added/gpt2-init`` and ``concatenated/gpt2-init``. Parameters and training
    seconds are recorded with each run.
    """
    wider = _recipe(setting).model.d_model + _recipe(setting).model.d_pos
    return run_variants(
        "concat",
        [
            Variant("added", lambda c: ClaimsLM(c)),
            Variant("concatenated",
                    lambda c: ClaimsLM(c, positions=ConcatenatedPositions(c.context, c.d_pos))),
            Variant("concatenated_wider",
                    lambda c: ClaimsLM(c, positions=ConcatenatedPositions(c.context, c.d_pos)),
                    config={"d_model": wider}),
            Variant("added/gpt2-init", lambda c: ClaimsLM(c), config={"embedding_std": 0.02}),
            Variant("concatenated/gpt2-init",
                    lambda c: ClaimsLM(c, positions=ConcatenatedPositions(c.context, c.d_pos)),
                    config={"embedding_std": 0.02}),
        ],
        setting, seeds, device, steps, log=log,
    )  # fmt: skip


def pre_vs_post_norm(
    setting: str | ClaimsRecipe = "small", seeds: Sequence[int] | None = None,
    device: torch.device | str = "cpu", steps: int | None = None, log=None,
    depths: Sequence[int] | None = None,
) -> ClaimResult:  # fmt: skip
    """Claim 4 (Bishop eqs. 20-23; Xiong et al. 2020): pre-norm against post-norm blocks at each of
    the recipe's ``depths``, each with and without learning-rate warm-up (``recipe.depth_seeds``).

    Variants are named ``"{pre|post}/L{depth}/{warmup|no-warmup}"``; the baseline is the first,
    ``pre/L{shallowest}/warmup``. At the deepest depth three more arms start from Xavier weights
    (:func:`xavier_linear_`, the initialisation of Xiong et al.'s analysis) instead of GPT-2's:
    ``post/L{deepest}/xavier/warmup``, ``post/L{deepest}/xavier/no-warmup`` and
    ``pre/L{deepest}/xavier/no-warmup``. Each run also records the gradient norms of every block's
    second MLP matrix at initialisation (``grad_norms_init``, :func:`fc2_gradient_norms`).
    """
    recipe = _recipe(setting)
    depths = tuple(recipe.depths if depths is None else depths)
    seeds = recipe.depth_seeds if seeds is None else seeds
    x, y = _held_out(recipe.model.block_size, recipe, device)[0]

    def measure(model, when, cfg):
        return {"grad_norms_init": fc2_gradient_norms(model, x, y)} if when == "init" else {}

    variants = [
        Variant(f"{name}/L{L}/{'warmup' if warm else 'no-warmup'}",
                lambda c, blk=blk: ClaimsLM(c, blk), config={"n_layers": L}, warmup=warm)
        for L in depths
        for name, blk in (("pre", PreNormBlock), ("post", PostNormBlock))
        for warm in (True, False)
    ]  # fmt: skip
    deepest = max(depths)
    variants += [
        Variant(f"{name}/L{deepest}/xavier/{'warmup' if warm else 'no-warmup'}",
                lambda c, blk=blk: xavier_linear_(ClaimsLM(c, blk)),
                config={"n_layers": deepest}, warmup=warm)
        for name, blk, warm in (("post", PostNormBlock, True), ("post", PostNormBlock, False),
                                ("pre", PreNormBlock, False))
    ]  # fmt: skip
    return run_variants("norm_position", variants, recipe, seeds, device, steps, measure, log=log)


def scaled_vs_unscaled(
    setting: str | ClaimsRecipe = "small", seeds: Sequence[int] | None = None,
    device: torch.device | str = "cpu", steps: int | None = None, log=None,
) -> ClaimResult:  # fmt: skip
    """Claim 5 (Bishop sec. 2.10): attention with and without the :math:`1/\\sqrt{d_k}` scale.

    One head (:math:`d_k = D`, the largest the width allows, where the claim bites hardest), with the
    query and key maps initialised so that queries and keys have unit-variance entries
    (:func:`unit_variance_qk_`: the premise of Bishop's argument). Variants ``scaled`` (baseline) and
    ``unscaled`` (:class:`UnscaledBlock`). Figures: the held-out loss, and the attention entropy
    (:func:`normalised_entropy`) and mean largest weight at initialisation and after training.
    """
    recipe = _recipe(setting)
    idx = _held_out(recipe.model.block_size, recipe, device)[0][0]

    def measure(model, when, cfg):
        return _attention_figures(model, idx, when)

    return run_variants(
        "scale",
        [Variant("scaled", lambda c: unit_variance_qk_(ClaimsLM(c)), config={"H": 1}),
         Variant("unscaled", lambda c: unit_variance_qk_(ClaimsLM(c, UnscaledBlock)),
                 config={"H": 1})],
        recipe, seeds, device, steps, measure, log=log,
    )  # fmt: skip


def _sinusoidal(c: ClaimsConfig) -> nn.Module:
    return ClaimsLM(c, positions=SinusoidalPositions(c.d_model))


def _learned(c: ClaimsConfig) -> nn.Module:  # rows beyond the training windows are never trained
    return ClaimsLM(c, positions=AddedPositions(c.context, c.d_model))


def _learned_clamp(c: ClaimsConfig) -> nn.Module:
    return ClaimsLM(c, positions=AddedPositions(c.block_size, c.d_model, clamp=True))


def _no_positions(c: ClaimsConfig) -> nn.Module:
    return ClaimsLM(c, positions=NoPositions())


POSITION_SCHEMES: dict[str, Callable[[ClaimsConfig], nn.Module]] = {
    "sinusoidal": _sinusoidal,
    "learned": _learned,
    "learned_clamp": _learned_clamp,
    "none": _no_positions,
}
"""The position schemes :func:`length_generalisation` knows by name. Each builds a whole model from a
:class:`ClaimsConfig` whose ``block_size`` is the training length :math:`C` and whose ``max_len`` is
the evaluation length. ``"learned"``: a table with a row for every evaluated position, of which
training reaches only the first :math:`C` (the others keep their initial values, shrunk by weight
decay); ``"learned_clamp"``: a table of :math:`C` rows, later positions reuse the last one."""


def length_generalisation(
    positions: str | Callable | Sequence[str | Callable] | Mapping[str, str | Callable] = (
        "sinusoidal", "learned", "learned_clamp", "none"),
    setting: str | ClaimsRecipe = "small", seeds: Sequence[int] | None = None,
    device: torch.device | str = "cpu", steps: int | None = None, log=None,
    factor: int | None = None,
) -> ClaimResult:  # fmt: skip
    """Claim 6 (Bishop sec. 2.14.4): train on windows of :math:`C` tokens, then measure the loss at
    every position of held-out windows ``factor`` times longer (:func:`loss_by_position`).

    Args:
        positions: the scheme(s): a name of :data:`POSITION_SCHEMES`, a callable
            ``scheme(config: ClaimsConfig) -> nn.Module`` building a whole model
            (``model(idx (B, N)) -> (logits (B, N, |V|), ...)`` for every ``N <= config.max_len``;
            e.g. a :class:`ClaimsLM` with a position layer or a block of one's own), a sequence of
            those, or a mapping ``{label: scheme}``. The first is the baseline.
        factor: evaluation length over training length (default: the recipe's ``length_factor``).

    Figures per run: ``loss_in_range`` (mean of :math:`\\ell_n` over the trained positions
    :math:`n < C`), ``loss_beyond`` (over :math:`C \\le n < \\text{factor}\\cdot C`, the claim's
    metric) and ``loss_by_position``.
    """
    recipe = _recipe(setting)
    factor = recipe.length_factor if factor is None else factor
    if factor < 2:
        raise ValueError(f"factor must be >= 2 to reach untrained positions, got {factor}")
    if isinstance(positions, (str, Callable)) and not isinstance(positions, Mapping):
        positions = [positions]
    if not isinstance(positions, Mapping):
        positions = {p if isinstance(p, str) else getattr(p, "__name__", f"scheme{i}"): p
                     for i, p in enumerate(positions)}  # fmt: skip
    schemes = {}
    for label, scheme in positions.items():
        if isinstance(scheme, str):
            if scheme not in POSITION_SCHEMES:
                raise ValueError(
                    f"unknown position scheme {scheme!r}; choose from {sorted(POSITION_SCHEMES)} or "
                    "pass a callable scheme(config) -> model"
                )
            scheme = POSITION_SCHEMES[scheme]
        if not callable(scheme):
            raise TypeError(
                f"scheme {label!r} must be a name or a callable, got {type(scheme).__name__}"
            )
        schemes[label] = scheme
    C = recipe.model.block_size
    long = _held_out(factor * C, recipe, device)

    def measure(model, when, cfg):
        if when != "final":
            return {}
        ell = loss_by_position(model, long)  # (factor * C,)
        return {"loss_in_range": ell[:C].mean().item(), "loss_beyond": ell[C:].mean().item(),
                "loss_by_position": [round(v, 4) for v in ell.tolist()]}  # fmt: skip

    variants = [Variant(label, scheme, config={"max_len": factor * C})
                for label, scheme in schemes.items()]  # fmt: skip
    return run_variants("length", variants, recipe, seeds, device, steps, measure,
                        metric="loss_beyond", log=log)  # fmt: skip


CLAIMS: dict[str, Callable[..., ClaimResult]] = {
    "tied_qk": separate_vs_tied_qk,
    "batchnorm": layernorm_vs_batchnorm,
    "concat": added_vs_concatenated,
    "norm_position": pre_vs_post_norm,
    "scale": scaled_vs_unscaled,
    "length": length_generalisation,
}
"""The claims by the short names ``bench/claims.py --claim`` takes, in the chapter's order."""


# ---------------------------------------------------------------------------------------------------
# Recorded results and a figure


def load_recorded(root: str | pathlib.Path, device: str = "cpu") -> dict[str, ClaimResult]:
    """The recorded runs of ``bench/claims.py``: ``bench/results/<device>/claims.json`` (every claim,
    one run of the script, read by :func:`.results.load`) and any
    ``bench/results/<device>/claims/<name>.json`` (one claim rerun alone, which wins). Each result
    carries the commit and date of its run. Returns ``{}`` when nothing has been recorded."""
    datas = []
    whole = load_results(root, device).get("claims")
    if whole is not None:
        datas.append(whole.data)
    for path in sorted(
        (pathlib.Path(root) / "bench" / "results" / device / "claims").glob("*.json")
    ):
        datas.append(json.loads(path.read_text()))
    found: dict[str, ClaimResult] = {}
    for data in datas:
        for name, result in data["claims"].items():
            found[name] = dataclasses.replace(
                ClaimResult.from_json(result),
                commit=str(data.get("commit", "")), date=str(data.get("date", "")),
            )  # fmt: skip
    return found


def load_lr_grid(
    root: str | pathlib.Path, device: str = "cpu"
) -> dict[str, dict[float, ClaimResult]]:
    """Every recorded learning rate of every claim: ``{claim: {lr: ClaimResult}}``, from the recorded
    runs (:func:`load_recorded`, the recipe's rate) and ``bench/results/<device>/claims-lr/*.json``
    (``bench/claims.py --lr``, one file per rate). The rate is read from each result's recipe."""
    grid: dict[str, dict[float, ClaimResult]] = {}
    for name, result in load_recorded(root, device).items():
        grid.setdefault(name, {})[float(result.recipe["train"]["lr"])] = result
    for path in sorted(
        (pathlib.Path(root) / "bench" / "results" / device / "claims-lr").glob("*.json")
    ):
        data = json.loads(path.read_text())
        for name, raw in data["claims"].items():
            result = dataclasses.replace(
                ClaimResult.from_json(raw), commit=str(data.get("commit", "")),
                date=str(data.get("date", "")),
            )  # fmt: skip
            grid.setdefault(name, {})[float(result.recipe["train"]["lr"])] = result
    return grid


def _mean_or_inf(values: Mapping[int, Any]) -> float:
    """The mean over the seeds, or ``inf`` if any run diverged (a rate that diverges is not best)."""
    if not values or any(v is None for v in values.values()):
        return math.inf
    return sum(values.values()) / len(values)


def best_rates(grid: Mapping[float, ClaimResult], key: str | None = None) -> dict[str, float]:
    """Each variant's best learning rate in ``grid`` (``{lr: ClaimResult}`` of one claim): the rate
    with the lowest mean figure over the seeds, a rate where a run diverged never being chosen. Only
    variants recorded at every rate are ranked; ties go to the smaller rate."""
    results = [grid[lr] for lr in sorted(grid)]
    if not results:
        raise ValueError("the grid is empty: record the claim at some rate first")
    variants = [v for v in results[0].variants if all(v in r.variants for r in results)]
    best = {}
    for v in variants:
        means = {lr: _mean_or_inf(grid[lr].values(v, key)) for lr in sorted(grid)}
        best[v] = min(means, key=lambda lr: (means[lr], lr))
    return best


def at_best_rates(
    grid: Mapping[float, ClaimResult], variant: str, baseline: str, key: str | None = None,
) -> PairedComparison:  # fmt: skip
    """``variant`` at its own best rate against ``baseline`` at its own (:func:`best_rates`), seed by
    seed. The rate is chosen on the same runs that are then compared, so the winner of each arm's
    grid is slightly flattered (both arms equally, when their grids are equally wide)."""
    best = best_rates(grid, key)
    for v in (variant, baseline):
        if v not in best:
            raise KeyError(
                f"{v!r} is not recorded at every rate of {sorted(grid)}; ranked: {sorted(best)}"
            )
    first = grid[best[baseline]]
    runs = [r for r in first.runs if r.variant == baseline] + [
        r for r in grid[best[variant]].runs if r.variant == variant
    ]
    merged = dataclasses.replace(first, variants=[baseline, variant], baseline=baseline, runs=runs)
    return merged.compare(variant, baseline, key)


def plot_seeds(
    result: ClaimResult, key: str | None = None, variants: Sequence[str] | None = None,
    ax=None, labels: Mapping[str, str] | None = None,
):  # fmt: skip
    """Every seed of every variant as a dot, the runs of one seed joined by a grey line (the paired
    design), and each variant's mean with a bar of one standard deviation. Diverged runs are marked
    with an ``x`` at the top of the axes. Returns the axes."""
    import matplotlib.pyplot as plt

    key = key or result.metric
    variants = list(variants or result.variants)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.6 + 1.3 * len(variants), 3.2))
    per = [result.values(v, key) for v in variants]
    seeds = sorted({s for p in per for s in p})
    finite = [x for p in per for x in p.values() if x is not None]
    top = max(finite) if finite else 1.0
    for s in seeds:
        ys = [p.get(s) for p in per]
        xs = [i for i, y in enumerate(ys) if y is not None]
        ax.plot(xs, [ys[i] for i in xs], color="0.75", lw=0.8, zorder=1)
    for i, p in enumerate(per):
        ok = [x for x in p.values() if x is not None]
        ax.scatter([i] * len(ok), ok, s=18, color=f"C{i}", zorder=2)
        if len(ok) < len(p):
            ax.scatter([i] * (len(p) - len(ok)), [top] * (len(p) - len(ok)), marker="x",
                       color="red", zorder=3)  # fmt: skip
        if ok:
            t = torch.tensor(ok, dtype=torch.float64)
            sd = t.std().item() if len(ok) > 1 else 0.0
            ax.errorbar(i + 0.18, t.mean().item(), yerr=sd, fmt="s", color=f"C{i}", ms=5, capsize=3)
    names = [(labels or {}).get(v, v) for v in variants]
    ax.set_xticks(range(len(variants)), names, rotation=20 if len(variants) > 3 else 0)
    ax.set_xlim(-0.5, len(variants) - 0.3)
    ax.set_ylabel(key.replace("_", " "))
    return ax
