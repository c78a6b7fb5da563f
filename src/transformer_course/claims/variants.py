"""Claims: variants: small classes, each tested against its definition in tests/test_claims.py."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ..block import PreNormBlock
from ..multihead import SelfAttention, split_heads


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
