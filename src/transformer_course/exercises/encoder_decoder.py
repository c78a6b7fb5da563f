"""Exercises of the *Encoder-decoder* lab: shifted targets for teacher forcing, the key padding mask,
cross-attention from scratch, the decoder's causal + padding mask, the length-normalised score with
which beam search chooses a finished hypothesis, and a whole encoder-decoder assembled from the
package's blocks (``encoder_decoder.seq2seq``).

Chapter: *Encoder-decoder* (Dramko 2025 sec. 5.1-5.2; Turner 2023 sec. 4.3; Vaswani et al. 2017).
Token ids follow :class:`transformer_course.data.DateTask`: ``0`` is padding, ``1`` is BOS, ``2`` is
EOS. Masks are bool, ``True`` = may attend, as everywhere in the package.

The checker reports a wrong answer by subtracting it from the reference, which bool tensors do not
support, so the two mask exercises register a view of their solution that returns the mask as 0/1
float64 (:func:`_compared_as_float`); a learner may return a bool or a 0/1 tensor. The bool solution
itself is ``key_padding_mask.__wrapped__`` (and is what ``tc.exercises.solution`` prints).

The assembly exercise's answer is a class, ``Seq2Seq(config)``, built from the package's embedding,
position, :class:`~transformer_course.block.TransformerStack` and
:class:`~transformer_course.encoder_decoder.Decoder` classes under fixed submodule names. Its checker
(:class:`AssemblyExercise`) builds the package's ``Seq2Seq`` with the same config and seeded weights
(:func:`package_seq2seq`), loads them into the learner's model by name, and compares the logits in
float64 on fixed batches of padded dates. Each typical wrong assembly (:data:`SEQ2SEQ_MISTAKES`) is a
wrong model built from the same weights; when none explains the difference, :func:`locate_seq2seq`
follows both models with forward hooks and names the first part that receives something different.
"""

from __future__ import annotations

import functools
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..block import LayerNorm, PreNormBlock, TransformerStack
from ..data import DateTask
from ..encoder_decoder import Decoder, Seq2SeqConfig
from ..encoder_decoder import Seq2Seq as PackageSeq2Seq
from ..position import LearnedPositionalEmbedding
from . import _REGISTRY, ClassExercise, Exercise, Mistake, exercise, randn

PAD, BOS, EOS = DateTask.PAD, DateTask.BOS, DateTask.EOS


def _compared_as_float(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """The mask returned by ``fn`` as float64 0/1, so the checker can subtract and report errors."""

    @functools.wraps(fn)  # inspect.getsource (and so tc.exercises.solution) shows ``fn`` itself
    def as_float(*args):
        return torch.as_tensor(fn(*args)).to(torch.float64)

    return as_float


def _padded_targets(gen: torch.Generator, B: int, T: int) -> Tensor:
    """``(B, T)`` targets: random character ids, then EOS, then PAD; lengths differ across rows."""
    y = torch.randint(3, 20, (B, T), generator=gen)
    lengths = torch.randint(1, T, (B,), generator=gen)  # characters before EOS
    lengths[0] = T - 1  # one row fills the whole width: it ends with EOS, no padding
    for b, n in enumerate(lengths.tolist()):
        y[b, n] = EOS
        y[b, n + 1 :] = PAD
    return y


# ---------------------------------------------------------------------------------------------------
# 1. Teacher forcing: the decoder reads the target shifted right by one (Dramko 2025 sec. 5.2.1)


def _shift_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, int]:
    B, T = ((3, 6), (4, 9), (2, 5))[trial % 3]
    return _padded_targets(gen, B, T), BOS


def _shifted_right(y: Tensor, first: int) -> Tensor:
    return torch.cat([torch.full_like(y[:, :1], first), y[:, :-1]], dim=1)


def _shifted_left(y: Tensor) -> Tensor:
    return torch.cat([y[:, 1:], torch.full_like(y[:, :1], PAD)], dim=1)


@exercise(
    name="encoder_decoder.shift_targets",
    prompt=(
        "y is a (B, T) tensor of target token ids: each row holds y_1..y_n, then EOS (2), then "
        "padding (0). Return torch.stack([tgt_in, tgt_out]) of shape (2, B, T) for teacher forcing: "
        "the decoder reads tgt_in = [bos, y_1, ..., y_{T-1}] and is scored against "
        "tgt_out = [y_1, ..., y_T], so that position n predicts the token after the ones it has read."
    ),
    make_inputs=_shift_inputs,
    mistakes=[
        Mistake(
            "the targets are not shifted: tgt_in equals tgt_out, so at every position the decoder reads "
            "the very token it must predict (and learns to copy it). Prepend bos to the decoder input "
            "and drop its last token.",
            lambda y, bos: torch.stack([y, y]),
        ),
        Mistake(
            "you shifted the wrong way: the decoder input must start with bos and lag one step behind "
            "the targets (tgt_in = [bos, y_1..y_{T-1}], tgt_out = y), not the other way round.",
            lambda y, bos: torch.stack([y, _shifted_right(y, bos)]),
        ),
        Mistake(
            "tgt_in is the targets shifted left ([y_2, ..., y_T, pad]): the decoder would read the "
            "future. Shift right instead, inserting bos in front: [bos, y_1, ..., y_{T-1}].",
            lambda y, bos: torch.stack([_shifted_left(y), y]),
        ),
        Mistake(
            "the first decoder input is padding, not bos: the first prediction needs a start token "
            "that the loss and the masks do not treat as padding.",
            lambda y, bos: torch.stack([_shifted_right(y, PAD), y]),
        ),
    ],
)
def shift_targets(y: Tensor, bos: int) -> Tensor:
    tgt_in = torch.cat([torch.full_like(y[:, :1], bos), y[:, :-1]], dim=1)  # (B, T): shifted right
    tgt_out = y  # (B, T): position n is scored on y_{n+1} (1-based: y_n after reading y_{<n})
    return torch.stack([tgt_in, tgt_out])  # (2, B, T)


# ---------------------------------------------------------------------------------------------------
# 2. The key padding mask of the encoder's self-attention (Vaswani et al. 2017)


def _padded_sources(gen: torch.Generator, trial: int) -> tuple[Tensor, int]:
    B, M = ((3, 7), (2, 10), (4, 5))[trial % 3]
    src = torch.randint(3, 20, (B, M), generator=gen)
    lengths = torch.randint(1, M, (B,), generator=gen)  # every row has at least one real token
    lengths[0] = M  # and one row has no padding at all
    for b, n in enumerate(lengths.tolist()):
        src[b, n:] = PAD
    return src, PAD


@exercise(
    name="encoder_decoder.key_padding_mask",
    prompt=(
        "src is a (B, M) tensor of source token ids, right-padded with pad_id. Return the bool mask "
        "(B, M, M) of the encoder's self-attention: mask[b, n, m] is True when query n may attend to "
        "key m, i.e. when token m of sequence b is not padding (every query, padded or not, may look "
        "at every real token)."
    ),
    make_inputs=_padded_sources,
    mistakes=[
        Mistake(
            "you masked the queries instead of the keys: mask[b, n, m] must depend on the key m "
            "(src[b, m] != pad_id), broadcast along the query axis n, e.g. keep[:, None, :].",
            lambda src, pad: (src != pad)[:, :, None].expand(-1, -1, src.shape[1]),
        ),
        Mistake(
            "True and False are swapped: True means 'may attend', so real tokens are True and padding "
            "is False (src != pad_id, not src == pad_id).",
            lambda src, pad: (src == pad)[:, None, :].expand(-1, src.shape[1], -1),
        ),
        Mistake(
            "you returned the (B, M) vector of real tokens; the attention mask needs a query axis: "
            "keep[:, None, :].expand(B, M, M).",
            lambda src, pad: src != pad,
        ),
    ],
)
@_compared_as_float
def key_padding_mask(src: Tensor, pad_id: int) -> Tensor:
    keep = src != pad_id  # (B, M): True at real tokens
    M = src.shape[1]
    return keep[:, None, :].expand(-1, M, -1)  # (B, M, M): row n = query n, the same for every n


# ---------------------------------------------------------------------------------------------------
# 3. Cross-attention from scratch (Vaswani et al. 2017 sec. 3.2.3; Dramko 2025 sec. 5.1.3)


def _cross_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, ...]:
    B, N, M, D, H = ((2, 4, 7, 6, 2), (1, 5, 3, 8, 4), (3, 6, 9, 4, 2))[trial % 3]

    def r(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    return r(B, N, D), r(B, M, D), r(D, D) / math.sqrt(D), r(D, D), r(D, D), r(D, D), H


def _mh(Q: Tensor, K: Tensor, V: Tensor, W_o: Tensor, H: int, scale: float | None = None) -> Tensor:
    """Multi-head attention on already projected ``Q (B, N, D)``, ``K``, ``V (B, M, D)``."""
    B, N, D = Q.shape
    d_k = D // H

    def split(T: Tensor) -> Tensor:
        return T.reshape(B, T.shape[1], H, d_k).transpose(1, 2)  # (B, H, len, d_k)

    Qh, Kh, Vh = split(Q), split(K), split(V)
    scale = 1 / math.sqrt(d_k) if scale is None else scale
    A = torch.softmax(Qh @ Kh.transpose(-2, -1) * scale, dim=-1)  # (B, H, N, M)
    return (A @ Vh).transpose(1, 2).reshape(B, N, D) @ W_o  # (B, N, D)


@exercise(
    name="encoder_decoder.cross_attention",
    prompt=(
        "Multi-head cross-attention without the package. X (B, N, D) is the decoder stream, memory "
        "(B, M, D) the encoder's output; W_q, W_k, W_v, W_o are (D, D) and H divides D. Head h uses "
        "columns h*d_k:(h+1)*d_k of W_q, W_k, W_v (d_k = D // H). Queries come from X, keys and values "
        "from memory: head_h = softmax(Q_h K_h^T / sqrt(d_k)) V_h. Return [head_1, ..., head_H] W_o, "
        "shape (B, N, D)."
    ),
    make_inputs=_cross_inputs,
    mistakes=[
        Mistake(
            "your keys and values come from the decoder stream X, so the layer is self-attention and "
            "never reads the source (a literal reading of Dramko 2025 sec. 5.1.3). In cross-attention "
            "only the queries come from X; K = memory W_k and V = memory W_v.",
            lambda X, mem, W_q, W_k, W_v, W_o, H: _mh(X @ W_q, X @ W_k, X @ W_v, W_o, H),
        ),
        Mistake(
            "queries and keys/values are swapped: the queries must come from the decoder stream X (one "
            "output row per target position) and the keys and values from memory.",
            lambda X, mem, W_q, W_k, W_v, W_o, H: _mh(mem @ W_q, X @ W_k, X @ W_v, W_o, H),
        ),
        Mistake(
            "the scale uses the model width D; each head's scores are divided by sqrt(d_k) with "
            "d_k = D // H.",
            lambda X, mem, W_q, W_k, W_v, W_o, H: _mh(
                X @ W_q, mem @ W_k, mem @ W_v, W_o, H, 1 / math.sqrt(X.shape[-1])
            ),
        ),
        Mistake(
            "the 1/sqrt(d_k) scale is missing: divide each head's scores Q_h K_h^T by sqrt(d_k).",
            lambda X, mem, W_q, W_k, W_v, W_o, H: _mh(X @ W_q, mem @ W_k, mem @ W_v, W_o, H, 1.0),
        ),
    ],
)
def cross_attention(
    X: Tensor, memory: Tensor, W_q: Tensor, W_k: Tensor, W_v: Tensor, W_o: Tensor, H: int
) -> Tensor:
    D = X.shape[-1]
    d_k = D // H
    Q, K, V = X @ W_q, memory @ W_k, memory @ W_v  # (B, N, D), (B, M, D), (B, M, D)
    heads = []
    for h in range(H):
        cols = slice(h * d_k, (h + 1) * d_k)  # head h's features
        S = Q[..., cols] @ K[..., cols].transpose(-2, -1) / math.sqrt(d_k)  # (B, N, M)
        heads.append(torch.softmax(S, dim=-1) @ V[..., cols])  # (B, N, d_k)
    return torch.cat(heads, dim=-1) @ W_o  # (B, N, D)


# ---------------------------------------------------------------------------------------------------
# 4. The decoder's self-attention mask: causal and padding together


def _decoder_tokens(gen: torch.Generator, trial: int) -> tuple[Tensor, int]:
    """Rows padded on the left (as when batching prompts of different lengths) or on the right."""
    B, N = ((3, 6), (4, 8), (2, 5))[trial % 3]
    tokens = torch.randint(3, 20, (B, N), generator=gen)
    for b in range(B):
        n_pad = int(torch.randint(1, N - 1, (1,), generator=gen))
        if b % 2 == 0:
            tokens[b, :n_pad] = PAD  # left padding: padded keys lie in every query's past
        else:
            tokens[b, N - n_pad :] = PAD
    return tokens, PAD


def _causal(N: int) -> Tensor:
    return torch.ones(N, N, dtype=torch.bool).tril()  # (N, N): key m <= query n


@exercise(
    name="encoder_decoder.causal_padding_mask",
    prompt=(
        "tokens is a (B, N) tensor of decoder input ids, padded with pad_id on the left or on the "
        "right. Return the bool self-attention mask (B, N, N): mask[b, n, m] is True when query n may "
        "attend to key m, i.e. when m <= n (no peeking at the future) AND token m is not padding."
    ),
    make_inputs=_decoder_tokens,
    mistakes=[
        Mistake(
            "the padding is not masked: with left padding the padded keys lie in the past of every "
            "query. Combine the causal mask with the key mask (tokens != pad_id)[:, None, :] using &.",
            lambda t, pad: _causal(t.shape[1]).expand(t.shape[0], -1, -1),
        ),
        Mistake(
            "the causal part is missing: query n may only see keys m <= n (a lower-triangular mask).",
            lambda t, pad: (t != pad)[:, None, :].expand(-1, t.shape[1], -1),
        ),
        Mistake(
            "the causal mask points the wrong way (upper triangular): query n may see keys m <= n, so "
            "keep the lower triangle, torch.tril.",
            lambda t, pad: _causal(t.shape[1]).T & (t != pad)[:, None, :],
        ),
        Mistake(
            "you combined the masks with OR; a key must be both in the past AND a real token (&).",
            lambda t, pad: _causal(t.shape[1]) | (t != pad)[:, None, :],
        ),
        Mistake(
            "the padding mask is applied to the queries (rows) instead of the keys (columns): use "
            "(tokens != pad_id)[:, None, :].",
            lambda t, pad: _causal(t.shape[1]) & (t != pad)[:, :, None],
        ),
    ],
)
@_compared_as_float
def causal_padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    N = tokens.shape[1]
    causal = torch.ones(N, N, dtype=torch.bool, device=tokens.device).tril()  # (N, N): m <= n
    keep = tokens != pad_id  # (B, N): real tokens
    return causal & keep[:, None, :]  # (B, N, N): both conditions, key axis last


# ---------------------------------------------------------------------------------------------------
# 5. Beam search: the length-normalised score of finished hypotheses (Wu et al. 2016 sec. 7)


def _finished_hypotheses(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, float]:
    """``tokens (K, N + 1)``: BOS, characters, EOS, padding; ``log_probs (K, N)``: the log-probability
    of each token after BOS, with junk (what a batched decoder leaves there) at padded positions."""
    K, N = ((4, 6), (5, 8), (3, 5))[trial % 3]
    y = _padded_targets(gen, K, N)  # (K, N): row 0 fills the width, the others are padded
    y[1, 0], y[1, 1:] = EOS, PAD  # one hypothesis that stopped at once: |y| = 1
    tokens = torch.cat([torch.full((K, 1), BOS), y], dim=1)
    log_probs = -3 * torch.rand(K, N, generator=gen, dtype=torch.float64) - 0.05
    alpha = 0.5 + 0.5 * float(torch.rand((), generator=gen, dtype=torch.float64))
    return tokens, log_probs, alpha


def _masked(tokens: Tensor, log_probs: Tensor) -> tuple[Tensor, Tensor]:
    """The real tokens' mask ``(K, N)`` (EOS included, BOS and padding not) and ``|y|`` ``(K,)``."""
    real = tokens[:, 1:] != PAD
    return real, real.sum(dim=1).to(log_probs.dtype)


def _wu(length: Tensor, alpha: float) -> Tensor:
    return ((5 + length) / 6) ** alpha


def _score_without_eos(tokens: Tensor, log_probs: Tensor, alpha: float) -> Tensor:
    real = (tokens[:, 1:] != PAD) & (tokens[:, 1:] != EOS)
    return (log_probs * real).sum(dim=1) / _wu(real.sum(dim=1).to(log_probs.dtype), alpha)


@exercise(
    name="encoder_decoder.beam_scores",
    prompt=(
        "Beam search has finished K hypotheses and must choose one. tokens (K, N + 1) holds each: BOS "
        "(1), the generated tokens ending with EOS (2), then padding (0). log_probs (K, N) holds "
        "log p of tokens[:, 1:], each given what precedes it; at padded positions it holds junk that "
        "must not count. Return the (K,) length-normalised scores of Wu et al. (2016): "
        "log p(y | x) / ((5 + |y|) / 6) ** alpha, where log p(y | x) is the sum of the log-"
        "probabilities of the generated tokens (EOS included) and |y| counts those tokens (EOS "
        "included, BOS and padding not). Beam search keeps the hypothesis with the highest score."
    ),
    make_inputs=_finished_hypotheses,
    mistakes=[
        Mistake(
            "there is no length normalisation: you returned log p(y | x) itself, which favours short "
            "hypotheses (every token adds a negative log-probability). Divide by "
            "((5 + |y|) / 6) ** alpha.",
            lambda t, lp, a: (lp * _masked(t, lp)[0]).sum(dim=1),
        ),
        Mistake(
            "|y| counts BOS: the penalty counts the generated tokens only (EOS included), the ones "
            "whose log-probabilities are summed; BOS is given, not generated.",
            lambda t, lp, a: (lp * _masked(t, lp)[0]).sum(dim=1) / _wu(_masked(t, lp)[1] + 1, a),
        ),
        Mistake(
            "|y| counts the padding: every hypothesis gets the length of the whole tensor. Count only "
            "the real tokens, tokens[:, 1:] != PAD.",
            lambda t, lp, a: (
                (lp * _masked(t, lp)[0]).sum(dim=1) / _wu(lp.new_tensor(lp.shape[1]), a)
            ),
        ),
        Mistake(
            "the log-probabilities at padded positions are summed too: they are junk left by batched "
            "decoding, not part of the hypothesis. Mask them out before summing.",
            lambda t, lp, a: lp.sum(dim=1) / _wu(_masked(t, lp)[1], a),
        ),
        Mistake(
            "EOS is left out (of the sum, of the length or both): the decision to stop is a token "
            "the model predicted, with its own probability, and counts in both.",
            _score_without_eos,
        ),
        Mistake(
            "you multiplied probabilities and normalised the product: the score divides the sum of "
            "log-probabilities, log p(y | x), by the penalty, not the probability p(y | x) (a product "
            "of many probabilities also underflows).",
            lambda t, lp, a: (lp * _masked(t, lp)[0]).sum(dim=1).exp() / _wu(_masked(t, lp)[1], a),
        ),
        Mistake(
            "the penalty is |y| ** alpha, another normalisation in use; this exercise and the chapter "
            "use Wu et al.'s ((5 + |y|) / 6) ** alpha, which equals 1 at |y| = 1.",
            lambda t, lp, a: (lp * _masked(t, lp)[0]).sum(dim=1) / _masked(t, lp)[1] ** a,
        ),
    ],
)
def beam_scores(tokens: Tensor, log_probs: Tensor, alpha: float) -> Tensor:
    real = tokens[:, 1:] != PAD  # (K, N): the generated tokens, EOS included; BOS is column 0
    log_p = (log_probs * real).sum(dim=1)  # (K,): log p(y | x), junk at padded positions dropped
    length = real.sum(dim=1).to(log_probs.dtype)  # (K,): |y|
    return log_p / ((5 + length) / 6) ** alpha  # (K,)


# ---------------------------------------------------------------------------------------------------
# 6. Assemble the encoder-decoder from the package's blocks (the chapter's model equation; Vaswani et
#    al. 2017 sec. 3; Dramko 2025 sec. 5.1)


class Seq2Seq(nn.Module):
    """An encoder-decoder assembled from the package's blocks (D = config.d_model, H = config.H).

    Submodules (the checker loads the package's weights into them by these names):
        src_emb = nn.Embedding(config.src_vocab, D)                      E_src
        tgt_emb = nn.Embedding(config.tgt_vocab, D)                      E_tgt
        src_pos = LearnedPositionalEmbedding(config.src_len, D)          R_src
        tgt_pos = LearnedPositionalEmbedding(config.tgt_len, D)          R_tgt
        encoder = TransformerStack(PreNormBlock, config.n_encoder_layers, D, H, activation="gelu")
        decoder = Decoder(config.n_decoder_layers, D, H, activation="gelu")
        head = nn.Linear(D, config.tgt_vocab, bias=False)                W_vocab
    Padding is token config.pad_id.
    forward(src (B, M), tgt (B, N + 1)) -> logits (B, N, config.tgt_vocab):
        tgt is [BOS, y_1, ..., EOS] as task.tensors returns it; the decoder reads tgt[:, :-1], and
        row n of the logits scores the next token, tgt[:, n + 1].
    """

    def __init__(self, config):
        super().__init__()
        c, D = config, config.d_model
        self.pad_id = c.pad_id
        self.src_emb = nn.Embedding(c.src_vocab, D)  # E_src
        self.tgt_emb = nn.Embedding(c.tgt_vocab, D)  # E_tgt
        self.src_pos = LearnedPositionalEmbedding(c.src_len, D)  # R_src
        self.tgt_pos = LearnedPositionalEmbedding(c.tgt_len, D)  # R_tgt
        self.encoder = TransformerStack(
            PreNormBlock, c.n_encoder_layers, D, c.H, activation="gelu"
        )  # no causal mask: the source is known in full
        self.decoder = Decoder(c.n_decoder_layers, D, c.H, activation="gelu")  # causal inside
        self.head = nn.Linear(D, c.tgt_vocab, bias=False)  # W_vocab, not tied to E_tgt

    def forward(self, src, tgt):
        keep = src != self.pad_id  # (B, M): True at real source tokens
        M, N = src.shape[1], tgt.shape[1] - 1
        mask_enc = keep[:, None, :].expand(-1, M, -1)  # (B, M, M): no query reads a padded key
        memory = self.encoder(self.src_pos(self.src_emb(src)), mask_enc)  # X_mem: (B, M, D)
        tgt_in = tgt[:, :-1]  # (B, N): the target shifted right, BOS first (teacher forcing)
        X = self.tgt_pos(self.tgt_emb(tgt_in))  # X^(0) = E_tgt[y_in] + R_tgt: (B, N, D)
        memory_kv = self.decoder.memory_kv(memory)  # every block's keys and values of X_mem
        mask_cross = keep[:, None, :].expand(-1, N, -1)  # (B, N, M): the same padded keys hidden
        X = self.decoder(X, memory_kv, mask_cross)  # LN(X^(L_d)): (B, N, D)
        return self.head(X)  # (B, N, tgt_vocab)


class _Assembly(Seq2Seq):
    """Wrong assemblies: the reference's parameters, one class attribute per mistake."""

    reads = "shifted"  # the decoder's input: "shifted" tgt[:, :-1], "answers" tgt[:, 1:], "all" tgt
    cross_reads = "memory"  # what cross-attention reads: "memory", "decoder" or "source" (embedded)
    encoder_mask = True
    cross_mask = True
    source_positions = True
    target_positions = True
    target_table = "tgt"  # "src": the target looked up in the source's table
    final_norm = True
    causal_encoder = False
    activation = "gelu"

    def __init__(self, config):
        super().__init__(config)
        for block in self.encoder.blocks:
            block.attn.causal = self.causal_encoder
        if self.activation != "gelu":
            for block in [*self.encoder.blocks, *self.decoder.blocks]:
                block.mlp.act = F.relu

    def forward(self, src, tgt):
        keep = src != self.pad_id
        M = src.shape[1]
        tgt_in = {"shifted": tgt[:, :-1], "answers": tgt[:, 1:], "all": tgt}[self.reads]
        N = tgt_in.shape[1]
        S = self.src_emb(src)
        S = self.src_pos(S) if self.source_positions else S
        memory = self.encoder(S, keep[:, None, :].expand(-1, M, -1) if self.encoder_mask else None)
        X = (self.tgt_emb if self.target_table == "tgt" else self.src_emb)(tgt_in)
        X = self.tgt_pos(X) if self.target_positions else X
        read = {"memory": memory, "decoder": X, "source": S}[self.cross_reads]
        mask = keep[:, None, :].expand(-1, N, -1)
        if not self.cross_mask or self.cross_reads == "decoder":
            mask = None  # (reading the decoder stream, the source's mask no longer fits)
        for block, kv in zip(self.decoder.blocks, self.decoder.memory_kv(read), strict=True):
            X = block(X, kv, mask)
        return self.head(self.decoder.final_norm(X) if self.final_norm else X)


def _wrong(name: str, **attrs) -> type:
    """A subclass of :class:`_Assembly` with some attributes changed: one typical mistake."""
    return type(name, (_Assembly,), attrs)


SEQ2SEQ_MISTAKES = [
    Mistake(
        "the decoder reads the very tokens it must predict (tgt[:, 1:]): with teacher forcing the "
        "decoder's input is the target shifted right behind BOS, tgt_in = tgt[:, :-1], and row n is "
        "scored against tgt[:, n + 1].",
        _wrong("NotShifted", reads="answers"),
    ),
    Mistake(
        "the decoder reads the whole target, BOS to the last token, so you return one row too many: "
        "it reads tgt_in = tgt[:, :-1] (the last token is never an input, only a target) and returns "
        "(B, N, |V|) logits for N = tgt.shape[1] - 1.",
        _wrong("WholeTarget", reads="all"),
    ),
    Mistake(
        "cross-attention reads the decoder's own stream (its keys and values come from the target), "
        "so the model never sees the source: compute them from the encoder's output, "
        "self.decoder.memory_kv(memory).",
        _wrong("CrossReadsDecoder", cross_reads="decoder"),
    ),
    Mistake(
        "cross-attention reads the encoder's input (the embedded source) instead of its output: "
        "memory = self.encoder(...) is what every decoder block attends to, "
        "self.decoder.memory_kv(memory).",
        _wrong("CrossReadsEncoderInput", cross_reads="source"),
    ),
    Mistake(
        "cross-attention is given no mask, so every target position also reads the padded source "
        "tokens: pass the source's key mask to the decoder, keep[:, None, :].expand(-1, N, -1) "
        "with keep = src != pad_id (shape (B, N, M)).",
        _wrong("NoCrossMask", cross_mask=False),
    ),
    Mistake(
        "the encoder's self-attention is given no mask, so real source tokens read the padding: "
        "pass keep[:, None, :].expand(-1, M, -1) (shape (B, M, M), keep = src != pad_id) to "
        "self.encoder.",
        _wrong("NoEncoderMask", encoder_mask=False),
    ),
    Mistake(
        "positions are added to the source only: the target needs its own positions too, "
        "X = self.tgt_pos(self.tgt_emb(tgt_in)).",
        _wrong("SourcePositionsOnly", target_positions=False),
    ),
    Mistake(
        "positions are added to the target only: without self.src_pos the encoder sees the source "
        "as a set of characters (the order of '07/08' and '08/07' is lost).",
        _wrong("TargetPositionsOnly", source_positions=False),
    ),
    Mistake(
        "the target is looked up in the source's table (self.src_emb); the decoder's tokens have "
        "their own table, self.tgt_emb.",
        _wrong("TargetInSourceTable", target_table="src"),
    ),
    Mistake(
        "the decoder's final LayerNorm is missing: looping over self.decoder.blocks yourself skips "
        "self.decoder.final_norm, which Decoder.forward applies before the head (a pre-norm stream "
        "is never normalised otherwise). Call self.decoder(X, memory_kv, mask), or apply it.",
        _wrong("NoFinalNorm", final_norm=False),
    ),
    Mistake(
        "your encoder is causal (TransformerStack(..., causal=True), as in a GPT): the source is "
        "known in full, so each source token may read every real source token, before and after.",
        _wrong("CausalEncoder", causal_encoder=True),
    ),
    Mistake(
        "the MLPs use ReLU, the blocks' default: the package's Seq2Seq builds its encoder and decoder "
        "with activation='gelu' (pass it to TransformerStack and to Decoder).",
        _wrong("ReLU", activation="relu"),
    ),
]


@lru_cache(maxsize=1)
def _date_task() -> DateTask:
    return DateTask()


def _seq2seq_cases() -> list[tuple[Seq2SeqConfig, Tensor, Tensor]]:
    """``(config, src, tgt)``: a batch of dates for two model sizes. In the first, every source is
    padded; the second crops the sources to the longest (one row has no padding), has two blocks on
    each side, and a source vocabulary larger than the target's (so swapped sizes do not load)."""
    task = _date_task()
    V = task.vocab_size
    src, tgt = task.tensors(task.sample(4, seed=11))
    src3, tgt3 = task.tensors(task.sample(3, seed=12))
    width = int((src3 != PAD).sum(dim=1).max())
    return [
        (Seq2SeqConfig(V, V, task.src_len, task.tgt_len, d_model=16, H=2, n_encoder_layers=1,
                       n_decoder_layers=1), src, tgt),
        (Seq2SeqConfig(V + 8, V, task.src_len, task.tgt_len, d_model=24, H=4, n_encoder_layers=2,
                       n_decoder_layers=2), src3[:, :width], tgt3),
    ]  # fmt: skip


def package_seq2seq(config: Seq2SeqConfig, seed: int = 0) -> PackageSeq2Seq:
    """The package's :class:`~transformer_course.encoder_decoder.Seq2Seq` for ``config``, float64, in
    evaluation mode, with seeded weights of order one (the checker's weights): matrices N(0, 1/fan_in),
    embedding and position tables N(0, 1), LayerNorm gains 1 + N(0, 0.2^2), biases N(0, 0.2^2), so
    every attention weight and every part of the model matters to the logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):  # the default initialisation is overwritten below
        model = PackageSeq2Seq(config).double().eval().requires_grad_(False)
    for module in model.modules():
        if isinstance(module, nn.Embedding):  # token tables; a position table holds one too
            module.weight.copy_(randn(gen, *module.weight.shape))
        elif isinstance(module, LayerNorm):
            module.weight.copy_(1 + 0.2 * randn(gen, *module.weight.shape))
            module.bias.copy_(0.2 * randn(gen, *module.bias.shape))
        elif isinstance(module, nn.Linear):  # nn.Linear stores (out, in)
            module.weight.copy_(randn(gen, *module.weight.shape) / math.sqrt(module.in_features))
            if module.bias is not None:
                module.bias.copy_(0.2 * randn(gen, *module.bias.shape))
    return model


class _Verdict(Exception):
    """What is wrong with an answer, found before its logits are compared."""


_PARTS = "src_emb, tgt_emb, src_pos, tgt_pos, encoder, decoder and head"


def _names(names: list[str], most: int = 6) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _name_verdict(missing: list[str], extra: list[str]) -> str:
    """Why the parameters' names do not fit the package's, as specifically as can be said."""
    if extra == ["head.bias"] and not missing:
        return "your head has a bias; the package's has none: nn.Linear(D, tgt_vocab, bias=False)."
    if missing and all(n.startswith("encoder.final_norm.") for n in missing) and not extra:
        return (
            "your encoder has no final LayerNorm: a TransformerStack of PreNormBlock ends with one "
            "(a stack of PostNormBlock does not); build the encoder from PreNormBlock."
        )
    said = [f"it has no parameter {_names(missing)}"] if missing else []
    said += [f"it has parameters the package's model does not: {_names(extra)}"] if extra else []
    return (
        f"your model's parameters do not have the lab's names ({'; '.join(said)}). The checker loads "
        f"the package's weights by name: build exactly the submodules {_PARTS} of the docstring, "
        "from the package's classes, with config's sizes (n_encoder_layers, n_decoder_layers, ...)."
    )


def _build(answer, package: PackageSeq2Seq) -> nn.Module:
    """``answer(config)`` in float64 and evaluation mode with ``package``'s weights loaded by name."""
    module = answer(package.config)
    if not isinstance(module, nn.Module):
        raise _Verdict(
            f"Seq2Seq(config) built a {type(module).__name__}, not an nn.Module: subclass nn.Module "
            "and call super().__init__() first."
        )
    state = package.state_dict()
    own = dict(module.named_parameters())
    missing = [k for k in state if k not in own]
    extra = [k for k in own if k not in state]
    if missing or extra:
        raise _Verdict(_name_verdict(missing, extra))
    for k, t in state.items():
        if own[k].shape != t.shape:
            raise _Verdict(
                f"`{k}` has shape {tuple(own[k].shape)} but the package's is {tuple(t.shape)}: "
                "take every size from config (src_vocab for the source, tgt_vocab for the target "
                "and the head, src_len and tgt_len for the position tables, d_model, H)."
            )
    module = module.double().eval()
    module.load_state_dict(state, strict=False)  # every parameter is in state; buffers are kept
    return module


def _logits(answer, package: PackageSeq2Seq, src: Tensor, tgt: Tensor) -> Tensor:
    """The logits of the model that ``answer`` builds, with ``package``'s weights."""
    module = _build(answer, package)
    with torch.no_grad():
        out = module(src.clone(), tgt.clone())
    if isinstance(out, tuple) and out and isinstance(out[0], Tensor):
        raise _Verdict(
            f"your forward returned a tuple of {len(out)}; return the logits alone, a tensor of "
            "shape (B, N, tgt_vocab) (the package's Seq2Seq also returns a loss; this one does not)."
        )
    return out


# What each part of the model is handed, recorded by hooks: (where, argument position, name).
_TAPS = {
    "enc_in": ("encoder.blocks.0", 0, "X"),
    "enc_mask": ("encoder.blocks.0", 1, "mask"),
    "memory": ("encoder", None, None),  # the encoder's output, when it is called as a whole
    "dec_in": ("decoder.blocks.0", 0, "X"),
    "memory_kv": ("decoder.blocks.0.cross_attn", 1, "memory_kv"),
    "cross_mask": ("decoder.blocks.0.cross_attn", 2, "mask"),
    "dec_out": ("decoder.blocks.-1", None, None),  # the last decoder block's output
    "head_in": ("head", 0, "input"),
}


def _trace(module: nn.Module, src: Tensor, tgt_in: Tensor | None, tgt: Tensor | None) -> dict:
    """What ``module``'s parts receive on one forward pass (``module(src, tgt_in)`` for the package's
    model, ``module(src, tgt)`` for the learner's): the first call of each part only."""
    seen: dict = {}
    hooks = []

    def part(path: str) -> nn.Module:
        *head, last = path.split(".")
        owner = module.get_submodule(".".join(head)) if head else module
        return owner[int(last)] if last.lstrip("-").isdigit() else getattr(owner, last)

    def record(key: str, pos: int | None, name: str | None):
        def pre(mod, args, kwargs):
            if key not in seen:
                seen[key] = args[pos] if len(args) > pos else kwargs.get(name)

        def post(mod, args, output):
            seen.setdefault(key, output)

        return pre, post

    try:
        for key, (path, pos, name) in _TAPS.items():
            pre, post = record(key, pos, name)
            if pos is None:
                hooks.append(part(path).register_forward_hook(post))
            else:
                hooks.append(part(path).register_forward_pre_hook(pre, with_kwargs=True))
        with torch.no_grad():
            module(src, tgt_in) if tgt is None else module(src, tgt)
    finally:
        for h in hooks:
            h.remove()
    return seen


def _agree(a, b, shape: tuple | None = None) -> bool:
    """Tensors (or pairs of tensors) equal within the checker's tolerance; a mask given as None or
    broadcastable is compared as the full bool mask of ``shape``."""
    if shape is not None:
        a, b = (
            torch.ones(shape, dtype=torch.bool)
            if m is None
            else torch.as_tensor(m).bool().expand(shape)
            for m in (a, b)
        )
        return torch.equal(a, b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_agree(x, y) for x, y in zip(a, b, strict=True))
    return (
        isinstance(a, Tensor)
        and isinstance(b, Tensor)
        and a.shape == b.shape
        and torch.allclose(a.double(), b.double(), atol=1e-10, rtol=1e-8)
    )


def locate_seq2seq(answer, package: PackageSeq2Seq, src: Tensor, tgt: Tensor) -> str | None:
    """Where the learner's model first departs from the package's: the first part whose input
    differs, found with forward hooks on both models (None when it cannot say)."""
    try:
        mine = _trace(_build(answer, package), src, None, tgt)
    except Exception:  # the learner's own classes, or a forward that raises
        return None
    ref = _trace(package, src, tgt[:, :-1], None)
    B, M = src.shape
    N = tgt.shape[1] - 1
    if "enc_in" not in mine:
        return "your forward never runs the encoder's blocks: memory = self.encoder(X, mask)."
    if not _agree(mine["enc_in"], ref["enc_in"]):
        return (
            "the encoder's input differs from E_src[x] + R_src: each source token enters as its row "
            "of self.src_emb plus its position's row of self.src_pos."
        )
    try:
        if not _agree(mine["enc_mask"], ref["enc_mask"], (B, M, M)):
            return (
                "the encoder's self-attention mask differs from mask_enc: query n may read key m "
                "exactly when source token m is real, keep[:, None, :].expand(-1, M, -1) with "
                "keep = src != pad_id, and no causal part."
            )
    except RuntimeError:
        return f"the encoder's mask cannot be broadcast to (B, M, M) = {(B, M, M)}."
    if "dec_in" not in mine:
        return "your forward never runs the decoder's blocks: self.decoder(X, memory_kv, mask)."
    if not _agree(mine["dec_in"], ref["dec_in"]):
        return (
            "the decoder's input differs from E_tgt[y_in] + R_tgt with y_in = tgt[:, :-1] (the "
            "target shifted right, BOS first): self.tgt_pos(self.tgt_emb(tgt[:, :-1]))."
        )
    if not _agree(mine.get("memory_kv"), ref["memory_kv"]):
        if "memory" in mine and not _agree(mine["memory"], ref["memory"]):
            return (
                "the encoder's output differs although its input and mask are right: build it as "
                "TransformerStack(PreNormBlock, n_encoder_layers, D, H, activation='gelu'), "
                "not causal."
            )
        return (
            "cross-attention's keys and values are not those of the memory X_mem: compute them from "
            "the encoder's output (after its final LayerNorm), self.decoder.memory_kv(memory)."
        )
    try:
        if not _agree(mine["cross_mask"], ref["cross_mask"], (B, N, M)):
            return (
                "cross-attention's mask differs from mask_cross: target position n may read source "
                "token m exactly when it is real, keep[:, None, :].expand(-1, N, -1)."
            )
    except RuntimeError:
        return f"the cross-attention mask cannot be broadcast to (B, N, M) = {(B, N, M)}."
    if not _agree(mine.get("dec_out"), ref["dec_out"]):
        return (
            "the decoder blocks' output differs although their inputs, the memory's keys and values "
            "and the masks are right: build the decoder as Decoder(n_decoder_layers, D, H, "
            "activation='gelu')."
        )
    if not _agree(mine.get("head_in"), ref["head_in"]):
        return (
            "the head's input differs from LN(X^(L_d)), the decoder's output after its final "
            "LayerNorm (self.decoder.final_norm, which Decoder.forward applies)."
        )
    return None


def _describe(config: Seq2SeqConfig, src: Tensor, tgt: Tensor) -> str:
    return (
        f"[case: src (B, M) = {tuple(src.shape)}, tgt (B, N + 1) = {tuple(tgt.shape)}, "
        f"D = {config.d_model}, H = {config.H}, L_e = {config.n_encoder_layers}, "
        f"L_d = {config.n_decoder_layers}]"
    )


@dataclass
class AssemblyExercise(ClassExercise):
    """An exercise whose answer is a model class: ``answer(config)`` must build an ``nn.Module`` with
    the package's parameter names; the checker loads the weights of :func:`package_seq2seq` into it
    and compares its logits on fixed batches of dates (:func:`_seq2seq_cases`) with the package's
    ``Seq2Seq``. A difference is explained by the first :class:`Mistake` (a wrong model, built from the
    same weights) whose logits equal the learner's, then by :func:`locate_seq2seq` (the first part of
    the model whose input differs), then by the generic diagnoses of :class:`Exercise`.

    ``trials`` is 0 because the cases are fixed batches, not the random inputs of ``make_inputs``;
    ``tests/test_encoder_decoder.py`` proves case by case that every mistake differs from the solution
    and from every other mistake."""

    example: str = "Seq2Seq"

    trials: int = 0
    cases: Callable[[], list] = _seq2seq_cases

    def _check_answer(self, answer):
        wrong = [  # each mistake as a function of the inputs, for Exercise._compare
            Mistake(m.why, lambda src, tgt, package, cls=m.wrong: _logits(cls, package, src, tgt))
            for m in self.mistakes
        ]
        compare = replace(self, mistakes=wrong)
        cases = self.cases()
        for config, src, tgt in cases:
            package = package_seq2seq(config)
            where = _describe(config, src, tgt)
            try:
                got = _logits(answer, package, src, tgt)
            except NotImplementedError:
                return self._feedback(
                    "not attempted", "replace `raise NotImplementedError` with your code."
                )
            except _Verdict as verdict:
                return self._feedback("incorrect", f"{verdict} {where}")
            except Exception as err:  # the learner's bug: report it, never crash the notebook
                frames = [
                    f
                    for f in traceback.extract_tb(err.__traceback__)
                    if "/torch/" not in f.filename and "transformer_course" not in f.filename
                ]
                line = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames else ""
                return self._feedback(
                    "error", f"your model raised {type(err).__name__}: {err}{line} {where}"
                )
            with torch.no_grad():
                expected = package(src, tgt[:, :-1])[0]
            verdict = Exercise._compare(compare, got, expected, (src, tgt, package))
            if verdict is None:
                continue
            if not any(verdict == m.why for m in self.mistakes):
                hint = locate_seq2seq(answer, package, src, tgt)
                verdict = f"{hint} ({verdict})" if hint else verdict
            return self._feedback("incorrect", f"{verdict} {where}")
        return self._feedback(
            "correct",
            f"matches the package's Seq2Seq, its weights loaded into yours, on {len(cases)} batches "
            "of dates.",
        )


def _register(ex: Exercise) -> None:
    if ex.name in _REGISTRY:
        raise ValueError(f"exercise {ex.name!r} is defined twice")
    _REGISTRY[ex.name] = ex


_register(
    AssemblyExercise(
        name="encoder_decoder.seq2seq",
        prompt=(
            "Assemble the class Seq2Seq(config), an nn.Module, from the package's blocks: src_emb, "
            "tgt_emb (nn.Embedding), src_pos, tgt_pos (LearnedPositionalEmbedding), encoder = "
            "TransformerStack(PreNormBlock, n_encoder_layers, D, H, activation='gelu'), decoder = "
            "Decoder(n_decoder_layers, D, H, activation='gelu'), head = nn.Linear(D, tgt_vocab, "
            "bias=False). forward(src (B, M), tgt (B, N + 1)) returns the logits (B, N, tgt_vocab) "
            "of teacher forcing: the encoder reads E_src[x] + R_src with the source's padding "
            "hidden; the decoder reads E_tgt[tgt[:, :-1]] + R_tgt and the memory's keys and values, "
            "with the same padding hidden from cross-attention."
        ),
        solution=Seq2Seq,
        make_inputs=lambda gen, trial: (),
        mistakes=SEQ2SEQ_MISTAKES,
    )
)
