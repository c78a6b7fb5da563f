"""Extensions: aLiBi: linear biases."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..runtime import shape_of as _shape
from ..self_attention import _check_qkv, causal_mask


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
