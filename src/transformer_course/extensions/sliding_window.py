"""Extensions: sliding-window (local) attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..self_attention import _check_qkv


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
