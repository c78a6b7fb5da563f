"""Encoder-decoder transformers: cross-attention, the decoder block and stack, a seq2seq model, its recipe.

Chapter: *Encoder-decoder* (Dramko 2025 sec. 5.1; Turner 2023 sec. 4.3; Vaswani et al. 2017). The encoder
is a :class:`.block.TransformerStack` of pre-norm blocks; the decoder is a :class:`Decoder` of
:class:`DecoderBlock`, whose cross-attention reads the encoder's output. The task the chapter trains on,
human-written dates into ISO dates, is :class:`.data.DateTask`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .block import MLP, LayerNorm, PreNormBlock, TransformerStack
from .data import DateTask
from .language_models import KVCache, gpt2_init
from .multihead import AttentionLayer, SelfAttention, split_heads
from .position import LearnedPositionalEmbedding
from .runtime import eval_mode, reusable_run
from .self_attention import causal_mask
from .train import History, Recipe, TrainConfig, train

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "DATES_RECIPE",
    "CrossAttention",
    "DatesRecipe",
    "DatesRun",
    "Decoder",
    "DecoderBlock",
    "Seq2Seq",
    "Seq2SeqConfig",
    "beam_search",
    "decoder_mask",
    "exact_match",
    "exhaustive_search",
    "length_penalty",
    "train_dates",
]

MemoryKV = tuple[Tensor, Tensor]
"""The keys and values of one cross-attention layer over the encoder's output, ``(B, H, M, d_k)`` each."""


class CrossAttention(AttentionLayer):
    r"""Multi-head cross-attention: queries from the decoder stream ``X``, keys and values from the
    encoder's output (the *memory* :math:`X_\text{mem}`).

    .. math:: \mathrm{head}_h = \operatorname{softmax}_\text{row}\!\Big(\frac{X W_q^{(h)}
              (X_\text{mem} W_k^{(h)})^\top}{\sqrt{d_k}}\Big) X_\text{mem} W_v^{(h)}

    Implements: eq-ed-cross

    The memory's keys and values depend only on the source sequence, so :meth:`memory_kv` computes
    them once and :meth:`forward` reuses them at every decoding step (book eq. ``eq-ed-static``).
    The layer has no causal mask: every target position may read the whole source.
    """

    def memory_kv(self, memory: Tensor) -> MemoryKV:
        """``memory (B, M, D) -> (K, V)``, each ``(B, H, M, d_k)``: once per source sequence.

        Implements: eq-ed-static"""
        self._check_tokens(memory, "memory")
        D = self.d_model
        W, b = self.in_proj.weight[D:], None if self.in_proj.bias is None else self.in_proj.bias[D:]
        K, V = F.linear(memory, W, b).split(D, dim=-1)  # (B, M, D) each: W_k's and W_v's rows
        return split_heads(K, self.H), split_heads(V, self.H)

    def queries(self, X: Tensor) -> Tensor:
        """The decoder stream's queries ``(B, H, N, d_k)``: ``W_q``'s rows of ``in_proj``."""
        self._check_tokens(X)
        D = self.d_model
        W, b = self.in_proj.weight[:D], None if self.in_proj.bias is None else self.in_proj.bias[:D]
        return split_heads(F.linear(X, W, b), self.H)

    def attention_map(self, X: Tensor, memory_kv: MemoryKV, mask: Tensor | None = None) -> Tensor:
        """The weights ``(B, H, N, M)`` with which every head reads the memory: the ``A^(h)`` whose
        mean over heads is the alignment.

        Implements: eq-ed-align"""
        return self.weights_of(self.queries(X), memory_kv[0], mask)

    def forward(self, X: Tensor, memory_kv: MemoryKV, mask: Tensor | None = None) -> Tensor:
        """``X (B, N, D)`` and :meth:`memory_kv` of the memory; ``mask`` bool ``(N, M)`` or
        ``(B, N, M)``, ``True`` = may attend (e.g. to hide padded source tokens)."""
        self._check_tokens(X)
        if isinstance(memory_kv, Tensor) or len(memory_kv) != 2:
            raise TypeError(
                "memory_kv must be the pair (K, V) that cross_attn.memory_kv(memory) returns, not "
                "the memory itself: compute it once per source and pass it at every step"
            )
        K, V = memory_kv
        if K.shape[0] != X.shape[0]:
            raise ValueError(
                f"X holds {X.shape[0]} sequences but the memory {K.shape[0]}; encode the same batch"
            )
        return self.attend(self.queries(X), K, V, mask)  # (B, N, D)


class DecoderBlock(nn.Module):
    """The decoder block's three sub-layers, each with its residual (Vaswani et al. 2017 sec. 3.1;
    Dramko 2025 sec. 5.1 lists them): causal self-attention, cross-attention to the memory (queries
    from ``LN(X')``, keys and values from the memory, Vaswani et al. sec. 3.2.3), token-wise MLP.
    Pre-norm, as every block of the course: each sub-layer reads its own LayerNorm of the stream
    (Vaswani et al.'s block is post-norm, a LayerNorm after each residual sum).

    Implements: eq-ed-decoder
    """

    final_norm = True  # pre-norm: a stack of these ends with a LayerNorm

    def __init__(
        self,
        d_model: int,
        H: int,
        d_ff: int | None = None,
        activation: str = "relu",
        dropout: float = 0.0,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.self_attn = SelfAttention(d_model, H, causal=True, dropout=dropout)
        self.cross_attn = CrossAttention(d_model, H, dropout=dropout)
        self.mlp = MLP(d_model, d_ff or 4 * d_model, activation)
        self.norm1, self.norm2, self.norm3 = (LayerNorm(d_model, eps) for _ in range(3))
        self.drop = nn.Dropout(dropout)

    def forward(
        self,
        X: Tensor,
        memory_kv: MemoryKV,
        memory_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        X1 = X + self.drop(self.self_attn(self.norm1(X), cache=cache))  # X', (B, N, D)
        X2 = X1 + self.drop(self.cross_attn(self.norm2(X1), memory_kv, memory_mask))  # X''
        return X2 + self.drop(self.mlp(self.norm3(X2)))  # (B, N, D)


def decoder_mask(tgt: Tensor, pad_id: int = 0) -> Tensor:
    """The decoder's self-attention mask for padded targets ``tgt`` ``(B, N)``: ``(B, N, N)``, ``True``
    where query ``n`` may attend to key ``m``, that is ``m <= n`` and ``tgt[:, m]`` is not padding.

    Implements: eq-ed-decmask

    Needed when padding can come first (prompts padded on the left); with targets padded on the right,
    as :class:`Seq2Seq` trains, the causal mask alone already hides every padded key from every real
    query. A causal :class:`.multihead.SelfAttention` given the key mask computes the same."""
    return causal_mask(tgt.shape[1], device=tgt.device) & (tgt != pad_id)[:, None, :]


class Decoder(nn.Module):
    """``L_d`` decoder blocks (``n_layers``) and a final LayerNorm (the decoder of the model).

    ``memory_kv(memory)`` gives every block's cross-attention keys and values (once per source);
    ``forward(X (B, N, D), memory_kv, memory_mask, caches) -> (B, N, D)``.
    """

    def __init__(self, n_layers: int, d_model: int, H: int, **kwargs) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"a decoder needs at least one block, got n_layers={n_layers}")
        self.blocks = nn.ModuleList(DecoderBlock(d_model, H, **kwargs) for _ in range(n_layers))
        self.final_norm = LayerNorm(d_model, kwargs.get("eps", 1e-5))

    def memory_kv(self, memory: Tensor) -> list[MemoryKV]:
        return [block.cross_attn.memory_kv(memory) for block in self.blocks]

    def forward(
        self,
        X: Tensor,
        memory_kv: Sequence[MemoryKV],
        memory_mask: Tensor | None = None,
        caches: Sequence[KVCache] | None = None,
    ) -> Tensor:
        for m, block in enumerate(self.blocks):
            X = block(X, memory_kv[m], memory_mask, None if caches is None else caches[m])
        return self.final_norm(X)


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
    r"""An encoder-decoder transformer: the layout of Vaswani et al. (2017) (Dramko 2025 sec. 5), with
    the course's choices where theirs differ: pre-norm blocks and a final LayerNorm on each side (theirs
    are post-norm), learned positions (sinusoidal), GELU (ReLU), and a head not tied to the embeddings.

    Implements: eq-ed-model, eq-ed-factor

    The encoder reads the whole source (padding hidden by a mask); the decoder reads the target so far
    with causal self-attention and attends to the encoder's output through cross-attention; a linear
    map projects into the target vocabulary. ``forward(src (B, M), tgt_in (B, N), tgt_out (B, N) |
    None) -> (logits (B, N, |V|), loss | None)``: one pass gives every conditional of the
    factorisation, one per target position; the loss ignores padding positions of ``tgt_out``.
    """

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        c = self.config = config
        self.src_emb = nn.Embedding(c.src_vocab, c.d_model)
        self.tgt_emb = nn.Embedding(c.tgt_vocab, c.d_model)
        self.src_pos = LearnedPositionalEmbedding(c.src_len, c.d_model)
        self.tgt_pos = LearnedPositionalEmbedding(c.tgt_len, c.d_model)
        kw = {"activation": "gelu", "dropout": c.dropout}
        self.encoder = TransformerStack(PreNormBlock, c.n_encoder_layers, c.d_model, c.H, **kw)
        self.decoder = Decoder(c.n_decoder_layers, c.d_model, c.H, **kw)
        self.head = nn.Linear(c.d_model, c.tgt_vocab, bias=False)
        self.apply(gpt2_init)

    def forward(
        self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Logits ``(B, N, V)`` and, given ``tgt_out``, the mean cross-entropy over its real tokens.

        Implements: eq-ed-loss"""
        memory, keep = self.encode(src)  # (B, M, D), (B, M)
        logits = self.decode(tgt_in, self.decoder.memory_kv(memory), keep)  # (B, N, V)
        if tgt_out is None:
            return logits, None
        loss = F.cross_entropy(  # eq. (eq-ed-loss): padding positions do not count
            logits.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=self.config.pad_id
        )
        return logits, loss

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """The memory ``(B, M, D)`` and ``keep`` ``(B, M)`` (``True`` = real token): the encoder's
        self-attention and (in :meth:`decode`) the cross-attention hide the padded source tokens.

        Implements: eq-ed-keymask"""
        c = self.config
        self._check(src, "src", c.src_len, c.src_vocab)
        keep = src != c.pad_id  # (B, M)
        mask = keep[:, None, :].expand(-1, src.shape[1], -1)  # (B, M, M): hide padded keys
        return self.encoder(self.src_pos(self.src_emb(src)), mask), keep

    def decode(
        self,
        tgt_in: Tensor,
        memory_kv: Sequence[MemoryKV],
        keep: Tensor,
        caches: Sequence[KVCache] | None = None,
    ) -> Tensor:
        """Logits ``(B, N, V)`` for the target tokens ``tgt_in`` given the memory's keys and values.

        Implements: eq-ed-head"""
        c = self.config
        start = len(caches[0]) if caches else 0
        self._check(tgt_in, "tgt_in", c.tgt_len - start, c.tgt_vocab)
        X = self.tgt_pos(self.tgt_emb(tgt_in), start=start)  # (B, N, D)
        memory_mask = keep[:, None, :].expand(-1, tgt_in.shape[1], -1)  # (B, N, M)
        return self.head(self.decoder(X, memory_kv, memory_mask, caches))  # (B, N, V)

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, bos: int, eos: int, use_cache: bool = True) -> Tensor:
        """Greedy decoding: ``(B, tgt_len)`` ids starting with ``bos``; after ``eos`` only padding.
        The encoder and the memory's keys and values run once; with ``use_cache`` each step runs only
        the newest token through the decoder.

        Implements: eq-ed-greedy, eq-ed-static
        """
        c = self.config
        with eval_mode(self):
            memory, keep = self.encode(src)
            memory_kv = self.decoder.memory_kv(memory)  # once per source sequence
            B = src.shape[0]
            out = torch.full((B, c.tgt_len), c.pad_id, dtype=torch.long, device=src.device)
            out[:, 0] = bos
            done = torch.zeros(B, dtype=torch.bool, device=src.device)
            caches = [KVCache(c.tgt_len) for _ in self.decoder.blocks] if use_cache else None
            for t in range(1, c.tgt_len):
                step_in = out[:, t - 1 : t] if use_cache else out[:, :t]
                nxt = self.decode(step_in, memory_kv, keep, caches)[:, -1].argmax(dim=-1)  # (B,)
                out[:, t] = torch.where(done, c.pad_id, nxt)
                done |= nxt == eos
                if done.all():
                    break
        return out

    def _check(self, ids: Tensor, name: str, limit: int, vocab: int) -> None:
        if ids.dim() != 2 or ids.dtype != torch.long:
            raise ValueError(
                f"{name} must be (B, length) token ids, got {ids.dtype} {tuple(ids.shape)}"
            )
        if ids.shape[1] > limit:
            field = "src_len" if name == "src" else "tgt_len"
            raise ValueError(
                f"{name} has {ids.shape[1]} tokens but the model has room for at most {limit}; "
                f"shorten it or build Seq2SeqConfig with a larger {field}"
            )
        if ids.numel() and (ids.min() < 0 or ids.max() >= vocab):
            raise ValueError(f"{name} ids must lie in [0, {vocab})")


# ---------------------------------------------------------------------------------------------------
# Beam search with length normalisation (Wu et al. 2016 sec. 7)


def length_penalty(length: Tensor | float, alpha: float) -> Tensor | float:
    r"""Wu et al. (2016)'s length penalty :math:`\mathrm{lp}_\alpha(|y|) = ((5 + |y|)/6)^\alpha`,
    where ``length`` counts the generated tokens, EOS included and BOS not.

    Implements: eq-ed-beam-score"""
    return ((5.0 + length) / 6.0) ** alpha


def _check_beam_args(
    model: Seq2Seq, src: Tensor, beam_size: int, max_len: int, alpha: float
) -> None:
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(
            f"beam_size must be a positive int (1 is greedy decoding), got {beam_size!r}"
        )
    most = model.config.tgt_len - 1  # BOS takes the first of the tgt_len positions
    if isinstance(max_len, bool) or not isinstance(max_len, int) or not 1 <= max_len <= most:
        raise ValueError(
            f"max_len counts the generated tokens (EOS included, BOS not) and must be an int in "
            f"[1, {most}] for this model (tgt_len - 1), got {max_len!r}"
        )
    if (
        isinstance(alpha, bool)
        or not isinstance(alpha, (int, float))
        or not 0 <= alpha < float("inf")
    ):
        raise ValueError(
            f"alpha must be a finite number >= 0 (0: no length normalisation; Wu et al. 2016 use "
            f"about 0.6), got {alpha!r}"
        )
    if src.dim() != 2:
        raise ValueError(f"src must be (B, M) token ids, got shape {tuple(src.shape)}")


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    src: Tensor,
    beam_size: int,
    max_len: int,
    alpha: float = 0.6,
    *,
    bos: int = DateTask.BOS,
    eos: int = DateTask.EOS,
) -> tuple[Tensor, Tensor]:
    r"""Beam search for a trained :class:`Seq2Seq`, all sources of the batch at once; the final
    choice is the finished hypothesis with the highest length-normalised score (Wu et al. 2016):

    .. math:: \mathrm{score}_\alpha(y \mid x) = \frac{\log p(y \mid x)}{\mathrm{lp}_\alpha(|y|)},
              \qquad \mathrm{lp}_\alpha(|y|) = \Big(\frac{5 + |y|}{6}\Big)^\alpha

    Implements: eq-ed-beam-score

    Every source has ``beam_size`` slots. Each step extends every live hypothesis by every token and
    keeps the ``beam_size`` best extensions, ranked by their sum of log-probabilities; a kept
    extension that ends in ``eos`` is finished: it is set aside for the final choice and its slot
    holds no live hypothesis, but the next step again keeps the ``beam_size`` best extensions of the
    hypotheses still live, so the slots fill up again. At ``max_len`` generated tokens every
    hypothesis still live is finished as it stands. The search stops there, or earlier when every
    kept extension of a step ends in ``eos`` (no hypothesis is live). The
    encoder and the memory's keys and values run once per source (as in :meth:`Seq2Seq.greedy_decode`);
    the decoder's self-attention caches are reordered after each step to follow the hypotheses kept.
    With ``beam_size=1`` this is greedy decoding; with a beam as wide as the number of possible
    outputs nothing is pruned and the result is the exhaustive optimum (:func:`exhaustive_search`).

    Args:
        model: the trained model (put in eval mode for the search).
        src: ``(B, M)`` source ids, padded with ``model.config.pad_id``.
        beam_size: live hypotheses kept per source, ``k >= 1``.
        max_len: the most tokens generated per source, EOS included and BOS not, in
            ``[1, tgt_len - 1]``.
        alpha: the length penalty's exponent, ``>= 0``; ``0`` ranks by ``log p(y | x)`` alone.
        bos, eos: the start and end tokens (those of :class:`.data.DateTask` by default).

    Returns:
        ``tokens`` ``(B, tgt_len)``, each row BOS, the chosen output and padding (as
        :meth:`Seq2Seq.greedy_decode` returns), and ``score`` ``(B,)``, its normalised score.

    Raises:
        ValueError: ``beam_size``, ``max_len`` or ``alpha`` out of range, or ``src`` not ``(B, M)``.
    """
    _check_beam_args(model, src, beam_size, max_len, alpha)
    c, k = model.config, beam_size
    B, device = src.shape[0], src.device
    with eval_mode(model):
        memory, keep = model.encode(src)  # once per source
        memory_kv = model.decoder.memory_kv(memory.repeat_interleave(k, dim=0))  # (B k, H, M, d_k)
        keep = keep.repeat_interleave(k, dim=0)  # (B k, M): slot j of source b is row b k + j
        caches = [KVCache(c.tgt_len) for _ in model.decoder.blocks]
        seqs = torch.full((B, k, 1), bos, dtype=torch.long, device=device)  # live hypotheses
        live = torch.full((B, k), -torch.inf, dtype=torch.float64, device=device)  # sum of log p
        live[:, 0] = 0.0  # one live hypothesis to start with: BOS alone
        best = torch.full((B,), -torch.inf, dtype=torch.float64, device=device)
        best_seq = torch.full((B, c.tgt_len), c.pad_id, dtype=torch.long, device=device)
        best_seq[:, 0] = bos
        rows = torch.arange(B, device=device)[:, None]
        for t in range(1, max_len + 1):
            logits = model.decode(seqs[:, :, -1].reshape(B * k, 1), memory_kv, keep, caches)
            log_p = torch.log_softmax(logits[:, -1].double(), dim=-1).view(B, k, -1)  # (B, k, |V|)
            n_vocab = log_p.shape[-1]  # |V|, the target vocabulary
            total = (live[..., None] + log_p).view(B, k * n_vocab)  # dead slots stay at -inf
            top, idx = total.topk(min(k, k * n_vocab), dim=-1)  # (B, k): the k best extensions
            parent, token = idx // n_vocab, idx % n_vocab
            seqs = torch.cat([seqs[rows, parent], token[..., None]], dim=-1)  # (B, k, t + 1)
            ends = torch.isfinite(top) & ((token == eos) | (t == max_len))  # finished now
            normed = torch.where(ends, top / length_penalty(float(t), alpha), -torch.inf)
            better, j = normed.max(dim=-1)  # the best hypothesis finished at this step
            take = better > best
            best = torch.where(take, better, best)
            best_seq[take, : t + 1] = seqs[take, j[take]]
            live = torch.where(ends, -torch.inf, top)  # finished: set aside, the slot dead
            if not torch.isfinite(live).any():
                break
            flat = (rows * k + parent).reshape(-1)  # (B k,): the row each kept hypothesis came from
            for cache in caches:  # follow the hypotheses kept
                cache.K, cache.V = cache.K[flat], cache.V[flat]
    return best_seq, best


@torch.no_grad()
def exhaustive_search(
    model: Seq2Seq,
    src: Tensor,
    max_len: int,
    alpha: float = 0.6,
    *,
    bos: int = DateTask.BOS,
    eos: int = DateTask.EOS,
) -> tuple[Tensor, Tensor]:
    r"""The exhaustive optimum of the normalised score: every possible output of at most ``max_len``
    tokens, scored, the best kept. A check for :func:`beam_search` with a tiny target vocabulary (it
    runs one full forward pass per unfinished prefix, :math:`\sum_{t < T_\text{max}} (|\mathcal{V}|
    - 1)^t` of them).

    The outputs are the leaves of the generation tree: every sequence that ends with ``eos`` within
    ``max_len`` tokens, and every sequence of ``max_len`` tokens without one. Each is scored with the
    whole model on its whole prefix (no cache) and with the length penalty written out. Returns what
    :func:`beam_search` returns.
    """
    _check_beam_args(model, src, 1, max_len, alpha)
    c = model.config
    out = torch.full((src.shape[0], c.tgt_len), c.pad_id, dtype=torch.long)
    scores = torch.empty(src.shape[0], dtype=torch.float64)
    with eval_mode(model):
        for b in range(src.shape[0]):
            best, best_y = -math.inf, []
            prefixes = torch.full((1, 1), bos, device=src.device)  # the unfinished prefixes
            sums = torch.zeros(1, dtype=torch.float64, device=src.device)  # their sum of log p
            for t in range(1, max_len + 1):
                n = prefixes.shape[0]  # every prefix of t - 1 tokens, one full pass each
                logits = model(src[b : b + 1].expand(n, -1), prefixes)[0][:, -1].double()
                total = sums[:, None] + torch.log_softmax(logits, dim=-1)  # (n, V)
                leaf = torch.zeros_like(total, dtype=torch.bool)
                leaf[:, eos] = True  # ending with EOS, or reaching max_len, makes a leaf
                if t == max_len:
                    leaf[:] = True
                for i, w in leaf.nonzero().tolist():
                    score = total[i, w].item() / ((5 + t) / 6) ** alpha  # (eq-ed-beam-score)
                    if score > best:
                        best, best_y = score, [*prefixes[i].tolist(), w]
                grow = (~leaf).nonzero()  # (n', 2): prefix and token of every unfinished one
                prefixes = torch.cat([prefixes[grow[:, 0]], grow[:, 1:]], dim=1)
                sums = total[grow[:, 0], grow[:, 1]]
            out[b, : len(best_y)] = torch.tensor(best_y)
            scores[b] = best
    return out.to(src.device), scores.to(src.device)


# ---------------------------------------------------------------------------------------------------
# The recipe: human-written dates into ISO dates


@dataclass(frozen=True)
class DatesRecipe(Recipe):
    """How to train a :class:`Seq2Seq` on :class:`.data.DateTask`: ``n_train`` random (date, format)
    pairs; the test set holds inputs never seen in training."""

    d_model: int = 64
    H: int = 4
    n_encoder_layers: int = 1
    n_decoder_layers: int = 1
    n_train: int = 50_000


DATES_RECIPE = DatesRecipe(
    train=TrainConfig(
        max_steps=400, lr=3e-3, warmup_steps=40, weight_decay=0.01, eval_interval=200,
        time_budget_s=60.0,
    ),
    batch_size=128,
)  # fmt: skip
"""The CPU recipe for dates (``bench/seq2seq.py``'s target: exact match >= 0.99 on held-out dates).

Width 64, four heads, one encoder and one decoder block (a single cross-attention layer, whose
alignment maps chapter 8 reads); 400 steps of 128 pairs, about 40 s of CPU time on one core.
``time_budget_s=60`` stops training early on a machine too slow or too busy for that; the chapter and
its lab lift it (``with_train(time_budget_s=None)``) so that every step is taken."""


@dataclass
class DatesRun:
    """A trained date model, its task and training data."""

    model: Seq2Seq
    task: DateTask
    history: History
    train_pairs: list[tuple[str, str]]


@reusable_run  # the chapter and its lab make the same run: `make test` trains it once
def train_dates(
    recipe: DatesRecipe = DATES_RECIPE,
    device: torch.device | str = "cpu",
    steps: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> DatesRun:
    """Train a :class:`Seq2Seq` on human-written dates with ``recipe`` (``steps`` shortens it).

    The one training run of chapter 8, its lab and ``bench/seq2seq.py``. Training pairs are drawn with
    seed 1 (:meth:`.data.DateTask.held_out` excludes their inputs from a test set). Each step is
    teacher forced: the target is shifted into decoder input and expected output.

    Implements: eq-ed-shift
    """
    recipe = recipe.with_steps(steps)
    torch.manual_seed(seed)
    task = DateTask()
    pairs = task.sample(recipe.n_train, seed=1)
    src, tgt = (t.to(device) for t in task.tensors(pairs))
    config = Seq2SeqConfig(
        task.vocab_size, task.vocab_size, task.src_len, task.tgt_len, recipe.d_model, recipe.H,
        recipe.n_encoder_layers, recipe.n_decoder_layers,
    )  # fmt: skip
    model = Seq2Seq(config).to(device)
    B = recipe.batch_size

    def next_batch(g: torch.Generator) -> tuple[Tensor, Tensor]:
        i = torch.randint(0, len(src), (B,), generator=g).to(device)
        return src[i], tgt[i]

    def loss_fn(m: Seq2Seq, batch: tuple[Tensor, Tensor]) -> Tensor:
        s, t = batch
        return m(s, t[:, :-1], t[:, 1:])[1]  # teacher forcing: predict t[1:] from t[:-1]

    history = train(
        model, next_batch, loss_fn, dataclasses.replace(recipe.train, seed=seed), progress=progress
    )
    return DatesRun(model, task, history, pairs)


def exact_match(model: Seq2Seq, task: DateTask, pairs: Sequence[tuple[str, str]]) -> float:
    """Fraction of ``(input, ISO date)`` pairs whose greedy, cached decoding equals the ISO date.

    Implements: eq-ed-exact"""
    device = next(model.parameters()).device
    src, _ = (t.to(device) for t in task.tensors(list(pairs)))
    out = model.greedy_decode(src, task.BOS, task.EOS)
    return sum(task.decode(o) == iso for o, (_, iso) in zip(out, pairs, strict=True)) / len(pairs)
