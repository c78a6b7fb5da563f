"""Multi-head attention: Turner's sum over heads, the concat + W_o form, and the efficient module.

Chapter: *Multi-head self-attention* (Turner 2023 eq. 4-6 and footnote 13; Bishop & Bishop 2024 sec.
2.11 and Algorithm 2; MIT 6.390 sec. 9.4.2). Rows are tokens. With ``H`` heads of width
``d_k = D / H``, head ``h`` uses columns ``h*d_k : (h+1)*d_k`` of ``W_q``, ``W_k``, ``W_v`` (each
``D x D``) and rows ``h*d_k : (h+1)*d_k`` of ``W_o`` (``D x D``).

The signatures are cross-attention ready: queries come from ``X`` (``N`` tokens) and keys and values
from ``Z`` (``M`` tokens), which defaults to ``X`` for self-attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import (
    _shape,
    causal_mask,
    scaled_dot_product_attention,
    scaled_dot_product_attention_reference,
)

__all__ = [
    "KVCache",
    "MultiHeadAttention",
    "merge_heads",
    "multi_head_attention_reference",
    "split_heads",
]


def split_heads(T: Tensor, H: int) -> Tensor:
    """``(..., N, H*d) -> (..., H, N, d)``: give each head its own slice of the features."""
    if T.shape[-1] % H:
        raise ValueError(f"cannot split {T.shape[-1]} features into H={H} equal heads")
    *lead, N, HD = T.shape
    return T.reshape(*lead, N, H, HD // H).transpose(-3, -2)  # (..., H, N, d)


def merge_heads(T: Tensor) -> Tensor:
    """``(..., H, N, d) -> (..., N, H*d)``: concatenate the heads' outputs feature-wise."""
    *lead, H, N, d = T.shape
    return T.transpose(-3, -2).reshape(*lead, N, H * d)  # (..., N, H*d)


def _check_heads(D: int, H: int) -> None:
    if not isinstance(H, int) or H < 1:
        raise ValueError(f"the number of heads H must be a positive int, got {H!r}")
    if D % H:
        divisors = [h for h in range(1, D + 1) if D % h == 0]
        raise ValueError(
            f"d_model D={D} is not divisible by H={H} heads, so heads cannot have equal width "
            f"d_k = D/H; choose H from {divisors}"
        )


def _check_mask_for_heads(mask: Tensor | None, B: tuple[int, ...], N: int, M: int) -> None:
    if mask is None:
        return
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise TypeError("mask must be a bool tensor (True = may attend)")
    if mask.shape not in ((N, M), (*B, N, M)):
        raise ValueError(
            f"mask has shape {_shape(mask)} but must be (N, M) = ({N}, {M}) or {(*B, N, M)}; "
            "one mask is shared by all heads"
        )


def multi_head_attention_reference(
    X: Tensor,
    W_q: Tensor,
    W_k: Tensor,
    W_v: Tensor,
    W_o: Tensor,
    H: int,
    mask: Tensor | None = None,
    Z: Tensor | None = None,
) -> Tensor:
    r"""Multi-head attention, concat form, book eq. ``eq-mh-concat`` (Vaswani et al. 2017; Bishop Alg. 2).

    .. math:: \mathrm{head}_h = \operatorname{softmax}_\text{row}\!\Big(\frac{X W_q^{(h)}
              (Z W_k^{(h)})^\top}{\sqrt{d_k}}\Big) Z W_v^{(h)}, \qquad
              Y = [\mathrm{head}_1, \dots, \mathrm{head}_H]\, W_o

    Written as a loop over heads so that it reads like the equation.

    Args:
        X: queries' tokens ``(..., N, D)``; Z: keys' and values' tokens ``(..., M, D)`` (default ``X``).
        W_q, W_k, W_v: ``(D, D)``; head ``h`` owns columns ``h*d_k:(h+1)*d_k``.
        W_o: ``(D, D)``; head ``h`` owns rows ``h*d_k:(h+1)*d_k``.
        H: number of heads; ``D`` must be divisible by ``H``.
        mask: bool ``(N, M)`` or ``(..., N, M)``, shared by every head.

    Returns:
        ``Y`` of shape ``(..., N, D)``.
    """
    Z = X if Z is None else Z
    D = X.shape[-1]
    _check_heads(D, H)
    for name, W in (("W_q", W_q), ("W_k", W_k), ("W_v", W_v), ("W_o", W_o)):
        if W.shape != (D, D):
            raise ValueError(f"{name} has shape {_shape(W)} but must be (D, D) = ({D}, {D})")
    if Z.shape[-1] != D:
        raise ValueError(f"X has D={D} features but Z has {Z.shape[-1]}; both must have width D")
    d_k = D // H
    heads = []
    for h in range(H):
        cols = slice(h * d_k, (h + 1) * d_k)
        Q_h, K_h, V_h = X @ W_q[:, cols], Z @ W_k[:, cols], Z @ W_v[:, cols]  # (..., N|M, d_k)
        heads.append(scaled_dot_product_attention_reference(Q_h, K_h, V_h, mask))  # (..., N, d_k)
    return torch.cat(heads, dim=-1) @ W_o  # (..., N, H*d_k) @ (D, D) -> (..., N, D)


@dataclass
class KVCache:
    r"""Keys and values already computed for one attention layer, each ``(B, H, t, d_k)`` (Dramko 5.3).

    Self-attention appends the new tokens' keys and values at every step,
    :math:`K_{1:t} = [K_{1:t-1}; K_t]`. A ``static`` cache (cross-attention) is filled once from the
    encoder's output and then only read.
    """

    K: Tensor | None = None
    V: Tensor | None = None
    static: bool = False

    def __len__(self) -> int:
        return 0 if self.K is None else self.K.shape[-2]

    def append(self, K_new: Tensor, V_new: Tensor) -> tuple[Tensor, Tensor]:
        if self.K is None:
            self.K, self.V = K_new, V_new
        else:
            self.K = torch.cat([self.K, K_new], dim=-2)  # (B, H, t, d_k)
            self.V = torch.cat([self.V, V_new], dim=-2)
        return self.K, self.V


class MultiHeadAttention(nn.Module):
    r"""Efficient multi-head attention, book eq. ``eq-mh-concat``; self- or cross-attention.

    Parameters follow ``torch.nn.MultiheadAttention`` so weights copy across directly:
    ``in_proj`` is an ``nn.Linear(D, 3D)`` whose weight stacks ``[W_q^T; W_k^T; W_v^T]`` (``nn.Linear``
    stores ``(out, in)`` and computes ``x @ weight.T``), and ``out_proj`` is ``nn.Linear(D, D)`` holding
    ``W_o^T``. Self-attention uses one fused matmul for Q, K and V; the heads run in one call of
    ``F.scaled_dot_product_attention`` (through :func:`.attention.scaled_dot_product_attention`, so a fully
    masked query row gives zeros, not NaN).

    Args:
        d_model: token width ``D``.
        H: number of heads; ``D`` must be divisible by ``H``.
        bias: learn biases in the projections.
        dropout: dropout probability on the attention weights while training.

    Shapes:
        ``forward(X (B, N, D), Z (B, M, D) | None, mask (N, M) | (B, N, M) | None) -> (B, N, D)``.
        ``causal=True`` masks the future (self-attention only). With a :class:`KVCache`, ``X`` holds
        only the new tokens; their keys and values are appended to the cache and the queries attend to
        every cached position up to their own (a static cache is reused as cross-attention memory).
    """

    def __init__(self, d_model: int, H: int, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        _check_heads(d_model, H)
        self.d_model, self.H, self.d_k, self.dropout = d_model, H, d_model // H, dropout
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        X: Tensor,
        Z: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor:
        if X.dim() != 3 or X.shape[-1] != self.d_model:
            raise ValueError(
                f"X has shape {_shape(X)} but MultiHeadAttention(d_model={self.d_model}) expects "
                f"(B, N, {self.d_model}); add a batch dimension with X.unsqueeze(0) if needed"
            )
        D, H = self.d_model, self.H
        W, b = self.in_proj.weight, self.in_proj.bias
        if cache is not None and cache.static and len(cache):
            Q = F.linear(X, W[:D], None if b is None else b[:D])  # memory K, V already cached
            K, V = cache.K, cache.V
        elif Z is None:
            Q, K, V = F.linear(X, W, b).split(D, dim=-1)  # one matmul: (B, N, D) each
        else:
            if Z.dim() != 3 or Z.shape[0] != X.shape[0] or Z.shape[-1] != D:
                raise ValueError(
                    f"Z has shape {_shape(Z)} but must be (B, M, D) = ({X.shape[0]}, M, {D}) "
                    f"to match X {_shape(X)}"
                )
            Q = F.linear(X, W[:D], None if b is None else b[:D])  # (B, N, D)
            K, V = F.linear(Z, W[D:], None if b is None else b[D:]).split(D, dim=-1)  # (B, M, D)
        Q = split_heads(Q, H)  # (B, H, N, d_k)
        if not (cache is not None and cache.static and len(cache)):
            K, V = split_heads(K, H), split_heads(V, H)  # (B, H, M, d_k)
            if cache is not None:
                K, V = cache.append(K, V)  # (B, H, t + N, d_k)
        B, N, M = X.shape[0], X.shape[1], K.shape[-2]
        _check_mask_for_heads(mask, (B,), N, M)
        p = self.dropout if self.training else 0.0
        if causal and mask is None and N == M:
            Y = scaled_dot_product_attention(Q, K, V, causal=True, dropout_p=p)  # fused path
        elif causal and mask is None and N == 1 and Z is None:
            # one new query at the last position: the causal mask row is all True, so skip it
            Y = scaled_dot_product_attention(Q, K, V, dropout_p=p)
        else:
            if causal:
                if Z is not None:
                    raise ValueError("causal=True is for self-attention; do not pass Z with it")
                future = causal_mask(N, M, device=X.device)  # queries are the last N positions
                mask = future if mask is None else mask & future
            if mask is not None and mask.dim() == 3:
                mask = mask[:, None].expand(B, H, N, M)  # the same mask for every head
            Y = scaled_dot_product_attention(Q, K, V, mask, dropout_p=p)  # (B, H, N, d_k)
        return self.out_proj(merge_heads(Y))  # (B, N, D)

    @property
    def weights(self) -> dict[str, Tensor]:
        """``W_q, W_k, W_v, W_o`` as ``(D, D)`` matrices in the course's ``X @ W`` convention."""
        W_q, W_k, W_v = self.in_proj.weight.detach().split(self.d_model, dim=0)
        return {"W_q": W_q.T, "W_k": W_k.T, "W_v": W_v.T, "W_o": self.out_proj.weight.detach().T}

    def load_from_torch(self, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """Copy the weights of a ``torch.nn.MultiheadAttention`` (same ``D``, ``H``, bias) into this one."""
        if module.embed_dim != self.d_model or module.num_heads != self.H:
            raise ValueError(
                f"torch module has embed_dim={module.embed_dim}, num_heads={module.num_heads}; "
                f"this one has d_model={self.d_model}, H={self.H}"
            )
        if not module._qkv_same_embed_dim:
            raise ValueError("only torch modules with kdim == vdim == embed_dim can be copied")
        with torch.no_grad():
            self.in_proj.weight.copy_(module.in_proj_weight)
            self.out_proj.weight.copy_(module.out_proj.weight)
            if self.in_proj.bias is not None:
                self.in_proj.bias.copy_(module.in_proj_bias)
                self.out_proj.bias.copy_(module.out_proj.bias)
        return self

    def to_torch(self) -> nn.MultiheadAttention:
        """A ``torch.nn.MultiheadAttention(batch_first=True)`` with this module's weights."""
        bias = self.in_proj.bias is not None
        p = self.in_proj.weight
        module = nn.MultiheadAttention(
            self.d_model,
            self.H,
            bias=bias,
            batch_first=True,
            dropout=self.dropout,
            device=p.device,
            dtype=p.dtype,
        )
        with torch.no_grad():
            module.in_proj_weight.copy_(self.in_proj.weight)
            module.out_proj.weight.copy_(self.out_proj.weight)
            if bias:
                module.in_proj_bias.copy_(self.in_proj.bias)
                module.out_proj.bias.copy_(self.out_proj.bias)
        return module
