"""Models assembled from the course's parts: a decoder-only GPT, an encoder-decoder, a ViT.

Chapters: *Autoregressive language models* (:class:`GPT`; Turner 2023 sec. 4.1, MIT 6.390 sec. 9.1 and
9.5.2, Dramko 2025 sec. 5.2-5.3), *Encoder-decoder* (:class:`Seq2Seq`; Dramko sec. 5.1, Turner sec.
4.3) and *Vision transformers* (:class:`ViT`; Turner sec. 4.2, Dosovitskiy et al. 2021). Every part is
the course's own: token lookup, learned positions (:mod:`.position`), pre-norm blocks and decoder blocks
(:mod:`.block`) with multi-head attention (:mod:`.multihead`), and patch embeddings (:mod:`.tokens`).
There is no second implementation of any of them here.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .block import DecoderBlock, LayerNorm, PreNormBlock, TransformerStack
from .multihead import KVCache
from .position import LearnedPositionalEmbedding
from .tokens import PatchEmbedding

__all__ = [
    "GPT",
    "SHAKESPEARE_CPU",
    "SHAKESPEARE_GPU",
    "TINY",
    "GPTConfig",
    "Seq2Seq",
    "Seq2SeqConfig",
    "ViT",
    "ViTConfig",
]


def _init_weights(module: nn.Module) -> None:
    """GPT-2's initialisation: N(0, 0.02) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


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
SHAKESPEARE_CPU = GPTConfig(vocab_size=65, block_size=64, n_layers=2, H=4, d_model=128, dropout=0.0)
"""Sized for a 2-core CPU and a two-minute budget: shallow and narrow, so that many tokens are seen
(``bench/lm.py`` reports what it reaches; the performance page shows the figures)."""
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
        self.apply(_init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith(("out_proj.weight", "fc2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layers))

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


@dataclass(frozen=True)
class Seq2SeqConfig:
    """Sizes of an encoder-decoder. ``src_len``/``tgt_len`` are the longest source/target sequences."""

    src_vocab: int
    tgt_vocab: int
    src_len: int
    tgt_len: int
    d_model: int = 128
    H: int = 4
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    dropout: float = 0.0
    pad_id: int = 0


class Seq2Seq(nn.Module):
    r"""An encoder-decoder transformer, book eq. ``eq-ed-model`` (Vaswani et al. 2017; Dramko 2025 sec. 5).

    The encoder reads the whole source (padding hidden by a mask) with pre-norm blocks; the decoder reads
    the target so far with causal self-attention and attends to the encoder's output through
    cross-attention; a linear map projects into the target vocabulary.

    ``forward(src (B, M), tgt_in (B, N), tgt_out (B, N) | None) -> (logits (B, N, V), loss | None)``;
    the loss ignores padding positions of ``tgt_out``.
    """

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        c = self.config = config
        self.src_emb = nn.Embedding(c.src_vocab, c.d_model)
        self.tgt_emb = nn.Embedding(c.tgt_vocab, c.d_model)
        self.src_pos = LearnedPositionalEmbedding(c.src_len, c.d_model)
        self.tgt_pos = LearnedPositionalEmbedding(c.tgt_len, c.d_model)
        self.encoder = nn.ModuleList(
            PreNormBlock(c.d_model, c.H, activation="gelu", dropout=c.dropout)
            for _ in range(c.n_encoder_layers)
        )
        self.encoder_norm = LayerNorm(c.d_model)
        self.decoder = nn.ModuleList(
            DecoderBlock(c.d_model, c.H, dropout=c.dropout) for _ in range(c.n_decoder_layers)
        )
        self.decoder_norm = LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.tgt_vocab, bias=False)
        self.apply(_init_weights)

    def _check(self, ids: Tensor, name: str, limit: int, vocab: int) -> None:
        if ids.dim() != 2 or ids.dtype != torch.long:
            raise ValueError(
                f"{name} must be (B, length) token ids, got {ids.dtype} {tuple(ids.shape)}"
            )
        if ids.shape[1] > limit:
            raise ValueError(
                f"{name} has {ids.shape[1]} tokens but the model was built for at most {limit}; "
                f"shorten it or build Seq2SeqConfig with a larger {'src_len' if 'src' in name else 'tgt_len'}"
            )
        if ids.numel() and (ids.min() < 0 or ids.max() >= vocab):
            raise ValueError(f"{name} ids must lie in [0, {vocab})")

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder output ``(B, M, D)`` and the key mask ``(B, M)`` (``True`` = real token)."""
        c = self.config
        self._check(src, "src", c.src_len, c.src_vocab)
        keep = src != c.pad_id  # (B, M)
        mask = keep[:, None, :].expand(-1, src.shape[1], -1)  # (B, M, M): hide padded keys
        H = self.src_pos(self.src_emb(src))
        for block in self.encoder:
            H = block(H, mask=mask)
        return self.encoder_norm(H), keep

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        keep: Tensor,
        caches: list[tuple[KVCache, KVCache]] | None = None,
    ) -> Tensor:
        """Logits ``(B, N, V)`` for the target tokens ``tgt_in`` given the encoder's output."""
        c = self.config
        start = len(caches[0][0]) if caches else 0
        if start + tgt_in.shape[1] > c.tgt_len:
            raise ValueError(f"the target is longer than tgt_len={c.tgt_len}")
        self._check(tgt_in, "tgt_in", c.tgt_len, c.tgt_vocab)
        X = self.tgt_pos(self.tgt_emb(tgt_in), start=start)  # (B, N, D)
        memory_mask = keep[:, None, :].expand(-1, tgt_in.shape[1], -1)  # (B, N, M)
        for m, block in enumerate(self.decoder):
            self_cache, cross_cache = caches[m] if caches else (None, None)
            X = block(X, memory, memory_mask, self_cache, cross_cache)
        return self.head(self.decoder_norm(X))

    def forward(
        self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        memory, keep = self.encode(src)
        logits = self.decode(tgt_in, memory, keep)
        if tgt_out is None:
            return logits, None
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            tgt_out.reshape(-1),
            ignore_index=self.config.pad_id,
        )
        return logits, loss

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, bos: int, eos: int, use_cache: bool = True) -> Tensor:
        """Greedy decoding: ``(B, tgt_len)`` ids starting with ``bos``; after ``eos`` only padding.

        The encoder runs once. With ``use_cache`` the decoder's self-attention keys and values are
        cached and the cross-attention keys and values of the encoder output are computed once.
        """
        was_training = self.training
        self.eval()
        memory, keep = self.encode(src)
        B = src.shape[0]
        out = torch.full((B, 1), bos, dtype=torch.long, device=src.device)
        done = torch.zeros(B, dtype=torch.bool, device=src.device)
        caches = [(KVCache(), KVCache(static=True)) for _ in self.decoder] if use_cache else None
        for _ in range(self.config.tgt_len - 1):
            step_in = out[:, -1:] if use_cache else out
            logits = self.decode(step_in, memory, keep, caches)[:, -1]  # (B, V)
            nxt = logits.argmax(dim=-1)
            nxt = torch.where(done, torch.full_like(nxt, self.config.pad_id), nxt)
            out = torch.cat([out, nxt[:, None]], dim=1)
            done |= nxt == eos
            if done.all():
                break
        self.train(was_training)
        pad = self.config.tgt_len - out.shape[1]
        return F.pad(out, (0, pad), value=self.config.pad_id)


@dataclass(frozen=True)
class ViTConfig:
    """Sizes of a vision transformer; ``pool`` is ``"cls"`` (a learned CLS token) or ``"mean"``.

    ``patch_stride`` ``None`` cuts non-overlapping ``patch_size`` patches (the ViT's); a smaller stride
    gives overlapping patches (book eq. ``eq-vit-overlap``), e.g. ``patch_size=4, patch_stride=2``.
    ``patch_init`` is ``"gpt2"`` (the patch map drawn from N(0, 0.02^2) like every other weight) or
    ``"lecun"`` (N(0, 1 / (C P^2)), as the ViT authors' code initialises it; book eq. ``eq-vit-init``).
    """

    image_size: int = 8
    patch_size: int = 2
    channels: int = 1
    n_classes: int = 10
    d_model: int = 64
    H: int = 4
    n_layers: int = 4
    dropout: float = 0.1
    pool: str = "cls"
    patch_stride: int | None = None
    patch_init: str = "gpt2"

    def __post_init__(self) -> None:
        stride = self.stride
        if self.image_size % stride:
            name = "patch_size" if self.patch_stride is None else "patch_stride"
            raise ValueError(f"image_size={self.image_size} is not divisible by {name}={stride}")
        if stride > self.patch_size or (self.patch_size - stride) % 2:
            raise ValueError(
                f"patch_stride={stride} must be at most patch_size={self.patch_size}, with an even "
                "difference (the image is padded by (patch_size - patch_stride) / 2 on each side)"
            )
        if self.pool not in ("cls", "mean"):
            raise ValueError(f"pool must be 'cls' or 'mean', got {self.pool!r}")
        if self.patch_init not in ("gpt2", "lecun"):
            raise ValueError(f"patch_init must be 'gpt2' or 'lecun', got {self.patch_init!r}")

    @property
    def stride(self) -> int:
        """Step between patches: ``patch_stride``, or ``patch_size`` when that is ``None``."""
        return self.patch_size if self.patch_stride is None else self.patch_stride

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.stride) ** 2


class ViT(nn.Module):
    r"""A vision transformer, book eq. ``eq-vit`` (Dosovitskiy et al. 2021; Turner 2023 sec. 4.2).

    .. math:: X^{(0)} = [\mathbf{x}_\text{cls}; P W^\top] + R,\qquad
              \text{logits} = \mathrm{LN}(X^{(M)})_\text{cls}\, W_\text{head}

    (with ``pool="mean"`` the average over patch tokens replaces the CLS row).
    ``forward(images (B, C, H, W)) -> logits (B, n_classes)``.
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        c = self.config = config
        self.patch = PatchEmbedding(c.patch_size, c.channels, c.d_model, stride=c.patch_stride)
        self.cls = nn.Parameter(torch.zeros(1, 1, c.d_model)) if c.pool == "cls" else None
        self.pos = LearnedPositionalEmbedding(c.n_patches + (c.pool == "cls"), c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.stack = TransformerStack(
            PreNormBlock, c.n_layers, c.d_model, c.H, activation="gelu", dropout=c.dropout
        )
        self.head = nn.Linear(c.d_model, c.n_classes)
        self.apply(_init_weights)
        if c.patch_init == "lecun":  # book eq. eq-vit-init: std 1/sqrt(C P^2), as the ViT's code
            nn.init.normal_(self.patch.proj.weight, std=self.patch.proj.in_features**-0.5)

    def tokens(self, images: Tensor) -> Tensor:
        """``X^(0)``: patch embeddings (with the CLS token first) plus learned positions."""
        c = self.config
        if images.dim() != 4 or images.shape[1:] != (c.channels, c.image_size, c.image_size):
            raise ValueError(
                f"images must be (B, {c.channels}, {c.image_size}, {c.image_size}) for this ViT, got "
                f"{tuple(images.shape)}"
            )
        X = self.patch(images)  # (B, N, D)
        if self.cls is not None:
            X = torch.cat([self.cls.expand(X.shape[0], -1, -1), X], dim=1)  # (B, 1 + N, D)
        return self.drop(self.pos(X))

    def forward(self, images: Tensor) -> Tensor:
        X = self.stack(self.tokens(images))  # (B, 1 + N | N, D), final LayerNorm included
        pooled = X[:, 0] if self.cls is not None else X.mean(dim=1)  # (B, D)
        return self.head(pooled)
