"""Extensions: grouped-query and multi-query attention."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..language_models import (
    KVCache,
)
from ..multihead import _check_heads, _check_mask, merge_heads, multi_head_attention, split_heads
from ..runtime import shape_of as _shape
from .rope import RotaryEmbedding


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
