"""Multi-head attention: the concat + W_o form, one function over split heads, and the self-attention layer.

Chapter: *Multi-head self-attention* (Vaswani et al. 2017; the lecture notes on Bishop & Bishop 2024,
``bishop2024notes``, sec. 2.11 and Algorithm 2 in their own numbering; MIT 6.390 sec. 9.4.2; Turner
2023 eq. 4-6 and footnote 13, whose sum-over-heads form is in :mod:`.notation`). Rows are tokens. With
``H`` heads, queries and keys of width ``d_k`` and values of width ``d_v``, head ``h`` (counted from 0
in code) uses columns ``h*d_k : (h+1)*d_k`` of ``W_q`` and ``W_k`` (``D x H d_k``), columns
``h*d_v : (h+1)*d_v`` of ``W_v`` (``D x H d_v``) and the same rows of ``W_o`` (``H d_v x D``). The
layers use the usual ``d_k = d_v = D / H``, so all four are ``D x D``.

One function, :func:`multi_head_attention`, attends with given queries, keys and values; the layers
only compute those and merge the heads afterwards. Each layer has one role:

* :class:`SelfAttention` (this chapter): queries, keys and values from the same tokens; causal or not,
  decided when it is built; optionally a key-value cache (chapter *Autoregressive language models*,
  :class:`.language_models.KVCache`).
* :class:`.encoder_decoder.CrossAttention` (chapter *Encoder-decoder*): queries from one sequence, keys
  and values from another, computed once per source sequence.

Both keep the parameter layout of ``torch.nn.MultiheadAttention`` (:class:`AttentionLayer`), so weights
copy across both ways and the tests prove the layers equal to PyTorch's. The from-scratch layer a learner
types is ``transformer_course/scratch/attention.py``; this module is its hardened version.

The chapter's small task, where one head is not enough (:func:`colour_shape_tokens`,
:func:`colour_shape_target`), lives here too, so that the chapter and its *Going deeper* page share it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from .self_attention import (
    _default_scale,
    _shape,
    attend,
    attention_weights,
    causal_mask,
    scaled_dot_product_attention_reference,
)

if TYPE_CHECKING:  # the cache is taught in chapter 7; only its type is needed here
    from .kv_cache import KVCache

__all__ = [
    "KINDS",
    "AttentionLayer",
    "SelfAttention",
    "colour_shape_sequence",
    "colour_shape_target",
    "colour_shape_tokens",
    "merge_heads",
    "multi_head_attention",
    "multi_head_attention_reference",
    "split_heads",
]


def split_heads(T: Tensor, H: int) -> Tensor:
    """``(..., N, H*d) -> (..., H, N, d)``: give each head its own slice of the features.

    Implements: eq-mh-split
    """
    if T.shape[-1] % H:
        raise ValueError(f"cannot split {T.shape[-1]} features into H={H} equal heads")
    *lead, N, HD = T.shape
    return T.reshape(*lead, N, H, HD // H).transpose(-3, -2)  # (..., H, N, d)


def merge_heads(T: Tensor) -> Tensor:
    """``(..., H, N, d) -> (..., N, H*d)``: concatenate the heads' outputs feature-wise."""
    *lead, H, N, d = T.shape
    return T.transpose(-3, -2).reshape(*lead, N, H * d)  # (..., N, H*d)


def _check_heads(D: int, H: int) -> None:
    if isinstance(H, bool) or not isinstance(H, int) or H < 1:
        raise ValueError(f"the number of heads H must be a positive int, got {H!r}")
    if D % H:
        divisors = [h for h in range(1, D + 1) if D % h == 0]
        raise ValueError(
            f"d_model D={D} is not divisible by H={H} heads, so heads cannot have equal width "
            f"d_k = D/H; choose H from {divisors}"
        )


def _check_mask(mask: Tensor | None, B: int, N: int, M: int) -> None:
    if mask is None:
        return
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise TypeError("mask must be a bool tensor (True = may attend)")
    if mask.shape not in ((N, M), (B, N, M)):
        raise ValueError(
            f"mask has shape {_shape(mask)} but must be (N, M) = ({N}, {M}) or (B, N, M) = "
            f"({B}, {N}, {M}); one mask is shared by all heads"
        )


def _head_widths(
    X: Tensor, Z: Tensor, W_q: Tensor, W_k: Tensor, W_v: Tensor, W_o: Tensor, H: int
) -> tuple[int, int]:
    """``(d_k, d_v)`` of the weights of :func:`multi_head_attention_reference`, or a ``ValueError``
    that says which shape is wrong."""
    if isinstance(H, bool) or not isinstance(H, int) or H < 1:
        raise ValueError(f"the number of heads H must be a positive int, got {H!r}")
    D = X.shape[-1]
    if Z.shape[-1] != D:
        raise ValueError(f"X has D={D} features but Z has {Z.shape[-1]}; both must have width D")
    for name, W in (("W_q", W_q), ("W_k", W_k), ("W_v", W_v)):
        if W.dim() != 2 or W.shape[0] != D or W.shape[1] % H:
            raise ValueError(
                f"{name} has shape {_shape(W)} but must be (D, H*d) = ({D}, {H}*d): D rows and "
                f"one block of d columns per head"
            )
    if W_k.shape != W_q.shape:
        raise ValueError(f"W_k {_shape(W_k)} and W_q {_shape(W_q)} must have the same shape")
    if W_o.shape != (W_v.shape[1], D):
        raise ValueError(
            f"W_o has shape {_shape(W_o)} but must be (H*d_v, D) = ({W_v.shape[1]}, {D}): one row per "
            "feature of the concatenated heads"
        )
    return W_q.shape[1] // H, W_v.shape[1] // H


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
    r"""Multi-head attention in the concat form, a loop over heads (Vaswani et al. 2017).

    Implements: eq-mh-heads, eq-mh-concat

    Args:
        X: the queries' tokens ``(..., N, D)``; Z: the keys' and values' tokens ``(..., M, D)``
            (default ``X``: self-attention; another sequence: cross-attention).
        W_q, W_k: ``(D, H*d_k)``; W_v: ``(D, H*d_v)``; W_o: ``(H*d_v, D)`` (usually all ``D x D``).
        H: number of heads. mask: bool ``(N, M)`` or ``(..., N, M)``, shared by every head.

    Returns:
        ``Y`` of shape ``(..., N, D)``.
    """
    Z = X if Z is None else Z
    d_k, d_v = _head_widths(X, Z, W_q, W_k, W_v, W_o, H)  # checks every shape
    heads = []
    for h in range(H):  # head h (from 0) owns one block of columns of W_q, W_k and of W_v
        qk, v = slice(h * d_k, (h + 1) * d_k), slice(h * d_v, (h + 1) * d_v)
        Q_h, K_h, V_h = X @ W_q[:, qk], Z @ W_k[:, qk], Z @ W_v[:, v]  # (..., N|M, d_k|d_v)
        heads.append(scaled_dot_product_attention_reference(Q_h, K_h, V_h, mask))  # (..., N, d_v)
    return torch.cat(heads, dim=-1) @ W_o  # (..., N, H*d_v) @ (H*d_v, D) -> (..., N, D)


def multi_head_attention(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    r"""Every head attends at once: the one function behind every layer.

    Implements: eq-mh-heads

    .. math:: \mathrm{head}_h = \operatorname{softmax}_\text{row}\!\Big(
              \frac{Q_h K_h^\top}{\sqrt{d_k}} + \log[\mathsf{mask}]\Big) V_h

    Args:
        Q: ``(B, H, N, d_k)`` queries, heads already split (:func:`split_heads`).
        K: ``(B, H, M, d_k)``; V: ``(B, H, M, d_v)``.
        mask: bool ``(N, M)`` or ``(B, N, M)``, ``True`` = may attend, the same for every head.
        causal: the ``N`` queries are the last ``N`` of the ``M`` positions and see no later key
            (:func:`.self_attention.causal_mask`); combined with ``mask`` when both are given.
        dropout_p: dropout on the attention weights (training only; the caller decides).

    Returns:
        ``(B, H, N, d_v)``. A query that may attend to nothing gets zeros.

    The shapes are the callers' to check (the layers do, once); PyTorch's fused kernel does the work.
    """
    N, M = Q.shape[-2], K.shape[-2]
    scale = _default_scale(Q, None)
    if causal and mask is None and N == M:
        return attend(Q, K, V, None, scale, dropout_p, causal=True)  # PyTorch's is_causal fast path
    if causal and not (mask is None and N == 1):  # a single last query may see every key: no mask
        future = causal_mask(N, M, device=Q.device)  # (N, M)
        mask = future if mask is None else mask & future
    if mask is not None and mask.dim() == 3:
        mask = mask[:, None]  # (B, 1, N, M): the same mask for every head
    return attend(Q, K, V, mask, scale, dropout_p)


class AttentionLayer(nn.Module):
    r"""Parameters of a multi-head attention layer in ``torch.nn.MultiheadAttention``'s layout.

    ``in_proj`` is an ``nn.Linear(D, 3D)`` whose weight stacks ``[W_q^T; W_k^T; W_v^T]`` (``nn.Linear``
    stores ``(out, in)`` and computes ``x @ weight.T``); ``out_proj`` is ``nn.Linear(D, D)`` holding
    ``W_o^T``. :meth:`attend` is the part both layers share; :class:`SelfAttention` and
    :class:`.encoder_decoder.CrossAttention` compute the queries, keys and values their own way.

    Args:
        d_model: token width ``D``.
        H: number of heads; ``D`` must be divisible by ``H``.
        bias: learn biases in the projections.
        dropout: dropout probability on the attention weights while training.
    """

    causal = False  # SelfAttention(causal=True) masks the future; cross-attention never does

    def __init__(self, d_model: int, H: int, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        _check_heads(d_model, H)
        self.d_model, self.H, self.d_k, self.dropout = d_model, H, d_model // H, dropout
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _check_tokens(self, X: Tensor, name: str = "X") -> None:
        if not isinstance(X, Tensor) or X.dim() != 3 or X.shape[-1] != self.d_model:
            got = _shape(X) if isinstance(X, Tensor) else type(X).__name__
            raise ValueError(
                f"{name} has shape {got} but {type(self).__name__}(d_model={self.d_model}) expects "
                f"(B, N, {self.d_model}); add a batch dimension with {name}.unsqueeze(0) if needed"
            )

    def attend(self, Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None = None) -> Tensor:
        """Every head attends (book eq. ``eq-mh-heads``), then ``W_o`` mixes the concatenated heads.

        ``Q (B, H, N, d_k)``, ``K, V (B, H, M, d_k)``, ``mask (N, M) | (B, N, M) | None`` ->
        ``(B, N, D)``.
        """
        _check_mask(mask, Q.shape[0], Q.shape[-2], K.shape[-2])
        p = self.dropout if self.training else 0.0
        Y = multi_head_attention(Q, K, V, mask, self.causal, p)  # (B, H, N, d_k)
        return self.out_proj(merge_heads(Y))  # (B, N, D): W_o after the concatenation

    def weights_of(self, Q: Tensor, K: Tensor, mask: Tensor | None = None) -> Tensor:
        """Every head's attention weights ``A_h`` ``(B, H, N, M)`` for these queries and keys, with the
        layer's mask rules; the fused kernel of :meth:`attend` never forms them, so figures and
        analyses recompute them here (by :func:`.self_attention.attention_weights`)."""
        _check_mask(mask, Q.shape[0], Q.shape[-2], K.shape[-2])
        N, M = Q.shape[-2], K.shape[-2]
        if self.causal:
            future = causal_mask(N, M, device=Q.device)
            mask = future if mask is None else mask & future
        if mask is not None:
            mask = (mask if mask.dim() == 3 else mask.expand(Q.shape[0], N, M))[:, None]
            mask = mask.expand(*Q.shape[:2], N, M)  # (B, H, N, M), explicit
        return attention_weights(Q.detach(), K.detach(), mask)

    @property
    def weights(self) -> dict[str, Tensor]:
        """``W_q, W_k, W_v, W_o`` as ``(D, D)`` matrices in the course's ``X @ W`` convention
        (``W_o`` is ``H d_v x D`` with ``d_v = D / H``)."""
        W_q, W_k, W_v = self.in_proj.weight.detach().split(self.d_model, dim=0)
        return {"W_q": W_q.T, "W_k": W_k.T, "W_v": W_v.T, "W_o": self.out_proj.weight.detach().T}

    def load_from_torch(self, module: nn.MultiheadAttention) -> AttentionLayer:
        """Copy the weights of a ``torch.nn.MultiheadAttention`` (same ``D``, ``H``, bias) into this one."""
        if module.embed_dim != self.d_model or module.num_heads != self.H:
            raise ValueError(
                f"torch module has embed_dim={module.embed_dim}, num_heads={module.num_heads}; "
                f"this one has d_model={self.d_model}, H={self.H}"
            )
        if not module._qkv_same_embed_dim:
            raise ValueError("only torch modules with kdim == vdim == embed_dim can be copied")
        if (module.in_proj_bias is None) != (self.in_proj.bias is None):
            raise ValueError("one module has biases and the other has none; build both alike")
        with torch.no_grad():
            self.in_proj.weight.copy_(module.in_proj_weight)
            self.out_proj.weight.copy_(module.out_proj.weight)
            if self.in_proj.bias is not None:
                self.in_proj.bias.copy_(module.in_proj_bias)
                self.out_proj.bias.copy_(module.out_proj.bias)
        return self

    def to_torch(self) -> nn.MultiheadAttention:
        """A ``torch.nn.MultiheadAttention(batch_first=True)`` with this layer's weights."""
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


class SelfAttention(AttentionLayer):
    r"""Multi-head self-attention: queries, keys and values from the same tokens. A causal layer
    combines a given key mask with its causal mask by a logical *and* (book eq. ``eq-ed-decmask``).
    With a :class:`KVCache`, one step appends its keys and values and attends over the cache.

    Implements: eq-mh-concat, eq-lm-kv-step

    ``forward(X (B, N, D), mask (N, N) | (B, N, N) | None) -> (B, N, D)``. Queries, keys and values
    all come from ``X`` through one fused matrix product; the heads attend in one call of
    :func:`multi_head_attention`; ``W_o`` mixes the concatenated heads.

    Args:
        d_model, H, bias, dropout: as :class:`AttentionLayer`.
        causal: token ``n`` attends only to tokens ``m <= n`` (chapter *Autoregressive language
            models*). Fixed when the layer is built: a decoder layer is causal, an encoder layer is not.

    With a :class:`.language_models.KVCache` (``cache=``), ``X`` holds only the new tokens; their keys
    and values are written into the cache and the queries attend to every cached position up to their
    own.
    """

    def __init__(
        self, d_model: int, H: int, causal: bool = False, bias: bool = True, dropout: float = 0.0
    ) -> None:
        super().__init__(d_model, H, bias, dropout)
        self.causal = causal

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, H={self.H}, causal={self.causal}"

    def project(self, X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of the tokens ``X (B, N, D)``, book eqs. ``eq-sa-qkv`` and
        ``eq-mh-split``: one fused
        matrix product, then each head's slice of the features; ``(B, H, N, d_k)`` each."""
        self._check_tokens(X)
        Q, K, V = self.in_proj(X).split(self.d_model, dim=-1)  # one matmul: (B, N, D) each
        return split_heads(Q, self.H), split_heads(K, self.H), split_heads(V, self.H)

    def attention_map(self, X: Tensor, mask: Tensor | None = None) -> Tensor:
        """The weights ``(B, H, N, N)`` with which every head of this layer attends, for ``X``
        (book eq. ``eq-vit-attn`` in a vision transformer's blocks)."""
        Q, K, _ = self.project(X)
        return self.weights_of(Q, K, mask)

    def forward(
        self, X: Tensor, mask: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor:
        Q, K, V = self.project(X)  # (B, H, N, d_k) each
        if cache is not None:  # chapter 7: the keys and values of the earlier tokens come first
            K, V = cache.update(K, V)  # (B, H, M, d_k), M = tokens so far
        return self.attend(Q, K, V, mask)  # (B, N, D)


# ---------------------------------------------------------------------------------------------------
# The colour-and-shape task of the chapter: two relations at once, which one head cannot serve

COLOURS, SHAPES = ("red", "blue"), ("circle", "square")
KINDS = tuple((c, s) for c in COLOURS for s in SHAPES)  # red circle, red square, blue circle, ...


def colour_shape_tokens(words: list[str]) -> Tensor:
    """``(N, 4)`` float64 tokens for words such as ``"red circle"``: a colour one-hot, then a shape
    one-hot, ``x_n = [x_n^col, x_n^shp]``."""
    rows = []
    for word in words:
        colour, _, shape = word.partition(" ")
        if colour not in COLOURS or shape not in SHAPES:
            raise ValueError(
                f"{word!r} is not '<colour> <shape>' with a colour in {COLOURS} and a shape in "
                f"{SHAPES}"
            )
        rows.append([float(colour == c) for c in COLOURS] + [float(shape == s) for s in SHAPES])
    return torch.tensor(rows, dtype=torch.float64)


def colour_shape_sequence(counts: tuple[int, int, int, int]) -> Tensor:
    """The tokens of a sequence with ``counts[j]`` tokens of kind ``KINDS[j]``, kinds in that order."""
    return colour_shape_tokens(
        [f"{c} {s}" for (c, s), k in zip(KINDS, counts, strict=True) for _ in range(k)]
    )


def colour_shape_target(X: Tensor) -> Tensor:
    r"""The task's output for tokens ``X`` ``(N, 4)``, token by token with plain loops.

    Implements: eq-mh-toy

    .. math:: \mathbf{y}_n = \Big[\tfrac{1}{|\mathcal{C}_n|}\sum_{m\in\mathcal{C}_n}\mathbf{x}^\text{shp}_m,\
              \tfrac{1}{|\mathcal{S}_n|}\sum_{m\in\mathcal{S}_n}\mathbf{x}^\text{col}_m\Big]

    the shapes among the tokens of token ``n``'s colour (``C_n``), then the colours among the tokens of
    its shape (``S_n``).
    """
    col, shp = X[:, :2], X[:, 2:]
    Y = torch.zeros_like(X)
    for n in range(len(X)):
        same_colour = [m for m in range(len(X)) if torch.equal(col[m], col[n])]
        same_shape = [m for m in range(len(X)) if torch.equal(shp[m], shp[n])]
        Y[n, :2] = sum(shp[m] for m in same_colour) / len(same_colour)
        Y[n, 2:] = sum(col[m] for m in same_shape) / len(same_shape)
    return Y
