"""Extensions: sliding-window (local) attention, its rolling-buffer cache, local and global layers."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..language_models import KVCache
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


class RollingKVCache:
    r"""The rolling-buffer key-value cache of sliding-window attention, book eq. ``eq-ext-rolling``
    (Jiang et al. 2023, sec. 2): buffers of ``w`` positions per layer, token ``n`` (counting from 0)
    written into slot :math:`n \bmod w`, so the token that left the window is overwritten and the
    memory stays ``w`` positions however long the sequence.

    A drop-in for :class:`.language_models.KVCache` in :class:`.multihead.SelfAttention` (``cache=``),
    one token per step: :meth:`update` returns every position the buffer holds, at most ``w``, which
    are exactly the keys of the new token's window. They come in slot order, not time order; softmax
    attention sums over its keys, so the order does not change the result as long as each key keeps
    its value (positions must already be inside the keys, as with RoPE, not added by the attention as
    with ALiBi). :meth:`ordered` gives them in time order. For inference only (no gradients).

    Implements: eq-ext-rolling
    """

    def __init__(self, w: int) -> None:
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ValueError(f"the window w must be a positive int (positions kept), got {w!r}")
        self.w = w
        self.K: Tensor | None = None
        self.V: Tensor | None = None
        self.position = 0  # tokens written so far; the next one goes to slot position % w

    def __len__(self) -> int:
        """Positions held: ``min(position, w)``."""
        return min(self.position, self.w)

    def reset(self) -> None:
        """Start a new sequence; the buffers are kept."""
        self.position = 0

    def update(self, K_new: Tensor, V_new: Tensor) -> tuple[Tensor, Tensor]:
        """Write one token's ``K_new, V_new`` ``(B, H, 1, d)`` into slot ``position mod w``; return the
        keys and values held, ``(B, H, min(position, w), d)`` views of the buffers, in slot order."""
        if K_new.dim() != 4 or K_new.shape[-2] != 1 or V_new.shape[:-1] != K_new.shape[:-1]:
            raise ValueError(
                f"the rolling buffer takes one token per step, K_new and V_new (B, H, 1, d); got "
                f"K_new {tuple(K_new.shape)}, V_new {tuple(V_new.shape)}. Feed the tokens one at a "
                "time (a prompt too), or run the whole sequence without a cache and a window mask"
            )
        if self.K is None or self.K.shape[:2] != K_new.shape[:2] or self.K.dtype != K_new.dtype:
            B, H, _, d_k = K_new.shape
            self.K = K_new.new_empty(B, H, self.w, d_k)
            self.V = V_new.new_empty(B, H, self.w, V_new.shape[-1])
        slot = self.position % self.w  # overwrites token position - w, which just left the window
        self.K[:, :, slot] = K_new[:, :, 0]
        self.V[:, :, slot] = V_new[:, :, 0]
        self.position += 1
        held = len(self)
        return self.K[:, :, :held], self.V[:, :, :held]

    def ordered(self) -> tuple[Tensor, Tensor]:
        """The held keys and values in time order, oldest first: the buffer rolled so that slot
        ``position mod w`` (the oldest, once the buffer is full) comes first."""
        if self.K is None:
            raise ValueError("the cache is empty; call update() first")
        if self.position <= self.w:
            return self.K[:, :, : self.position], self.V[:, :, : self.position]
        shift = -(self.position % self.w)
        return self.K.roll(shift, dims=2), self.V.roll(shift, dims=2)


Windows = Sequence[int | None]


def _check_windows(windows: Windows) -> list[int | None]:
    windows = list(windows)
    if not windows:
        raise ValueError(
            "give one window per layer (an int w, or None for a global layer), got none"
        )
    for ell, w in enumerate(windows):
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ValueError(
                f"layer {ell}: a window must be a positive int or None (global), got {w!r}"
            )
    return windows


def local_global_windows(n_layers: int, w: int, global_every: int) -> list[int | None]:
    """Windows of an interleaved stack: layer ``l`` (counting from 1) is global (``None``) when
    ``global_every`` divides ``l``, local with window ``w`` otherwise. ``global_every=2`` alternates
    local and global layers as Gemma 2 does (Gemma Team 2024); a ``global_every`` above ``n_layers``
    gives an all-local stack, as in Mistral 7B (Jiang et al. 2023)."""
    for name, n in (("n_layers", n_layers), ("w", w), ("global_every", global_every)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    return [None if ell % global_every == 0 else w for ell in range(1, n_layers + 1)]


def interleaved_masks(
    N: int, windows: Windows, device: torch.device | str | None = None
) -> list[Tensor]:
    """One bool ``(N, N)`` mask per layer: :func:`sliding_window_mask` for a local layer (an int
    window), the causal mask for a global one (``None``)."""
    windows = _check_windows(windows)
    causal = torch.ones(N, N, dtype=torch.bool, device=device).tril()
    return [causal if w is None else sliding_window_mask(N, w, device) for w in windows]


def receptive_field(N: int, windows: Windows) -> Tensor:
    r"""Which input tokens each output token can depend on after the layers, book eq.
    ``eq-ext-reach``: bool ``(N, N)``, entry ``(n, m)`` true when :math:`0 \le n - m \le
    \sum_\ell (w_\ell - 1)` for an all-local stack, and for every :math:`m \le n` as soon as one layer
    is global. Each local layer moves information at most :math:`w_\ell - 1` positions; the residual
    stream keeps what earlier layers brought.

    Implements: eq-ext-reach
    """
    windows = _check_windows(windows)
    offset = torch.arange(N)[:, None] - torch.arange(N)[None, :]  # n - m
    if any(w is None for w in windows):
        return offset >= 0
    return (offset >= 0) & (offset <= sum(w - 1 for w in windows))


def kv_cache_entries(N: int, windows: Windows) -> int:
    r"""Key-value positions cached over all layers after ``N`` tokens, book eq. ``eq-ext-kv-window``:
    :math:`\sum_\ell \min(N, w_\ell)`, a global layer (``None``) holding all ``N``. Multiply by
    ``2 B H_kv d_k`` numbers for the size (:func:`.grouped_query.kv_cache_bytes`).

    Implements: eq-ext-kv-window
    """
    windows = _check_windows(windows)
    if isinstance(N, bool) or not isinstance(N, int) or N < 0:
        raise ValueError(f"N must be a non-negative int (tokens so far), got {N!r}")
    return sum(N if w is None else min(N, w) for w in windows)


def forward_with_masks(stack: nn.Module, X: Tensor, masks: Sequence[Tensor]) -> Tensor:
    """A :class:`.block.TransformerStack` run over the whole sequence with one mask per block (its own
    ``forward`` takes one mask for all), then its final norm. ``X (B, N, D)``."""
    if len(masks) != len(stack.blocks):
        raise ValueError(f"{len(masks)} masks for {len(stack.blocks)} blocks; pass one per block")
    for block, mask in zip(stack.blocks, masks, strict=True):
        X = block(X, mask)  # (B, N, D)
    return stack.final_norm(X)


def decode_windowed(
    stack: nn.Module, X: Tensor, windows: Windows
) -> tuple[Tensor, list[RollingKVCache | KVCache]]:
    """Run a stack token by token, a :class:`RollingKVCache` of ``w`` positions for each local layer
    and a full :class:`.language_models.KVCache` for each global one (``None``). Returns the outputs
    ``(B, N, D)``, equal to :func:`forward_with_masks` with :func:`interleaved_masks`, and the caches.
    The caches hold exactly the keys each new token may see, so no mask is passed."""
    windows = _check_windows(windows)
    if len(windows) != len(stack.blocks):
        raise ValueError(
            f"{len(windows)} windows for {len(stack.blocks)} blocks; give one per block"
        )
    N = X.shape[-2]
    caches = [KVCache(N) if w is None else RollingKVCache(w) for w in windows]
    outs = [stack(X[:, n : n + 1], None, caches) for n in range(N)]  # one token per step
    return torch.cat(outs, dim=-2), caches
