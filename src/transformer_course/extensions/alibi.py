"""Extensions: ALiBi: linear biases, and a causal model built with them (a layer, a block and a
position scheme of chapter *Claims*' length experiment)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..block import PreNormBlock
from ..multihead import SelfAttention, merge_heads
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


def alibi_attention(
    Q: Tensor, K: Tensor, V: Tensor, slopes: Tensor, dropout_p: float = 0.0
) -> Tensor:
    """Causal attention with linear biases, book eq. ``eq-ext-alibi``: one fused call of
    ``F.scaled_dot_product_attention`` with the biases and the causal mask as one float mask. Same
    arguments and result as :func:`alibi_attention_reference`; ``dropout_p`` drops attention weights
    (training only: the caller decides).

    Implements: eq-ext-alibi
    """
    _check_alibi(Q, K, V, slopes)
    N, M = Q.shape[-2], K.shape[-2]
    bias = alibi_bias(N, slopes, M).to(Q.dtype)  # (H, N, M)
    bias = bias.masked_fill(~causal_mask(N, M, device=Q.device), float("-inf"))
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=bias, dropout_p=dropout_p)


class ALiBiSelfAttention(SelfAttention):
    r""":class:`.multihead.SelfAttention` whose heads add ALiBi's biases :math:`-\xi_h (n - m)` to
    their scores (book eq. ``eq-ext-alibi``, by :func:`alibi_attention`); the projections, the
    parameters, the key-value cache and ``forward`` are inherited unchanged. Always causal (Press et
    al. define the biases for a causal model); the slopes :func:`alibi_slopes` are a buffer, not
    learned. ``forward(X (B, N, D), mask=None, cache) -> (B, N, D)`` for any ``N``.

    Implements: eq-ext-alibi
    """

    def __init__(
        self, d_model: int, H: int, causal: bool = True, bias: bool = True, dropout: float = 0.0
    ) -> None:
        if not causal:
            raise ValueError(
                "ALiBi's biases -xi_h (n - m) are defined for causal attention (m <= n); build "
                "ALiBiSelfAttention with causal=True, or use SelfAttention for an encoder"
            )
        super().__init__(d_model, H, True, bias, dropout)
        self.register_buffer("slopes", alibi_slopes(H).float(), persistent=False)  # (H,)

    @staticmethod
    def _no_mask(mask: Tensor | None) -> None:
        if mask is not None:
            raise ValueError(
                "ALiBiSelfAttention takes no extra mask (its causal mask and biases are built in); "
                "pass mask=None"
            )

    def attend(self, Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None = None) -> Tensor:
        """Every head attends with its linear biases (the ``N`` queries being the last ``N`` of the
        ``M`` keys, as with a cache), then ``W_o`` mixes the heads: ``(B, N, D)``."""
        self._no_mask(mask)
        p = self.dropout if self.training else 0.0
        Y = alibi_attention(Q, K, V, self.slopes, p)  # (B, H, N, d_k)
        return self.out_proj(merge_heads(Y))  # (B, N, D)

    def weights_of(self, Q: Tensor, K: Tensor, mask: Tensor | None = None) -> Tensor:
        """Every head's attention weights ``(B, H, N, M)``, biases and causal mask included."""
        self._no_mask(mask)
        N, M = Q.shape[-2], K.shape[-2]
        S = Q.detach() @ K.detach().mT / math.sqrt(Q.shape[-1])  # (B, H, N, M)
        S = S + alibi_bias(N, self.slopes, M).to(S)
        return torch.softmax(S.masked_fill(~causal_mask(N, M, device=Q.device), float("-inf")), -1)


class ALiBiBlock(PreNormBlock):
    """:class:`.block.PreNormBlock` with :class:`ALiBiSelfAttention` and nothing else changed
    (LayerNorm, the GELU MLP, biases): the block that isolates ALiBi in the length-generalisation
    experiment of chapter *Claims* (:func:`alibi_scheme`), as :class:`.RotaryBlock` isolates RoPE.
    Always causal: ``causal=False`` is refused."""

    def __init__(self, d_model: int, H: int, **kwargs) -> None:
        kwargs.setdefault("causal", True)
        super().__init__(d_model, H, **kwargs)
        self.attn = ALiBiSelfAttention(
            d_model, H, kwargs["causal"], dropout=kwargs.get("dropout", 0.0)
        )


def alibi_scheme(config) -> nn.Module:
    """ALiBi as a position scheme of :func:`.claims.length_generalisation`: a :class:`.claims.ClaimsLM`
    with no position code added to the tokens and :class:`ALiBiBlock` s, so that it differs from the
    other schemes only in how positions enter. Takes any length (the biases are built per call)."""
    from ..claims import ClaimsLM, NoPositions  # chapter 11's model; imported only when asked for

    return ClaimsLM(config, block=ALiBiBlock, positions=NoPositions())
