"""The key-value cache of one self-attention layer.

Shared infrastructure: chapter *Autoregressive language models* teaches it (eq. ``eq-lm-kv-append``);
every model that generates one token at a time uses it, through the ``cache=`` argument of
:class:`.multihead.SelfAttention` and the ``caches=`` of :class:`.block.TransformerStack`: the GPT of
:mod:`.language_models`, the decoder of :mod:`.encoder_decoder` and the models of :mod:`.extensions`.
It lives below them all, so that the layers that take a cache never import the chapter that teaches it.
``tc.language_models.KVCache`` is this class.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["KVCache"]


class KVCache:
    r"""The keys and values of the tokens seen so far by one self-attention layer (Dramko 2025 sec.
    5.3) in buffers ``(B, H, capacity, d_k)``, allocated at the first :meth:`update` and written in
    place: appending copies only the new entries. For inference only (no gradients).

    Implements: eq-lm-kv-append
    """

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self.K: Tensor | None = None
        self.V: Tensor | None = None
        self.length = 0

    def __len__(self) -> int:
        return self.length

    def reset(self) -> None:
        """Forget every position; the buffers are kept for the next sequence of the same shape."""
        self.length = 0

    def update(self, K_new: Tensor, V_new: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new tokens' ``K_new, V_new`` ``(B, H, n, d)`` after the cached ones; return all
        keys and values so far, ``(B, H, length, d)`` views of the buffers."""
        start, end = self.length, self.length + K_new.shape[-2]
        if end > self.capacity:
            raise ValueError(
                f"the cache holds at most {self.capacity} positions but {end} were written; start a "
                "new cache (or crop the sequence) when the context is full"
            )
        if self.K is None or self.K.shape[:2] != K_new.shape[:2] or self.K.dtype != K_new.dtype:
            B, H, _, d_k = K_new.shape
            self.K = K_new.new_empty(B, H, self.capacity, d_k)
            self.V = V_new.new_empty(B, H, self.capacity, V_new.shape[-1])
        self.K.narrow(2, start, end - start).copy_(K_new)  # K[:, :, start:end] = K_new, in place
        self.V.narrow(2, start, end - start).copy_(V_new)
        self.length = end
        return self.K.narrow(2, 0, end), self.V.narrow(2, 0, end)  # K[:, :, :end], V[:, :, :end]
