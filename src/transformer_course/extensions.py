"""Extensions: what modern transformers change, each part proven equal to its definition.

Chapter: *Extensions* (it fills the empty "Extensions" section of the Jupyter Book retelling of Turner
2023, and follows Turner's sec. 3 pointer to encodings that bring relative positions into attention).
Each part is a small function or class, with a reference that reads like its equation:

* norms and MLPs: :class:`RMSNorm` (Zhang & Sennrich 2019), gated MLPs and :class:`SwiGLU`
  (Dauphin et al. 2017; Shazeer 2020), sized by :func:`swiglu_hidden` to the GELU MLP's parameters;
* positions inside attention: rotary embeddings (:func:`apply_rope`, :class:`RotaryEmbedding`; Su et
  al. 2024) and linear biases (:func:`alibi_attention`; Press et al. 2022);
* fewer key-value heads: :class:`GroupedQueryAttention` (Shazeer 2019; Ainslie et al. 2023) and the
  size of its cache, :func:`kv_cache_bytes`;
* exact attention in less memory: :func:`online_softmax` (Milakov & Gimelshein 2018) and
  :func:`tiled_attention` (Dao et al. 2022), with :func:`largest_intermediate` and
  :func:`peak_memory` to measure what they save;
* local attention: :func:`sliding_window_mask` for :class:`.multihead.SelfAttention`, and the banded
  :func:`sliding_window_attention`;
* a modern GPT assembled from these parts (:class:`ModernGPT`: RMSNorm, SwiGLU, RoPE, no position
  table; Touvron et al. 2023), reusing the course's pre-norm block, stack, GPT and training loop.

Rows are tokens. Comparisons with PyTorch's own modules that newer versions added (``nn.RMSNorm``
in 2.4, ``enable_gqa`` in 2.5) go through :func:`torch_lacks`, which says why a check is skipped on an
older torch; nothing here requires them.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .block import PreNormBlock, TransformerStack
from .language_models import (
    GPT,
    SHAKESPEARE_CPU_RECIPE,
    GPTConfig,
    KVCache,
    LMRecipe,
    LMRun,
    gpt2_init,
    train_char_lm,
)
from .multihead import _check_heads, _check_mask, merge_heads, multi_head_attention, split_heads
from .runtime import shape_of as _shape
from .self_attention import _check_qkv, _default_scale, causal_mask

__all__ = [
    "MODERN_CPU",
    "MODERN_CPU_RECIPE",
    "GatedMLP",
    "GroupedQueryAttention",
    "ModernBlock",
    "ModernGPT",
    "ModernGPTConfig",
    "RMSNorm",
    "RotaryBlock",
    "RotaryEmbedding",
    "SwiGLU",
    "alibi_attention",
    "alibi_attention_reference",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "apply_rope_complex",
    "apply_rope_halves",
    "apply_rope_reference",
    "gated_mlp_reference",
    "gqa_reference",
    "kv_cache_bytes",
    "largest_intermediate",
    "online_softmax",
    "peak_memory",
    "repeat_kv",
    "rms_norm_reference",
    "rope_frequencies",
    "rope_rotation_matrix",
    "rope_scheme",
    "sliding_window_attention",
    "sliding_window_attention_reference",
    "sliding_window_edges",
    "sliding_window_mask",
    "swiglu_hidden",
    "tiled_attention",
    "torch_lacks",
    "train_modern_lm",
]

# ---------------------------------------------------------------------------------------------------
# Features of newer PyTorch versions, for the comparisons only

_FEATURES = {
    "nn.RMSNorm": ((2, 4), lambda: hasattr(nn, "RMSNorm")),
    "enable_gqa": ((2, 5), None),  # a keyword of F.scaled_dot_product_attention: known by version
}


def _torch_version() -> tuple[int, int]:
    major, minor = str(torch.__version__).split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def torch_lacks(feature: str) -> str | None:
    """``None`` when the installed torch has ``feature`` (``"nn.RMSNorm"``, added in 2.4, or
    ``"enable_gqa"`` of ``F.scaled_dot_product_attention``, added in 2.5); otherwise a sentence saying
    that the comparison with it is skipped, and why. The package never needs either feature."""
    if feature not in _FEATURES:
        raise ValueError(f"unknown feature {feature!r}; known: {sorted(_FEATURES)}")
    since, probe = _FEATURES[feature]
    has = probe() if probe is not None else _torch_version() >= since
    if has:
        return None
    return (
        f"torch {torch.__version__} has no {feature} (added in {since[0]}.{since[1]}); the comparison "
        "with it is skipped, and the package's own implementation is checked against the formula"
    )


# ---------------------------------------------------------------------------------------------------
# RMSNorm


def rms_norm_reference(X: Tensor, gamma: Tensor, eps: float = 1e-5) -> Tensor:
    r"""RMSNorm of every token, book eq. ``eq-ext-rmsnorm`` (Zhang & Sennrich 2019):

    .. math:: \mathrm{RMS}(\mathbf{x}_n) = \sqrt{\tfrac1D \textstyle\sum_d X_{nd}^2 + \epsilon},\qquad
              \mathrm{RMSNorm}(X)_{nd} = \gamma_d\, \frac{X_{nd}}{\mathrm{RMS}(\mathbf{x}_n)}

    LayerNorm without the mean and without ``beta``. ``eps`` sits inside the root, as in
    ``torch.nn.RMSNorm``. Args: ``X`` ``(..., D)``; ``gamma`` ``(D,)``. Raises ``ValueError`` when
    ``gamma`` does not have the tokens' width.
    """
    if gamma.shape != (X.shape[-1],):
        raise ValueError(
            f"gamma has shape {_shape(gamma)} but must be (D,) = ({X.shape[-1]},) for X of shape "
            f"{_shape(X)}"
        )
    rms = torch.sqrt((X**2).mean(dim=-1, keepdim=True) + eps)  # (..., 1): one value per token
    return gamma * X / rms


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain ``gamma`` (``weight``, ``(D,)``), book eq. ``eq-ext-rmsnorm``.

    Computes ``X * rsqrt(mean(X^2) + eps) * gamma``, in float32 for half-precision inputs; it does not
    call ``torch.nn.RMSNorm`` (PyTorch 2.4+), so the book and the tests can compare the two.

    Implements: eq-ext-rmsnorm
    """

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # gamma

    def forward(self, X: Tensor) -> Tensor:
        if X.shape[-1] != self.weight.shape[0]:
            raise ValueError(
                f"RMSNorm({self.weight.shape[0]}) got tokens of width {X.shape[-1]} (X {_shape(X)})"
            )
        Xf = X.float() if X.dtype in (torch.float16, torch.bfloat16) else X
        inv_rms = torch.rsqrt(Xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return (Xf * inv_rms).to(X.dtype) * self.weight


# ---------------------------------------------------------------------------------------------------
# Gated MLPs

GATES: dict[str, Callable[[Tensor], Tensor]] = {
    "sigmoid": torch.sigmoid,  # GLU (Dauphin et al. 2017)
    "relu": F.relu,  # ReGLU
    "gelu": F.gelu,  # GEGLU
    "silu": F.silu,  # SwiGLU: Swish_1(x) = x * sigmoid(x)
    "identity": lambda x: x,  # bilinear
}


def _gate(name: str) -> Callable[[Tensor], Tensor]:
    try:
        return GATES[name]
    except KeyError:
        raise ValueError(
            f"unknown gate activation {name!r}; choose one of {sorted(GATES)}"
        ) from None


def gated_mlp_reference(
    X: Tensor, W_g: Tensor, W_1: Tensor, W_2: Tensor, activation: str = "silu"
) -> Tensor:
    r"""A gated MLP, book eq. ``eq-ext-glu`` (Shazeer 2020, no biases):

    .. math:: \mathrm{MLP}_\text{gated}(X) = \big(\operatorname{act}(X W_g) \odot X W_1\big) W_2

    with the gate ``W_g`` and ``W_1`` ``(D, d_ff)``, ``W_2`` ``(d_ff, D)`` (``W_1, W_2`` as in the plain
    MLP of book eq. ``eq-block-mlp``) and :math:`\odot` the entry-wise product; the activation
    :math:`\operatorname{act}` = SiLU is SwiGLU, sigmoid the original GLU (Dauphin et al. 2017), GELU
    GEGLU, ReLU ReGLU. Shazeer writes ``W`` for the gate and ``V`` for ``W_1``. ``X`` ``(..., D)``.
    """
    if (
        W_g.shape != W_1.shape
        or W_g.shape[0] != X.shape[-1]
        or W_2.shape != (W_g.shape[1], X.shape[-1])
    ):
        raise ValueError(
            f"need W_g, W_1 of shape (D, d_ff) and W_2 of shape (d_ff, D) for X {_shape(X)}; got W_g "
            f"{_shape(W_g)}, W_1 {_shape(W_1)}, W_2 {_shape(W_2)}"
        )
    return (_gate(activation)(X @ W_g) * (X @ W_1)) @ W_2


class GatedMLP(nn.Module):
    """A gated token-wise MLP, book eq. ``eq-ext-glu``: ``fc1`` holds ``[W_g | W_1]`` (one fused matrix
    product, stored transposed as ``nn.Linear`` does), ``fc2`` holds ``W_2``; no biases.

    ``forward(X (..., N, D)) -> (..., N, D)``; :attr:`weights` gives ``W_g, W_1, W_2`` in the book's
    ``X @ W`` convention.

    Implements: eq-ext-glu
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "silu") -> None:
        super().__init__()
        self.d_ff, self.activation, self.act = d_ff, activation, _gate(activation)
        self.fc1 = nn.Linear(d_model, 2 * d_ff, bias=False)  # rows: W_g^T then W_1^T
        self.fc2 = nn.Linear(d_ff, d_model, bias=False)  # W_2^T

    def forward(self, X: Tensor) -> Tensor:
        gate, up = self.fc1(X).chunk(2, dim=-1)  # X W_g, X W_1: (..., N, d_ff) each
        return self.fc2(self.act(gate) * up)  # (..., N, D)

    @property
    def weights(self) -> dict[str, Tensor]:
        W_g_t, W_1_t = self.fc1.weight.detach().split(self.d_ff, dim=0)
        return {"W_g": W_g_t.T, "W_1": W_1_t.T, "W_2": self.fc2.weight.detach().T}


def swiglu_hidden(d_model: int, multiple_of: int = 1) -> int:
    r"""The hidden width that gives a gated MLP the parameters of a ``4D`` two-matrix MLP, book eq.
    ``eq-ext-dff``: :math:`3 D d_\text{ff} = 2 D (4D)`, so :math:`d_\text{ff} = 8D/3`, rounded to the
    nearest integer and then up to a multiple of ``multiple_of`` (Shazeer 2020 scales ``d_ff`` by 2/3;
    LLaMA rounds up to a multiple of 256).

    Implements: eq-ext-dff
    """
    if d_model < 1 or multiple_of < 1:
        raise ValueError(f"need d_model >= 1 and multiple_of >= 1, got {d_model}, {multiple_of}")
    d_ff = round(8 * d_model / 3)
    return multiple_of * -(-d_ff // multiple_of)


class SwiGLU(GatedMLP):
    """The SwiGLU MLP (SiLU gate), sized by :func:`swiglu_hidden` unless ``d_ff`` is given."""

    def __init__(self, d_model: int, d_ff: int | None = None) -> None:
        super().__init__(d_model, d_ff or swiglu_hidden(d_model), "silu")


# ---------------------------------------------------------------------------------------------------
# Rotary position embeddings (RoPE)


def rope_frequencies(d: int, base: float = 10_000.0, device=None) -> Tensor:
    r"""The ``d/2`` frequencies :math:`\omega_i = \Omega^{-2i/d}`, ``i = 0 .. d/2 - 1``: those of the
    sinusoidal code (book eq. ``eq-pos-sinusoid``) at width ``d`` (float64; Su et al. write
    :math:`\theta_i` and count ``i`` from 1). ``d`` must be even: RoPE rotates pairs of features."""
    if d < 2 or d % 2:
        raise ValueError(f"RoPE rotates pairs of features, so d must be even and >= 2, got d={d}")
    i = torch.arange(d // 2, device=device, dtype=torch.float64)
    return base ** (-2.0 * i / d)


def _positions(X: Tensor, positions: Tensor | None) -> Tensor:
    N = X.shape[-2]
    if positions is None:
        return torch.arange(N, device=X.device)
    if positions.shape != (N,):
        raise ValueError(
            f"positions has shape {_shape(positions)} but X {_shape(X)} has N={N} tokens; give one "
            "position per token, shape (N,)"
        )
    return positions.to(X.device)


def rope_rotation_matrix(n: int, d: int, base: float = 10_000.0) -> Tensor:
    r"""The rotation :math:`\Theta_n` ``(d, d)`` of position ``n``, book eq. ``eq-ext-rope``: block
    diagonal, one 2x2 block :math:`\begin{bmatrix}\cos n\omega_i & -\sin n\omega_i\\ \sin n\omega_i &
    \cos n\omega_i\end{bmatrix}` per pair of features ``(2i, 2i+1)`` (Su et al. 2024). Float64.

    Orthogonal, with :math:`\Theta_n^\top\Theta_m = \Theta_{m-n}`: the relative property of book eq.
    ``eq-ext-rope-relative``.

    Implements: eq-ext-rope, eq-ext-rope-relative
    """
    angles = n * rope_frequencies(d, base)  # (d/2,)
    c, s = torch.cos(angles), torch.sin(angles)
    return torch.block_diag(*[torch.stack([torch.stack([c[i], -s[i]]), torch.stack([s[i], c[i]])])
                              for i in range(d // 2)])  # fmt: skip


def apply_rope_reference(
    X: Tensor, positions: Tensor | None = None, base: float = 10_000.0
) -> Tensor:
    r"""RoPE in its rotation form, book eq. ``eq-ext-rope``: token ``n`` is rotated by the matrix of its
    position, :math:`\tilde{\mathbf{x}}_n = \Theta_{p_n} \mathbf{x}_n` (in rows, ``X[n] @ Theta^T``), one
    position at a time.

    Args:
        X: queries or keys ``(..., N, d)``, ``d`` even.
        positions: integer positions ``(N,)``; default ``0 .. N-1``.
    """
    positions = _positions(X, positions)
    rows = [
        X[..., n, :] @ rope_rotation_matrix(int(p), X.shape[-1], base).to(X).T
        for n, p in enumerate(positions.tolist())
    ]
    return torch.stack(rows, dim=-2)  # (..., N, d)


def _angles(X: Tensor, positions: Tensor | None, base: float) -> Tensor:
    positions = _positions(X, positions)
    theta = rope_frequencies(X.shape[-1], base, X.device)  # (d/2,) float64
    return positions.double()[:, None] * theta  # (N, d/2)


def apply_rope_complex(
    X: Tensor, positions: Tensor | None = None, base: float = 10_000.0
) -> Tensor:
    r"""RoPE in its complex form, book eq. ``eq-ext-rope-complex``: each pair ``(x_{2i}, x_{2i+1})`` is
    the complex number :math:`z_i = x_{2i} + \mathrm{i}\,x_{2i+1}`, multiplied by
    :math:`e^{\mathrm{i} p_n \omega_i}` (Su et al. 2024). ``X`` ``(..., N, d)``, float32 or
    float64.

    Implements: eq-ext-rope-complex
    """
    z = torch.view_as_complex(X.reshape(*X.shape[:-1], -1, 2).contiguous())  # (..., N, d/2)
    rotation = torch.polar(torch.ones_like(z.real), _angles(X, positions, base).to(z.real.dtype))
    return torch.view_as_real(z * rotation).flatten(-2)  # (..., N, d)


def apply_rope(X: Tensor, positions: Tensor | None = None, base: float = 10_000.0) -> Tensor:
    r"""RoPE, efficient form (book eq. ``eq-ext-rope-fast``, the form Su et al. 2024 recommend): entry-wise,
    no matrices,

    .. math:: \tilde{\mathbf{x}} = \mathbf{x} \odot \cos\boldsymbol{\phi}
              + \operatorname{rot}(\mathbf{x}) \odot \sin\boldsymbol{\phi},\qquad
              \operatorname{rot}(\mathbf{x}) = (-x_1, x_0, -x_3, x_2, \dots),

    with :math:`\boldsymbol{\phi} = (p\omega_0, p\omega_0, p\omega_1, p\omega_1, \dots)` for a
    token at position ``p``. Pairs are adjacent features ("interleaved", as in Su et al.);
    :func:`apply_rope_halves` is the other common layout.

    Args:
        X: ``(..., N, d)`` with ``d`` even; positions: integers ``(N,)``, default ``0 .. N-1``.

    Returns:
        ``(..., N, d)``, the dtype of ``X`` (angles are computed in float64).

    Implements: eq-ext-rope-fast
    """
    angles = _angles(X, positions, base).repeat_interleave(2, dim=-1)  # (N, d): each angle twice
    x = X.unflatten(-1, (-1, 2))  # (..., N, d/2, 2): the pairs
    rotated = torch.stack((-x[..., 1], x[..., 0]), dim=-1).flatten(-2)  # (..., N, d)
    return X * torch.cos(angles).to(X.dtype) + rotated * torch.sin(angles).to(X.dtype)


def apply_rope_halves(X: Tensor, positions: Tensor | None = None, base: float = 10_000.0) -> Tensor:
    """RoPE with feature ``i`` paired with feature ``i + d/2`` (the layout of GPT-NeoX and Hugging
    Face's LLaMA): the same rotation as :func:`apply_rope` up to a fixed permutation of the features,
    which learned ``W_q, W_k`` absorb (book sec. *Two layouts of the pairs*)."""
    angles = _angles(X, positions, base)
    c, s = torch.cos(angles).to(X.dtype), torch.sin(angles).to(X.dtype)
    x0, x1 = X.chunk(2, dim=-1)  # (..., N, d/2) each
    return torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotates queries or keys ``(B, H, N, d_k)`` by the positions ``start .. start + N - 1``
    (:func:`apply_rope`); no parameters. ``start > 0`` continues a sequence held in a key-value
    cache.

    Implements: eq-ext-rope-fast
    """

    def __init__(self, d_k: int, base: float = 10_000.0) -> None:
        super().__init__()
        rope_frequencies(d_k, base)  # raises for odd d_k
        self.d_k, self.base = d_k, base

    def extra_repr(self) -> str:
        return f"d_k={self.d_k}, base={self.base:g}"

    def forward(self, T: Tensor, start: int = 0) -> Tensor:
        positions = torch.arange(start, start + T.shape[-2], device=T.device)
        return apply_rope(T, positions, self.base)


# ---------------------------------------------------------------------------------------------------
# ALiBi: linear biases


def alibi_slopes(H: int) -> Tensor:
    r"""The head slopes :math:`\xi_h` of ALiBi (Press et al. 2022), float64 ``(H,)``: for ``H`` a power of
    two the geometric sequence :math:`2^{-8h/H}`, ``h = 1 .. H``; otherwise the slopes of the nearest
    smaller power of two followed by every other slope of the next one, as the authors' code does."""
    if H < 1:
        raise ValueError(f"need at least one head, got H={H}")

    def powers(n: int) -> Tensor:
        return 2.0 ** (-8.0 * torch.arange(1, n + 1, dtype=torch.float64) / n)

    p = 2 ** math.floor(math.log2(H))
    return powers(H) if p == H else torch.cat([powers(p), powers(2 * p)[0::2][: H - p]])


def alibi_bias(N: int, slopes: Tensor, M: int | None = None) -> Tensor:
    r"""The additive biases ``(H, N, M)`` of ALiBi, book eq. ``eq-ext-alibi``:
    :math:`-\xi_h\,(n - m)` for query ``n`` and key ``m``, the queries being the last ``N`` of ``M``
    positions. Meant for causal attention: entries with ``m > n`` are masked anyway.

    Implements: eq-ext-alibi
    """
    M = N if M is None else M
    n = torch.arange(M - N, M, dtype=torch.float64, device=slopes.device)[:, None]  # (N, 1)
    m = torch.arange(M, dtype=torch.float64, device=slopes.device)[None, :]  # (1, M)
    return -slopes.double()[:, None, None] * (n - m)  # (H, N, M)


def _check_alibi(Q: Tensor, K: Tensor, V: Tensor, slopes: Tensor) -> None:
    _check_qkv(Q, K, V, None)
    if Q.dim() < 3 or slopes.shape != (Q.shape[-3],):
        raise ValueError(
            f"need Q (..., H, N, d_k) and one slope per head; got Q {_shape(Q)}, slopes "
            f"{_shape(slopes)}"
        )


def alibi_attention_reference(Q: Tensor, K: Tensor, V: Tensor, slopes: Tensor) -> Tensor:
    r"""Causal attention with linear biases, book eq. ``eq-ext-alibi``, one head and one query at a time:

    .. math:: \mathbf{y}_n = \sum_{m \le n} \operatorname{softmax}_m\Big(
              \frac{\mathbf{q}_n^\top\mathbf{k}_m}{\sqrt{d_k}} - \xi_h (n - m)\Big)\, \mathbf{v}_m

    ``Q`` ``(..., H, N, d_k)``, ``K`` ``(..., H, M, d_k)``, ``V`` ``(..., H, M, d_v)``, ``slopes``
    ``(H,)``; the queries are the last ``N`` of ``M`` positions. No position is added to the tokens.
    """
    _check_alibi(Q, K, V, slopes)
    N, M, H = Q.shape[-2], K.shape[-2], Q.shape[-3]
    Y = Q.new_zeros(*Q.shape[:-1], V.shape[-1])
    for h in range(H):
        for n in range(N):
            pos = n + M - N  # the query's position among the keys
            q, k = (
                Q[..., h, n : n + 1, :],
                K[..., h, : pos + 1, :],
            )  # (..., 1, d_k), (..., pos+1, d_k)
            s = q @ k.mT / math.sqrt(Q.shape[-1])  # (..., 1, pos+1)
            s = s - slopes[h].to(Q) * (pos - torch.arange(pos + 1, device=Q.device)).to(Q)
            Y[..., h, n : n + 1, :] = torch.softmax(s, dim=-1) @ V[..., h, : pos + 1, :]
    return Y


def alibi_attention(Q: Tensor, K: Tensor, V: Tensor, slopes: Tensor) -> Tensor:
    """Causal attention with linear biases, book eq. ``eq-ext-alibi``: one fused call of
    ``F.scaled_dot_product_attention`` with the biases and the causal mask as one float mask. Same
    arguments and result as :func:`alibi_attention_reference`.

    Implements: eq-ext-alibi
    """
    _check_alibi(Q, K, V, slopes)
    N, M = Q.shape[-2], K.shape[-2]
    bias = alibi_bias(N, slopes, M).to(Q.dtype)  # (H, N, M)
    bias = bias.masked_fill(~causal_mask(N, M, device=Q.device), float("-inf"))
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=bias)


# ---------------------------------------------------------------------------------------------------
# Grouped-query and multi-query attention


def repeat_kv(T: Tensor, n_rep: int) -> Tensor:
    """``(B, H_kv, M, d) -> (B, H_kv * n_rep, M, d)``: key-value head ``g`` serves query heads
    ``g * n_rep .. (g + 1) * n_rep - 1`` (contiguous groups, as in Ainslie et al. 2023 and
    ``enable_gqa``), so query head ``h`` reads key-value head ``h // n_rep``."""
    return T if n_rep == 1 else T.repeat_interleave(n_rep, dim=-3)


def gqa_reference(
    X: Tensor,
    W_q: Tensor,
    W_k: Tensor,
    W_v: Tensor,
    W_o: Tensor,
    H: int,
    H_kv: int,
    mask: Tensor | None = None,
) -> Tensor:
    r"""Grouped-query attention, book eq. ``eq-ext-gqa``, one head at a time:

    .. math:: \mathrm{head}_h = \operatorname{softmax}_\text{row}\!\Big(\frac{X W_q^{(h)}
              (X W_k^{(g(h))})^\top}{\sqrt{d_k}}\Big) X W_v^{(g(h))},\qquad g(h) = \lceil h H_\text{kv}
              / H\rceil

    with heads counted from 1 (from 0 in the code: key-value head ``h * H_kv // H`` for query head
    ``h``).

    ``X`` ``(..., N, D)``; ``W_q`` ``(D, H d_k)``; ``W_k, W_v`` ``(D, H_kv d_k)``; ``W_o`` ``(H d_k, D)``;
    ``mask`` bool ``(N, N)``. ``H_kv = H`` is multi-head attention, ``H_kv = 1`` multi-query attention.
    """
    D = X.shape[-1]
    _check_heads(D, H)
    if H % H_kv:
        raise ValueError(f"H={H} query heads cannot be split into H_kv={H_kv} equal groups")
    d_k = D // H
    for name, W, cols in (("W_q", W_q, H), ("W_k", W_k, H_kv), ("W_v", W_v, H_kv)):
        if W.shape != (D, cols * d_k):
            raise ValueError(f"{name} has shape {_shape(W)} but must be (D, {cols} d_k) = "
                             f"({D}, {cols * d_k})")  # fmt: skip
    heads = []
    for h in range(H):
        g = h * H_kv // H  # the key-value head of query head h
        q, k, v = (
            X @ W_q[:, h * d_k : (h + 1) * d_k],
            X @ W_k[:, g * d_k : (g + 1) * d_k],
            X @ W_v[:, g * d_k : (g + 1) * d_k],
        )
        S = q @ k.mT / math.sqrt(d_k)  # (..., N, N)
        if mask is not None:
            S = S.masked_fill(~mask, float("-inf"))
        heads.append(torch.softmax(S, dim=-1) @ v)  # (..., N, d_k)
    return torch.cat(heads, dim=-1) @ W_o


class GroupedQueryAttention(nn.Module):
    r"""Self-attention with ``H`` query heads sharing ``H_kv`` key-value heads, book eq.
    ``eq-ext-gqa`` (Shazeer 2019 for ``H_kv = 1``; Ainslie et al. 2023), optionally with rotary
    positions on the queries and keys (book eq. ``eq-ext-rope``).

    ``q_proj`` is ``nn.Linear(D, D)``, ``kv_proj`` is ``nn.Linear(D, 2 H_kv d_k)`` (keys then values),
    ``out_proj`` is ``nn.Linear(D, D)``; no biases by default, as in LLaMA. A
    :class:`.language_models.KVCache` stores only the ``H_kv`` key-value heads, rotated by their own
    positions. ``forward(X (B, N, D), mask (N, M) | (B, N, M) | None, cache) -> (B, N, D)``.

    Args:
        d_model: ``D``; H: query heads; H_kv: key-value heads, dividing ``H`` (default ``H``).
        causal: as :class:`.multihead.SelfAttention`.
        rope: a :class:`RotaryEmbedding` applied to ``Q`` and ``K`` after the projections, or ``None``.

    Implements: eq-ext-gqa
    """

    def __init__(
        self,
        d_model: int,
        H: int,
        H_kv: int | None = None,
        causal: bool = False,
        rope: RotaryEmbedding | None = None,
        bias: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        _check_heads(d_model, H)
        H_kv = H if H_kv is None else H_kv
        if H_kv < 1 or H % H_kv:
            divisors = [g for g in range(1, H + 1) if H % g == 0]
            raise ValueError(f"H_kv={H_kv} must divide H={H}; choose H_kv from {divisors}")
        self.d_model, self.H, self.H_kv, self.d_k = d_model, H, H_kv, d_model // H
        self.causal, self.rope, self.dropout = causal, rope, dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.kv_proj = nn.Linear(d_model, 2 * H_kv * self.d_k, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, H={self.H}, H_kv={self.H_kv}, causal={self.causal}"

    def project(self, X: Tensor, start: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """``Q`` ``(B, H, N, d_k)`` and ``K, V`` ``(B, H_kv, N, d_k)`` of the tokens ``X``, the queries
        and keys rotated by the positions ``start ..`` when the layer has RoPE."""
        if X.dim() != 3 or X.shape[-1] != self.d_model:
            raise ValueError(
                f"X has shape {_shape(X)} but GroupedQueryAttention(d_model={self.d_model}) expects "
                f"(B, N, {self.d_model})"
            )
        Q = split_heads(self.q_proj(X), self.H)  # (B, H, N, d_k)
        K, V = (split_heads(T, self.H_kv) for T in self.kv_proj(X).chunk(2, dim=-1))
        if self.rope is not None:  # positions enter here, after the projections
            Q, K = self.rope(Q, start), self.rope(K, start)
        return Q, K, V

    def forward(
        self, X: Tensor, mask: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor:
        start = len(cache) if cache is not None else 0
        Q, K, V = self.project(X, start)
        if cache is not None:
            K, V = cache.update(K, V)  # (B, H_kv, M, d_k): only H_kv heads are stored
        _check_mask(mask, Q.shape[0], Q.shape[-2], K.shape[-2])
        n_rep = self.H // self.H_kv
        p = self.dropout if self.training else 0.0
        Y = multi_head_attention(Q, repeat_kv(K, n_rep), repeat_kv(V, n_rep), mask, self.causal, p)
        return self.out_proj(merge_heads(Y))  # (B, N, D)

    @property
    def weights(self) -> dict[str, Tensor]:
        """``W_q`` ``(D, D)``, ``W_k, W_v`` ``(D, H_kv d_k)``, ``W_o`` ``(D, D)``, in the ``X @ W``
        convention of :func:`gqa_reference`."""
        W_k, W_v = self.kv_proj.weight.detach().chunk(2, dim=0)
        return {
            "W_q": self.q_proj.weight.detach().T,
            "W_k": W_k.T,
            "W_v": W_v.T,
            "W_o": self.out_proj.weight.detach().T,
        }


def kv_cache_bytes(
    n_layers: int, B: int, H_kv: int, C: int, d_k: int, dtype: torch.dtype = torch.float32
) -> int:
    r"""Bytes of a full key-value cache, book eq. ``eq-ext-kv-bytes``:
    :math:`2 \cdot L \cdot B \cdot H_\text{kv} \cdot C \cdot d_k` numbers (keys and values, every
    layer, sequence, key-value head, position and feature) of ``dtype``'s size.

    Implements: eq-ext-kv-bytes
    """
    return 2 * n_layers * B * H_kv * C * d_k * torch.empty((), dtype=dtype).element_size()


# ---------------------------------------------------------------------------------------------------
# Online softmax and tiled attention


def online_softmax(S: Tensor) -> Tensor:
    r"""Softmax over the last axis computed in one pass over the scores, book eq. ``eq-ext-online``
    (Milakov & Gimelshein 2018): a running maximum :math:`\mu_j` and a running sum :math:`\lambda_j`,

    .. math:: \mu_j = \max(\mu_{j-1}, s_j),\qquad
              \lambda_j = \lambda_{j-1}\, e^{\mu_{j-1} - \mu_j} + e^{s_j - \mu_j},\qquad
              \operatorname{softmax}(\mathbf{s})_j = e^{s_j - \mu_M} / \lambda_M

    with :math:`\mu_0 = -\infty`, :math:`\lambda_0 = 0`. A reference that reads like the recurrence: one
    Python step per score. ``S`` ``(..., M)``, any finite values.

    Implements: eq-ext-online
    """
    mu = torch.full(S.shape[:-1], float("-inf"), dtype=S.dtype, device=S.device)
    lam = torch.zeros(S.shape[:-1], dtype=S.dtype, device=S.device)
    for j in range(S.shape[-1]):
        mu_new = torch.maximum(mu, S[..., j])
        lam = lam * torch.exp(mu - mu_new) + torch.exp(S[..., j] - mu_new)  # rescale, then add
        mu = mu_new
    return torch.exp(S - mu[..., None]) / lam[..., None]


def tiled_attention(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    block_q: int = 64,
    block_k: int = 64,
    causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    r"""Exact softmax attention computed block by block, book eq. ``eq-ext-tiled`` (the tiling of
    FlashAttention, Dao et al. 2022, written in PyTorch).

    For each block of ``block_q`` queries, the key blocks ``j`` update a running row maximum
    :math:`\mu`, a running sum :math:`\lambda` and an unnormalised output :math:`O`:

    .. math:: \mu' = \max(\mu, \operatorname{rowmax} S_j),\quad
              \lambda' = e^{\mu - \mu'}\lambda + \operatorname{rowsum} e^{S_j - \mu'},\quad
              O' = e^{\mu - \mu'} O + e^{S_j - \mu'} V_j,

    and the block's output is :math:`O / \lambda`. Only a ``block_q x block_k`` tile of scores exists at a
    time: the extra memory is :math:`O(N)` for :math:`\mu, \lambda` plus one tile, never ``N x M``.

    Args:
        Q: ``(..., N, d_k)``; K: ``(..., M, d_k)``; V: ``(..., M, d_v)``.
        causal: query ``n`` (the last ``N`` of ``M`` positions) sees keys up to its own position; key
            blocks wholly in its future are skipped.

    Returns:
        ``(..., N, d_v)``, equal to softmax attention up to rounding.

    Implements: eq-ext-tiled
    """
    _check_qkv(Q, K, V, None)
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got block_q={block_q}, block_k={block_k}")
    N, M = Q.shape[-2], K.shape[-2]
    if causal and M < N:
        raise ValueError(f"causal attention needs M >= N keys, got N={N}, M={M}")
    scale = _default_scale(Q, scale)
    out = Q.new_empty(*Q.shape[:-1], V.shape[-1])  # (..., N, d_v)
    for i0 in range(0, N, block_q):
        i1 = min(i0 + block_q, N)
        q = Q[..., i0:i1, :] * scale  # (..., bq, d_k)
        mu = Q.new_full((*Q.shape[:-2], i1 - i0, 1), float("-inf"))  # running max
        lam = Q.new_zeros((*Q.shape[:-2], i1 - i0, 1))  # running sum
        O = Q.new_zeros((*Q.shape[:-2], i1 - i0, V.shape[-1]))  # unnormalised output
        last_key = i1 - 1 + M - N  # the latest key any query of this block may see
        for j0 in range(0, M if not causal else last_key + 1, block_k):
            j1 = min(j0 + block_k, M)
            S = q @ K[..., j0:j1, :].mT  # (..., bq, bk): one tile of scores
            if causal:  # the tile's own part of the causal mask: key m <= query's position
                q_pos = torch.arange(i0, i1, device=Q.device)[:, None] + (M - N)
                S = S.masked_fill(torch.arange(j0, j1, device=Q.device) > q_pos, float("-inf"))
            mu_new = torch.maximum(mu, S.amax(dim=-1, keepdim=True))
            base = torch.where(mu_new == float("-inf"), 0.0, mu_new)  # rows that saw no key yet
            P = torch.exp(S - base)  # (..., bq, bk)
            alpha = torch.exp(mu - base)  # rescales what was summed under the old maximum
            lam = alpha * lam + P.sum(dim=-1, keepdim=True)
            O = alpha * O + P @ V[..., j0:j1, :]
            mu = mu_new
        out[..., i0:i1, :] = O / lam
    return out


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (the profiler's start and stop lines); Python exceptions still pass."""
    try:
        saved = os.dup(2)
    except OSError:  # no real descriptor (an unusual embedding): nothing to silence
        yield
        return
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def peak_memory(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Peak bytes allocated while ``fn()`` runs, above what was allocated before it, measured.

    On CUDA: ``torch.cuda.max_memory_allocated``. On the CPU: ``torch.profiler`` with
    ``profile_memory=True``, replaying every allocation and release it recorded in time order and
    taking the largest total. Inputs that exist before the call are not counted; its result is.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    live = peak = 0
    for e in events:
        live += e.self_cpu_memory_usage  # > 0: allocated by this op; < 0: a release ("[memory]")
        peak = max(peak, live)
    return peak


def largest_intermediate(fn: Callable[[], object]) -> tuple[int, tuple[int, ...], str]:
    """The largest tensor any PyTorch operation produces while ``fn()`` runs: ``(bytes, shape, op)``.

    Counted, not measured: a dispatch mode sees the output of every ATen operation (inside composite
    ones too). For attention it names the tensor that sets the memory: the ``N x M`` scores when they
    are materialised.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    best: list = [0, (), ""]

    class Largest(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, Tensor) and t.numel() * t.element_size() > best[0]:
                    best[:] = [t.numel() * t.element_size(), tuple(t.shape), str(func.__name__)]
            return out

    with Largest():
        fn()
    return best[0], best[1], best[2]


# ---------------------------------------------------------------------------------------------------
# Sliding-window (local) attention


def sliding_window_mask(N: int, w: int, device: torch.device | str | None = None) -> Tensor:
    r"""Bool ``(N, N)`` mask of causal sliding-window attention, book eq. ``eq-ext-window``: query ``n``
    may attend to key ``m`` when :math:`n - w < m \le n`, its own token and the ``w - 1`` before it
    (Child et al. 2019; Beltagy et al. 2020). Pass it as ``mask=`` to
    :class:`.multihead.SelfAttention`.

    Implements: eq-ext-window
    """
    if w < 1:
        raise ValueError(f"the window must hold at least the token itself, got w={w}")
    n = torch.arange(N, device=device)
    offset = n[:, None] - n[None, :]  # (N, N): n - m
    return (offset >= 0) & (offset < w)


def sliding_window_edges(N: int, w: int) -> int:
    r"""Query-key pairs of :func:`sliding_window_mask`, book eq. ``eq-ext-window-cost``:
    :math:`\sum_n \min(n, w) = wN - w(w-1)/2` for :math:`N \ge w` (counting tokens from 1), against
    :math:`N(N+1)/2` for full causal attention.

    Implements: eq-ext-window-cost
    """
    if N < 0 or w < 1:
        raise ValueError(f"need N >= 0 and w >= 1, got N={N}, w={w}")
    return N * (N + 1) // 2 if N <= w else w * N - w * (w - 1) // 2


def sliding_window_attention_reference(Q: Tensor, K: Tensor, V: Tensor, w: int) -> Tensor:
    """Causal sliding-window attention as a banded loop (book eq. ``eq-ext-window``): query ``n``
    attends to keys ``max(0, n - w + 1) .. n`` only, so the loop does ``4 d_k`` FLOPs per edge.
    ``Q, K`` ``(..., N, d_k)``, ``V`` ``(..., N, d_v)``."""
    _check_qkv(Q, K, V, None)
    rows = []
    for n in range(Q.shape[-2]):
        lo = max(0, n - w + 1)
        s = Q[..., n : n + 1, :] @ K[..., lo : n + 1, :].mT / math.sqrt(Q.shape[-1])  # (..., 1, k)
        rows.append(torch.softmax(s, dim=-1) @ V[..., lo : n + 1, :])  # (..., 1, d_v)
    return torch.cat(rows, dim=-2)


def sliding_window_attention(Q: Tensor, K: Tensor, V: Tensor, w: int) -> Tensor:
    """Causal sliding-window attention in ``O(N w)`` time and memory, book eq. ``eq-ext-window``: the
    keys and values are padded with ``w - 1`` rows in front and unfolded into one window per query,
    ``(..., N, w, d)``; the scores are ``(..., N, w)``, never ``N x N``. Same result as
    :func:`sliding_window_attention_reference`.

    Implements: eq-ext-window
    """
    _check_qkv(Q, K, V, None)
    if w < 1:
        raise ValueError(f"the window must hold at least the token itself, got w={w}")
    N = Q.shape[-2]
    Kw = F.pad(K, (0, 0, w - 1, 0)).unfold(-2, w, 1).transpose(-1, -2)  # (..., N, w, d_k)
    Vw = F.pad(V, (0, 0, w - 1, 0)).unfold(-2, w, 1).transpose(-1, -2)  # (..., N, w, d_v)
    S = (Q.unsqueeze(-2) @ Kw.mT).squeeze(-2) / math.sqrt(Q.shape[-1])  # (..., N, w)
    slot = torch.arange(w, device=Q.device)[None, :]  # slot j holds key n - (w - 1) + j
    real = slot >= (w - 1) - torch.arange(N, device=Q.device)[:, None]  # (N, w): not padding
    A = torch.softmax(S.masked_fill(~real, float("-inf")), dim=-1)
    return (A.unsqueeze(-2) @ Vw).squeeze(-2)  # (..., N, d_v)


# ---------------------------------------------------------------------------------------------------
# A modern GPT: RMSNorm, SwiGLU, RoPE, no position table


@dataclass(frozen=True)
class ModernGPTConfig(GPTConfig):
    """Sizes of a :class:`ModernGPT`: a :class:`.language_models.GPTConfig` plus ``H_kv`` key-value
    heads (default ``H``), the SwiGLU width ``d_ff`` (default :func:`swiglu_hidden`), the RoPE base and
    the RMSNorm ``eps``."""

    H_kv: int | None = None
    d_ff: int | None = None
    rope_base: float = 10_000.0
    eps: float = 1e-5

    def __post_init__(self) -> None:
        super().__post_init__()
        H_kv = self.H if self.H_kv is None else self.H_kv
        if H_kv < 1 or self.H % H_kv:
            raise ValueError(f"H_kv={self.H_kv} must divide H={self.H}")
        if (self.d_model // self.H) % 2:
            raise ValueError(
                f"RoPE rotates pairs of features, so d_k = d_model / H = {self.d_model // self.H} "
                "must be even"
            )


class ModernBlock(PreNormBlock):
    """The pre-norm block of :class:`.block.PreNormBlock` (its ``forward`` is inherited unchanged:
    ``Z = X + attn(norm1(X))``, ``Z + mlp(norm2(Z))``) with modern parts: :class:`RMSNorm` for both
    norms, :class:`GroupedQueryAttention` with :class:`RotaryEmbedding` on the queries and keys, and
    a :class:`SwiGLU` MLP; no biases anywhere."""

    def __init__(
        self,
        d_model: int,
        H: int,
        H_kv: int | None = None,
        d_ff: int | None = None,
        rope_base: float = 10_000.0,
        dropout: float = 0.0,
        eps: float = 1e-5,
        causal: bool = True,
    ) -> None:
        nn.Module.__init__(self)  # the parts are not PreNormBlock's: build them here
        rope = RotaryEmbedding(d_model // H, rope_base)
        self.attn = GroupedQueryAttention(d_model, H, H_kv, causal, rope, dropout=dropout)
        self.mlp = SwiGLU(d_model, d_ff)
        self.norm1, self.norm2 = RMSNorm(d_model, eps), RMSNorm(d_model, eps)
        self.drop1, self.drop2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def load_from_torch(self, layer: nn.Module) -> ModernBlock:
        raise TypeError("a ModernBlock has no counterpart in torch.nn to copy weights from")


class RotaryBlock(PreNormBlock):
    """:class:`.block.PreNormBlock` with rotary positions in its attention and nothing else changed
    (LayerNorm, the MLP, biases): the block that isolates RoPE, for the length-generalisation
    experiment of chapter *Claims* (:func:`rope_scheme`)."""

    def __init__(self, d_model: int, H: int, **kwargs) -> None:
        super().__init__(d_model, H, **kwargs)
        rope = RotaryEmbedding(d_model // H, kwargs.get("rope_base", 10_000.0))
        causal, dropout = kwargs.get("causal", False), kwargs.get("dropout", 0.0)
        self.attn = GroupedQueryAttention(d_model, H, None, causal, rope, True, dropout)


def rope_scheme(config) -> nn.Module:
    """RoPE as a position scheme of :func:`.claims.length_generalisation`: a
    :class:`.claims.ClaimsLM` with no position code added to the tokens and :class:`RotaryBlock` s,
    so that it differs from the other schemes only in how positions enter."""
    from .claims import ClaimsLM, NoPositions  # chapter 11's model; imported only when asked for

    return ClaimsLM(config, block=RotaryBlock, positions=NoPositions())


class _NoPositionTable(nn.Module):
    """Stands where a GPT adds its learned positions: RoPE brings positions into attention instead."""

    def forward(self, X: Tensor, start: int = 0) -> Tensor:
        return X


class ModernGPT(GPT):
    r"""A decoder-only language model with the changes of LLaMA (Touvron et al. 2023), book eq.
    ``eq-ext-modern``: :math:`X^{(0)} = E[\mathbf{t}]` (no position table), ``L`` :class:`ModernBlock` s,
    a final :class:`RMSNorm`, the tied head.

    Everything else is :class:`.language_models.GPT`'s: ``forward``, the loss, the key-value caches
    and therefore :func:`.language_models.generate`, ``save`` and ``load``.

    Implements: eq-ext-modern
    """

    config_class = ModernGPTConfig

    def __init__(self, config: ModernGPTConfig) -> None:
        if not isinstance(config, ModernGPTConfig):
            raise TypeError(f"ModernGPT needs a ModernGPTConfig, got {type(config).__name__}")
        nn.Module.__init__(self)
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = _NoPositionTable()
        self.drop = nn.Dropout(c.dropout)
        self.stack = TransformerStack(
            ModernBlock, c.n_layers, c.d_model, c.H, H_kv=c.H_kv, d_ff=c.d_ff,
            rope_base=c.rope_base, dropout=c.dropout, eps=c.eps, causal=True,
        )  # fmt: skip
        self.stack.final_norm = RMSNorm(
            c.d_model, c.eps
        )  # the stack's final norm, RMS like the rest
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(gpt2_init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith(("out_proj.weight", "fc2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layers))


MODERN_CPU = ModernGPTConfig(
    vocab_size=65, block_size=64, n_layers=2, H=4, d_model=128, dropout=0.0
)
"""``SHAKESPEARE_CPU``'s sizes (2 layers, 4 heads, width 128, context 64) with the modern parts."""
MODERN_CPU_RECIPE = LMRecipe(
    model=MODERN_CPU,
    train=SHAKESPEARE_CPU_RECIPE.train,
    batch_size=SHAKESPEARE_CPU_RECIPE.batch_size,
)
"""``SHAKESPEARE_CPU_RECIPE``'s optimisation settings, unchanged, for the modern model."""


def train_modern_lm(
    recipe: LMRecipe = MODERN_CPU_RECIPE,
    device: torch.device | str = "cpu",
    steps: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> LMRun:
    """Train a :class:`ModernGPT` on tiny-shakespeare exactly as
    :func:`.language_models.train_char_lm` trains a GPT (same split, tokenizer, batches, held-out
    windows and loop); only the model class differs. ``recipe.model`` must be a
    :class:`ModernGPTConfig`."""
    if not isinstance(recipe.model, ModernGPTConfig):
        raise TypeError(
            f"train_modern_lm needs recipe.model to be a ModernGPTConfig, got "
            f"{type(recipe.model).__name__}; use language_models.train_char_lm for a GPTConfig"
        )
    return train_char_lm(recipe, device, steps, seed, progress, model_cls=ModernGPT)
