"""Models assembled from the course's parts: a decoder-only GPT (more models join in later chapters).

Chapter: *Autoregressive language models* (Turner 2023 sec. 4.1; MIT 6.390 sec. 9.1 and 9.5.2; Dramko
2025 sec. 5.2-5.3). Every part is the course's own: token lookup, learned positions
(:mod:`.position`), pre-norm blocks with causal multi-head attention (:mod:`.block`), a final LayerNorm
and the LM head, whose weights are tied to the token embedding by default (Press & Wolf 2017).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .block import PreNormBlock, TransformerStack
from .multihead import KVCache
from .position import LearnedPositionalEmbedding

__all__ = ["GPT", "SHAKESPEARE_CPU", "SHAKESPEARE_GPU", "TINY", "GPTConfig"]


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a GPT. ``block_size`` is the context length ``N``; ``n_layers`` is ``M``."""

    vocab_size: int = 65
    block_size: int = 256
    n_layers: int = 6
    H: int = 6
    d_model: int = 384
    dropout: float = 0.2
    tie_weights: bool = True

    def __post_init__(self) -> None:
        if self.d_model % self.H:
            raise ValueError(f"d_model={self.d_model} must be divisible by H={self.H}")
        if min(self.vocab_size, self.block_size, self.n_layers, self.H) < 1:
            raise ValueError(f"every size must be positive: {self}")


TINY = GPTConfig(vocab_size=65, block_size=32, n_layers=2, H=2, d_model=32, dropout=0.0)
"""For tests and quick demonstrations."""
SHAKESPEARE_CPU = GPTConfig(
    vocab_size=65, block_size=128, n_layers=4, H=4, d_model=192, dropout=0.0
)
"""Trains to a validation loss below 1.70 in about two minutes on a 2-core CPU (``bench/lm.py``)."""
SHAKESPEARE_GPU = GPTConfig(
    vocab_size=65, block_size=256, n_layers=6, H=6, d_model=384, dropout=0.2
)
"""nanoGPT's ``shakespeare_char`` size (Karpathy 2022): 6 layers, 6 heads, 384 wide, context 256."""


class GPT(nn.Module):
    r"""A decoder-only transformer language model, book eq. ``eq-lm-head``.

    .. math:: X^{(0)} = E[\mathbf{t}] + P,\qquad X^{(M)} = \mathrm{stack}(X^{(0)}),

              p(t_{n+1} \mid t_{\le n}) =
              \operatorname{softmax}\big(\mathrm{LN}(X^{(M)}) W_\text{vocab}\big)_n

    ``forward(idx (B, N), targets (B, N) | None, caches | None) -> (logits (B, N, V), loss | None)``.
    The loss is the mean cross-entropy over all ``B * N`` positions (teacher forcing). With caches
    (:meth:`new_caches`), ``idx`` holds only the new tokens and positions continue from the cache.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = LearnedPositionalEmbedding(c.block_size, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.stack = TransformerStack(
            PreNormBlock, c.n_layers, c.d_model, c.H, activation="gelu", dropout=c.dropout
        )
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_weights:
            self.lm_head.weight = self.tok_emb.weight  # W_vocab = E^T (Press & Wolf 2017)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith(("out_proj.weight", "fc2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        """Parameters, each counted once (a tied LM head is not counted twice)."""
        return sum(p.numel() for p in self.parameters())

    def new_caches(self) -> list[KVCache]:
        """One empty :class:`KVCache` per block, for cached generation."""
        return [KVCache() for _ in range(self.config.n_layers)]

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, caches: list[KVCache] | None = None
    ) -> tuple[Tensor, Tensor | None]:
        if idx.dim() != 2 or idx.dtype not in (torch.long, torch.int32, torch.int64):
            raise ValueError(
                f"idx must be integer token ids of shape (B, N), got {idx.dtype} {tuple(idx.shape)}"
            )
        start = len(caches[0]) if caches else 0
        B, N = idx.shape
        if start + N > self.config.block_size:
            raise ValueError(
                f"{start + N} tokens exceed the context of {self.config.block_size}; crop the input "
                "(tc.generate does this for you)"
            )
        if idx.numel() and (idx.min() < 0 or idx.max() >= self.config.vocab_size):
            raise ValueError(
                f"token ids must lie in [0, {self.config.vocab_size}), got {idx.min()}..{idx.max()}"
            )
        X = self.drop(self.pos_emb(self.tok_emb(idx), start=start))  # (B, N, D)
        X = self.stack(X, causal=True, caches=caches)  # (B, N, D), final LayerNorm included
        logits = self.lm_head(X)  # (B, N, V)
        if targets is None:
            return logits, None
        if targets.shape != idx.shape:
            raise ValueError(
                f"targets {tuple(targets.shape)} must have the shape of idx {tuple(idx.shape)}"
            )
        loss = F.cross_entropy(logits.reshape(B * N, -1).float(), targets.reshape(B * N))
        return logits, loss

    def save(self, path: str | pathlib.Path, **extra) -> None:
        """Save config, weights and any ``extra`` (e.g. the tokenizer's characters) to ``path``."""
        torch.save(
            {"config": dataclasses.asdict(self.config), "state_dict": self.state_dict(), **extra},
            path,
        )

    @classmethod
    def load(
        cls, path: str | pathlib.Path, map_location: str | torch.device = "cpu"
    ) -> tuple[GPT, dict]:
        """Rebuild a model saved by :meth:`save`; returns ``(model, extra)``."""
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
        model = cls(GPTConfig(**ckpt.pop("config")))
        model.load_state_dict(ckpt.pop("state_dict"))
        return model, ckpt
