"""Exercises of the *Encoder-decoder* lab: shifted targets for teacher forcing, the key padding mask,
the decoder's causal + padding mask, the length-normalised score with which beam search chooses a
finished hypothesis; and five parts of the model itself, written against the interfaces of the
course's from-scratch file ``scratch/seq2seq.py``: the attention class that serves self- and
cross-attention (``encoder_decoder.attention``), the decoder block's ``forward``
(``encoder_decoder.decoder_block``), the decoder's forward pass ``Seq2Seq.decode``
(``encoder_decoder.decode``), one teacher-forced training step (``encoder_decoder.train_step``) and
greedy decoding without a cache (``encoder_decoder.greedy_decode``). :func:`lab_seq2seq` builds the
file's model from the learner's parts and :func:`train_on_dates` trains it with the learner's step.

Chapter: *Encoder-decoder* (Vaswani et al. 2017; Dramko 2025 sec. 5.1-5.2; Turner 2023 sec. 4.3).
Token ids follow :class:`transformer_course.data.DateTask`: ``0`` is padding, ``1`` is BOS, ``2`` is
EOS. Masks are bool, ``True`` = may attend, as everywhere in the package.

The checker reports a wrong answer by subtracting it from the reference, which bool tensors do not
support, so the two mask exercises register a view of their solution that returns the mask as 0/1
float64 (:func:`_compared_as_float`); a learner may return a bool or a 0/1 tensor, and a mask that
broadcasts to the expected shape (:class:`_MaskExercise`). The bool solution itself is
``key_padding_mask.__wrapped__`` (and is what ``tc.exercises.solution`` prints).

The model parts are checked as lab 7's capstone checks its GPT (the pattern of Stanford's CS336): the
reference solutions are ``scratch/seq2seq.py``'s :class:`MultiHeadAttention`, :class:`DecoderBlock`,
``Seq2Seq`` (its ``decode``) and :func:`greedy_decode`, imported, and :func:`train_step` below (the
scratch file has no training step). A checker builds the package's layer or model with seeded weights
of order one (:func:`package_attention`, :func:`package_decoder_block`, :func:`package_seq2seq`),
loads them into the learner's module, or into the scratch ``Seq2Seq`` that the learner's function is
given, **by name** (:func:`scratch_state_dict`: the scratch file's names, the package's fused
``in_proj`` split into ``W_q, W_k, W_v``), and compares with the package in float64: the layer's or
the block's output, the logits, the tokens of the package's cached ``greedy_decode``, the losses and
weights of two steps of the package's model and its loss (in float64). A difference is explained by
the first typical mistake (a wrong class or function, run on the same case) that gives the same
result, or raises the same error; failing that, the block's checker says which sub-layer first
receives something else, also when the learner's block raises.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..block import LayerNorm
from ..checks import bound
from ..data import DateTask
from ..encoder_decoder import DATES_RECIPE, CrossAttention, DatesRecipe, Seq2SeqConfig, train_dates
from ..encoder_decoder import DecoderBlock as PackageDecoderBlock
from ..encoder_decoder import Seq2Seq as PackageSeq2Seq
from ..scratch import seq2seq as scratch
from ..scratch.seq2seq import DecoderBlock, greedy_decode
from ..train import TrainConfig, lr_at, make_optimizer
from . import _REGISTRY, ClassExercise, Exercise, Mistake, exercise, randn, where_raised
from .language_models.checking import (  # lab 7's, shared by lab 8's checkers
    _outcome,
    _same,
    _Verdict,
)

__all__ = [
    "DecoderBlock",
    "greedy_decode",
    "package_decoder_block",
    "package_seq2seq",
    "scratch_state_dict",
    "train_step",
]

PAD, BOS, EOS = DateTask.PAD, DateTask.BOS, DateTask.EOS


def _compared_as_float(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """The mask returned by ``fn`` as float64 0/1, so the checker can subtract and report errors."""

    @functools.wraps(fn)  # inspect.getsource (and so tc.exercises.solution) shows ``fn`` itself
    def as_float(*args):
        return torch.as_tensor(fn(*args)).to(torch.float64)

    return as_float


def _register(ex: Exercise) -> None:
    if ex.name in _REGISTRY:
        raise ValueError(f"exercise {ex.name!r} is defined twice")
    _REGISTRY[ex.name] = ex


@dataclass
class _MaskExercise(Exercise):
    """A mask exercise: an answer with the expected number of axes that broadcasts to the expected
    shape is compared broadcast, so that ``keep[:, None, :]`` of shape ``(B, 1, M)``, which every
    attention layer of the course broadcasts over the queries, counts as the ``(B, M, M)`` mask."""

    def _compare(self, got: Any, expected: Tensor, args: tuple) -> str | None:
        if isinstance(got, Tensor) and got.dim() == expected.dim() and got.shape != expected.shape:
            try:
                got = got.expand(expected.shape)
            except RuntimeError:
                pass  # another shape: the base class names it
        return super()._compare(got, expected, args)


def _mask_exercise(**kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register the decorated function as the solution of a :class:`_MaskExercise`."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        _register(_MaskExercise(solution=fn, **kwargs))
        return fn

    return register


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
# 1. Teacher forcing (Dramko 2025 sec. 5.2.1): the decoder reads the target shifted right by one
#    behind BOS, "the output embeddings are offset by one position" (Vaswani et al. 2017 sec. 3.1)


def _shift_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, int]:
    B, N = ((3, 6), (4, 9), (2, 5))[trial % 3]
    return _padded_targets(gen, B, N), BOS


def _shifted_right(y: Tensor, first: int) -> Tensor:
    return torch.cat([torch.full_like(y[:, :1], first), y[:, :-1]], dim=1)


def _shifted_left(y: Tensor) -> Tensor:
    return torch.cat([y[:, 1:], torch.full_like(y[:, :1], PAD)], dim=1)


@exercise(
    name="encoder_decoder.shift_targets",
    prompt=(
        "y is a (B, N) tensor of target token ids without BOS (the chapter's y_1..y_N): each row "
        "holds its characters, then EOS (2), then padding (0). Return torch.stack([tgt_in, tgt_out]) "
        "of shape (2, B, N) for teacher forcing: the decoder reads tgt_in = [bos, y_1, ..., y_{N-1}] "
        "and is scored against tgt_out = [y_1, ..., y_N], so that position n predicts the token after "
        "the ones it has read."
    ),
    make_inputs=_shift_inputs,
    mistakes=[
        Mistake(
            "your tensors have N - 1 columns: you sliced y as the chapter slices DateTask's targets, "
            "tgt[:, :-1] and tgt[:, 1:], but those begin with BOS and this y does not, so the first "
            "prediction (of y_1, from BOS alone) is lost. Put bos in front instead: "
            "tgt_in = [bos, y_1, ..., y_{N-1}] and tgt_out = y.",
            lambda y, bos: torch.stack([y[:, :-1], y[:, 1:]]),
            "shape",
        ),
        Mistake(
            "the targets are not shifted: tgt_in equals tgt_out, so at every position the decoder reads "
            "the very token it must predict (and learns to copy it). Prepend bos to the decoder input "
            "and drop its last token.",
            lambda y, bos: torch.stack([y, y]),
        ),
        Mistake(
            "you shifted the wrong way: the decoder input must start with bos and lag one step behind "
            "the targets (tgt_in = [bos, y_1..y_{N-1}], tgt_out = y), not the other way round.",
            lambda y, bos: torch.stack([y, _shifted_right(y, bos)]),
        ),
        Mistake(
            "tgt_in is the targets shifted left ([y_2, ..., y_N, pad]): the decoder would read the "
            "future. Shift right instead, inserting bos in front: [bos, y_1, ..., y_{N-1}].",
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
    tgt_in = torch.cat([torch.full_like(y[:, :1], bos), y[:, :-1]], dim=1)  # (B, N): shifted right
    tgt_out = y  # (B, N): position n (from 0) reads bos, y_1..y_n and is scored on y_{n+1}
    return torch.stack([tgt_in, tgt_out])  # (2, B, N)


# ---------------------------------------------------------------------------------------------------
# 2. The key padding mask of the encoder's self-attention (True = may attend, the course's convention;
#    nn.MultiheadAttention's key_padding_mask is its negation, True = ignore this key)


def _padded_sources(gen: torch.Generator, trial: int) -> tuple[Tensor, int]:
    B, M = ((3, 7), (2, 10), (4, 5))[trial % 3]
    src = torch.randint(3, 20, (B, M), generator=gen)
    lengths = torch.randint(1, M, (B,), generator=gen)  # every row has at least one real token
    lengths[0] = M  # and one row has no padding at all
    for b, n in enumerate(lengths.tolist()):
        src[b, n:] = PAD
    return src, PAD


@_mask_exercise(
    name="encoder_decoder.key_padding_mask",
    prompt=(
        "src is a (B, M) tensor of source token ids, right-padded with pad_id. Return the bool mask "
        "(B, M, M) of the encoder's self-attention: mask[b, n, m] is True when query n may attend to "
        "key m, i.e. when token m of sequence b is not padding (every query, padded or not, may look "
        "at every real token). The (B, 1, M) mask that broadcasts over the queries is accepted too."
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


@_mask_exercise(
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
        Mistake(
            "you hid the padded queries (rows) as well as the padded keys: mask[b, n, m] depends on "
            "the key m only (m <= n and tokens[b, m] != pad_id). Hiding a whole row leaves that query "
            "no key at all: a plain softmax over a row of -inf is NaN (0/0), and the NaN reaches every "
            "position through the next layer's A @ V. Nothing reads a padded query's output, so leave "
            "its row as the key mask makes it.",
            lambda t, pad: _causal(t.shape[1]) & (t != pad)[:, None, :] & (t != pad)[:, :, None],
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
    """``tokens (B, N + 1)``: B finished hypotheses, one per row, each BOS, characters, EOS, padding;
    ``log_probs (B, N)``: the log-probability of each token after BOS, with junk (what a batched
    decoder leaves there) at padded positions."""
    B, N = ((4, 6), (5, 8), (3, 5))[trial % 3]
    y = _padded_targets(gen, B, N)  # (B, N): row 0 fills the width, the others are padded
    y[1, 0], y[1, 1:] = EOS, PAD  # one hypothesis that stopped at once: |y| = 1
    tokens = torch.cat([torch.full((B, 1), BOS), y], dim=1)
    log_probs = -3 * torch.rand(B, N, generator=gen, dtype=torch.float64) - 0.05
    alpha = 0.5 + 0.5 * float(torch.rand((), generator=gen, dtype=torch.float64))
    return tokens, log_probs, alpha


def _masked(tokens: Tensor, log_probs: Tensor) -> tuple[Tensor, Tensor]:
    """The real tokens' mask ``(B, N)`` (EOS included, BOS and padding not) and ``|y|`` ``(B,)``."""
    real = tokens[:, 1:] != PAD
    return real, real.sum(dim=1).to(log_probs.dtype)


def _wu(length: Tensor, alpha: float) -> Tensor:
    return ((5 + length) / 6) ** alpha


def _score_without_eos(tokens: Tensor, log_probs: Tensor, alpha: float, where: str) -> Tensor:
    """The score with EOS left out of ``where``: ``"both"``, ``"sum"`` or ``"length"``."""
    real, length = _masked(tokens, log_probs)
    characters = real & (tokens[:, 1:] != EOS)
    summed = characters if where in ("both", "sum") else real
    counted = characters.sum(dim=1).to(log_probs.dtype) if where in ("both", "length") else length
    return (log_probs * summed).sum(dim=1) / _wu(counted, alpha)


@exercise(
    name="encoder_decoder.beam_scores",
    prompt=(
        "Beam search has finished B hypotheses and must choose one. tokens (B, N + 1) holds one per "
        "row: BOS (1), the generated tokens ending with EOS (2), then padding (0). log_probs (B, N) "
        "holds log p of tokens[:, 1:], each given what precedes it; at padded positions it holds junk "
        "that must not count. Return the (B,) length-normalised scores of Wu et al. (2016): "
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
            "EOS is left out of both the sum and the length: the decision to stop is a token the "
            "model predicted, with its own probability, and counts in both.",
            lambda t, lp, a: _score_without_eos(t, lp, a, "both"),
        ),
        Mistake(
            "EOS is left out of the length |y| (its log-probability is summed, rightly): |y| counts "
            "every generated token, EOS included, the same tokens whose log-probabilities are summed.",
            lambda t, lp, a: _score_without_eos(t, lp, a, "length"),
        ),
        Mistake(
            "EOS is left out of the sum (it is counted in |y|, rightly): log p(y | x) includes the "
            "log-probability of EOS, the model's decision to stop.",
            lambda t, lp, a: _score_without_eos(t, lp, a, "sum"),
        ),
        Mistake(
            "you divided by |y|: that is the mean log-probability per token, another normalisation "
            "(alpha plays no part in it); the score divides by Wu et al.'s penalty "
            "((5 + |y|) / 6) ** alpha.",
            lambda t, lp, a: (lp * _masked(t, lp)[0]).sum(dim=1) / _masked(t, lp)[1],
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
    real = tokens[:, 1:] != PAD  # (B, N): the generated tokens, EOS included; BOS is column 0
    log_p = (log_probs * real).sum(dim=1)  # (B,): log p(y | x), junk at padded positions dropped
    length = real.sum(dim=1).to(log_probs.dtype)  # (B,): |y|
    return log_p / ((5 + length) / 6) ** alpha  # (B,)


# ---------------------------------------------------------------------------------------------------
# The model parts: the scratch file's names, the checkers' weights and machinery

_RENAMES = (  # the package's parameter names -> scratch/seq2seq.py's, applied in turn
    (r"^src_emb\.", "E_src."),
    (r"^tgt_emb\.", "E_tgt."),
    (r"^src_pos\.table\.", "R_src."),
    (r"^tgt_pos\.table\.", "R_tgt."),
    (r"^encoder\.final_norm\.", "ln_enc."),
    (r"^decoder\.final_norm\.", "ln_dec."),
    (r"^(encoder|decoder)\.blocks\.", r"\1."),
    (r"(^|\.)norm(\d)\.", r"\1ln\2."),
    (r"(^|\.)out_proj\.", r"\1W_o."),
    (r"^head\.", "W_vocab."),
)


def scratch_names(package_name: str) -> tuple[str, ...]:
    """The names in ``scratch/seq2seq.py`` of a parameter of the package's ``Seq2Seq`` or
    ``DecoderBlock``: one name (``decoder.blocks.0.norm2.weight`` -> ``decoder.0.ln2.weight``,
    ``head.weight`` -> ``W_vocab.weight``), or three for a fused ``in_proj``, whose rows stack
    ``W_q``, ``W_k``, ``W_v`` (``nn.Linear`` stores ``(out, in)``): ``...cross_attn.in_proj.weight`` ->
    ``...cross_attn.W_q.weight``, ``...W_k.weight``, ``...W_v.weight``."""
    name = package_name
    for pattern, replacement in _RENAMES:
        name = re.sub(pattern, replacement, name)
    if re.search(r"(^|\.)in_proj\.", name):
        return tuple(name.replace("in_proj", W) for W in ("W_q", "W_k", "W_v"))
    return (name,)


def scratch_state_dict(package: nn.Module) -> dict[str, Tensor]:
    """The weights of the package's ``Seq2Seq`` (or of one ``DecoderBlock``) under the names of
    ``scratch/seq2seq.py``: ``scratch.Seq2Seq(config).load_state_dict(scratch_state_dict(model))``
    gives the scratch model the package model's weights."""
    state = {}
    for name, t in package.state_dict().items():
        names = scratch_names(name)
        state.update(zip(names, t.chunk(len(names)), strict=True))
    return state


def _order_one(model: nn.Module, gen: torch.Generator) -> nn.Module:
    """The checkers' weights: matrices N(0, 1/fan_in), embedding and position tables N(0, 1),
    LayerNorm gains 1 + N(0, 0.2^2), biases N(0, 0.2^2), so that every attention weight and every
    part of the model matters to the output."""
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


@lru_cache(maxsize=8)
def package_seq2seq(config: Seq2SeqConfig, seed: int = 0) -> PackageSeq2Seq:
    """The package's :class:`~transformer_course.encoder_decoder.Seq2Seq` for ``config``, float64, in
    evaluation mode, with the checkers' seeded weights (:func:`_order_one`). Shared between calls: copy
    it before changing it."""
    with torch.random.fork_rng(devices=[]):  # the default initialisation is overwritten
        model = PackageSeq2Seq(config).double().eval().requires_grad_(False)
    return _order_one(model, torch.Generator().manual_seed(seed))


@lru_cache(maxsize=8)
def package_decoder_block(D: int, H: int, seed: int = 0) -> PackageDecoderBlock:
    """The package's pre-norm :class:`~transformer_course.encoder_decoder.DecoderBlock` (GELU, as in
    its ``Seq2Seq``), float64, evaluation mode, with the checkers' seeded weights."""
    with torch.random.fork_rng(devices=[]):
        block = PackageDecoderBlock(D, H, activation="gelu").double().eval().requires_grad_(False)
    return _order_one(block, torch.Generator().manual_seed(seed))


def _no_random_inputs(gen: torch.Generator, trial: int) -> tuple:
    raise TypeError("the model parts' checkers run fixed cases, not random inputs")


def _difference(got: dict, expected: dict, atol: float) -> str:
    for key, exp in expected.items():
        mine = got[key]
        if mine.shape != exp.shape:
            return f"{key}: shape {tuple(mine.shape)}, expected {tuple(exp.shape)}."
        if mine.is_floating_point() and not torch.isfinite(mine).all():
            return (
                f"{key}: NaN or inf. Look for a row of scores that is -inf everywhere: a query left "
                "with no key to attend to."
            )
        if not torch.equal(mine, exp):
            err = (mine.double() - exp.double()).abs()
            if err.max() <= atol:
                continue
            idx = tuple(int(j) for j in torch.unravel_index(err.argmax(), err.shape))
            return (
                f"{key}: the largest difference is at index {idx} (you: {mine[idx].item():.6g}, "
                f"expected: {exp[idx].item():.6g})."
            )
    return "the outputs differ."


def _tensor(x: Any, what: str) -> Tensor:
    if isinstance(x, Tensor):
        return x.detach()
    raise _Verdict(f"{what} must return a tensor, got a {type(x).__name__}.")


def _names(names: list[str], most: int = 6) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _build(answer: Any, args: tuple, state: dict[str, Tensor], what: str) -> nn.Module:
    """``answer(*args)`` in float64 and evaluation mode, with the package's weights ``state`` loaded
    by name; a verdict when the names or shapes do not fit."""
    module = answer(*args)
    if not isinstance(module, nn.Module):
        raise _Verdict(
            f"{what}{args} built a {type(module).__name__}, not an nn.Module (subclass nn.Module and "
            "call super().__init__() first)."
        )
    own = dict(module.named_parameters())
    missing, extra = [k for k in state if k not in own], [k for k in own if k not in state]
    if missing or extra:
        said = [f"it has no parameter {_names(missing)}"] if missing else []
        said += [f"it has parameters the package's does not: {_names(extra)}"] if extra else []
        raise _Verdict(
            f"your {what}'s parameters do not have the lab's names ({'; '.join(said)}). The checker "
            f"loads the package's weights by name: keep the __init__ of the lab's {what}."
        )
    for k, t in state.items():
        if own[k].shape != t.shape:
            raise _Verdict(
                f"`{k}` has shape {tuple(own[k].shape)}, the package's {tuple(t.shape)}."
            )
    module = module.double().eval()
    module.load_state_dict(state, strict=False)  # every parameter is in state; buffers are kept
    return module


@dataclass
class ScratchExercise(ClassExercise):
    """A part of the model, written against the interface of ``scratch/seq2seq.py`` and run on fixed
    cases: ``observe(answer, case)`` runs the answer and returns ``{what: tensor}`` (or raises a
    :class:`_Verdict`), ``expected(case)`` is what the package computes. A difference is explained by
    the first :class:`Mistake` whose wrong answer, observed the same way, gives the same result or
    raises the same error; then by ``locate(answer, case)``; then by the largest difference. ``trials``
    is 0: the cases are fixed, not the random inputs of ``make_inputs``."""

    make_inputs: Callable[[torch.Generator, int], tuple] = _no_random_inputs
    trials: int = 0
    cases: Callable[[], list] = list
    observe: Callable[[Any, Any], dict] | None = None
    expected: Callable[[Any], dict] | None = None
    locate: Callable[[Any, Any], str | None] | None = None
    describe: Callable[[Any], str] = str
    passed: str = "matches the package"

    def _check_answer(self, answer: Any) -> Any:
        cases, worst, floating = self.cases(), 0.0, False
        for case in cases:
            where = f" [{self.describe(case)}]"
            try:
                got = _outcome(self.observe, answer, case)
            except _Verdict as verdict:
                return self._feedback("incorrect", f"{verdict}{where}")
            expected = self.expected(case)
            if not isinstance(got, BaseException) and _same(got, expected, self.atol, self.rtol):
                for k, v in expected.items():
                    if v.is_floating_point():
                        floating = True
                        worst = max(worst, (got[k].double() - v.double()).abs().max().item())
                continue
            for mistake in self.mistakes:
                try:
                    wrong = _outcome(self.observe, mistake.wrong, case)
                except _Verdict:
                    continue
                if _same(got, wrong, self.atol, self.rtol):
                    return self._feedback("incorrect", f"{mistake.why}{where}")
            hint = None
            if self.locate is not None:
                try:
                    hint = _outcome(self.locate, answer, case)
                except _Verdict as verdict:
                    hint = str(verdict)
            if isinstance(got, BaseException):
                message = f"your {self.kind} raised {type(got).__name__}: {got}{where_raised(got)}"
                if isinstance(hint, str):  # what the first sub-layer that went wrong was given
                    message = f"{message}; {hint}"
                return self._feedback("error", f"{message}{where}")
            if not isinstance(hint, str):
                hint = _difference(got, expected, self.atol)
            return self._feedback("incorrect", f"{hint}{where}")
        detail = f" (largest difference {bound(worst)})" if floating else ""
        n = len(cases)
        return self._feedback("correct", f"{self.passed} on {n} case{'s' * (n != 1)}{detail}.")


# ---------------------------------------------------------------------------------------------------
# 3. The attention class, one for self- and cross-attention: queries from X, keys and values from X_k
#    and X_v (cross-attention: Vaswani et al. 2017 sec. 3.2.3); the reference solution is
#    scratch/seq2seq.py's MultiHeadAttention


@lru_cache(maxsize=8)
def package_attention(D: int, H: int, seed: int = 0) -> CrossAttention:
    """The package's attention layer (``in_proj`` stacks ``W_q, W_k, W_v``; ``out_proj`` is ``W_o``),
    float64, evaluation mode, with the checkers' seeded weights: the same parameters as the
    :class:`~transformer_course.multihead.SelfAttention` of the encoder and the decoder."""
    with torch.random.fork_rng(devices=[]):
        layer = CrossAttention(D, H).double().eval().requires_grad_(False)
    return _order_one(layer, torch.Generator().manual_seed(seed))


def _attention_cases() -> list[tuple]:
    """``(D, H, what, X, X_kv, mask)``: cross-attention without a mask (``N > M``), cross-attention
    with the source's key mask ``(B, 1, M)`` (``N < M``, the last source padded, ``B != H``), and
    self-attention with the causal mask ``(N, N)``. Each mistake shows on the first case where it
    changes the output, and is named there."""
    g = torch.Generator().manual_seed(40)
    cases = [(12, 2, "cross-attention, no mask", randn(g, 3, 6, 12), randn(g, 3, 4, 12), None)]
    B, N, M, D, H = 2, 5, 7, 16, 4
    keep = torch.ones(B, M, dtype=torch.bool)
    keep[-1, 4:] = False
    cases.append((D, H, "cross-attention, the source's key mask (B, 1, M)", randn(g, B, N, D),
                  randn(g, B, M, D), keep[:, None, :]))  # fmt: skip
    X = randn(g, 3, 6, 12)
    cases.append((12, 3, "self-attention, the causal mask (N, N)", X, X,
                  torch.ones(6, 6, dtype=torch.bool).tril()))  # fmt: skip
    return cases


def _describe_attention(case: tuple) -> str:
    D, H, what, X, X_kv, mask = case
    shape = "no mask" if mask is None else f"mask {tuple(mask.shape)}"
    return f"case: {what}; D={D}, H={H}; X {tuple(X.shape)}, X_k = X_v {tuple(X_kv.shape)}, {shape}"


def _observe_attention(answer: Any, case: tuple) -> dict:
    D, H, _, X, X_kv, mask = case
    layer = _build(
        answer, (D, H), scratch_state_dict(package_attention(D, H)), "MultiHeadAttention"
    )
    with torch.no_grad():
        args = (X.clone(), X_kv.clone(), X_kv.clone())
        out = layer(*args) if mask is None else layer(*args, mask.clone())
    return {"the layer's output": _tensor(out, "MultiHeadAttention.forward")}


def _expected_attention(case: tuple) -> dict:
    D, H, _, X, X_kv, mask = case
    layer = package_attention(D, H)
    if mask is not None:
        mask = mask.expand(X.shape[0], X.shape[1], X_kv.shape[1])  # the package's (B, N, M)
    with torch.no_grad():
        return {"the layer's output": layer(X, layer.memory_kv(X_kv), mask)}


class _Attention(scratch.MultiHeadAttention):
    """Wrong attention layers, each changing one thing (a class attribute) in the reference."""

    kv = "args"  # keys and values from "args" (X_k, X_v), "X" (the queries' sequence) or "swapped"
    scale = "d_k"  # "d_k", "D" or "none"
    softmax_dim = -1  # -1: over the keys; -2: over the queries
    split = "transpose"  # "transpose", "reshape" (no transpose) or "interleaved"
    mask_as = "unsqueeze"  # "unsqueeze", "inverted", "no_head_axis", "zero", "after", "ignored"
    output = True  # W_o applied

    def forward(self, X, X_k, X_v, mask=None):
        if self.kv == "X":
            X_k = X_v = X
        elif self.kv == "swapped":
            X, X_k, X_v = X_k, X, X
        B, N, D = X.shape
        M, H, d_k = X_k.shape[1], self.H, self.d_k

        def heads(T: Tensor, length: int) -> Tensor:  # (B, length, D) -> (B, H, length, d_k)
            if self.split == "reshape":
                return T.reshape(B, H, length, d_k)
            if self.split == "interleaved":  # head h gets features h, h + H, h + 2H, ...
                return T.view(B, length, d_k, H).permute(0, 3, 1, 2)
            return T.view(B, length, H, d_k).transpose(1, 2)

        Q, K, V = heads(self.W_q(X), N), heads(self.W_k(X_k), M), heads(self.W_v(X_v), M)
        S = Q @ K.transpose(-2, -1)
        S = S / {"d_k": math.sqrt(d_k), "D": math.sqrt(D), "none": 1.0}[self.scale]
        if mask is not None and self.mask_as not in ("after", "ignored"):
            hidden = {
                "unsqueeze": ~mask.unsqueeze(-3),
                "inverted": mask.unsqueeze(-3),  # nn.MultiheadAttention's convention: True = hidden
                "no_head_axis": ~mask,
                "zero": ~mask.unsqueeze(-3),
            }[self.mask_as]
            S = S.masked_fill(hidden, 0.0 if self.mask_as == "zero" else float("-inf"))
        A = torch.softmax(S, dim=self.softmax_dim)
        if mask is not None and self.mask_as == "after":
            A = A * mask.unsqueeze(-3)  # the padded keys' weights zeroed, the rows not renormalised
        Y = A @ V  # (B, H, N, d_k)
        if self.split == "reshape":
            Y = Y.reshape(B, N, D)
        elif self.split == "interleaved":
            Y = Y.permute(0, 2, 3, 1).reshape(B, N, D)
        else:
            Y = Y.transpose(1, 2).reshape(B, N, D)
        return self.W_o(Y) if self.output else Y


def _attention(name: str, **attrs: Any) -> type:
    return type(name, (_Attention,), attrs)


WHY_ATTN_KV_FROM_X = (
    "your keys and values come from X, the queries' sequence, not from X_k and X_v: right for "
    "self-attention, where the three are the same tensor, but a cross-attention written this way is a "
    "second self-attention over the target and never reads the source (as one of the sources reads "
    "literally, the chapter's register row D3). K = W_k(X_k), V = W_v(X_v)."
)
WHY_ATTN_SWAPPED = (
    "the queries come from X_k and the keys and values from X: swapped. The output has one row per "
    "query, so it must have X's rows (the target's N), whatever the length M of X_k and X_v."
)
WHY_ATTN_SCALE_D = (
    "the scores are divided by sqrt(D), the model's width; each head's scores are divided by "
    "sqrt(d_k), the width of its queries and keys, d_k = D // H."
)
WHY_ATTN_NO_SCALE = (
    "the 1/sqrt(d_k) scale is missing: divide each head's scores Q K^T by sqrt(d_k)."
)
WHY_ATTN_SOFTMAX_QUERIES = (
    "the softmax runs over the queries (dim=-2): each row of weights, one query's, must sum to one "
    "over the keys, torch.softmax(S, dim=-1)."
)
WHY_ATTN_NO_W_O = (
    "W_o is missing: the heads, side by side, are mixed by the output map, return self.W_o(Y)."
)
WHY_ATTN_RESHAPE = (
    "the heads are split by a reshape to (B, H, N, d_k) without the transpose: that cuts the "
    "sequence, not the features, into heads. Split the features: .view(B, N, H, d_k).transpose(1, 2), "
    "and merge back with .transpose(1, 2).reshape(B, N, D)."
)
WHY_ATTN_INTERLEAVED = (
    "your heads take interleaved features (head h gets features h, h + H, ...); head h owns the "
    "consecutive features h d_k .. (h+1) d_k - 1: .view(B, N, H, d_k).transpose(1, 2)."
)
WHY_ATTN_INVERTED = (
    "the mask is inverted: you hid the keys where it is True (nn.MultiheadAttention's convention); "
    "in the course True means 'may attend', so hide where it is False: S.masked_fill(~mask, -inf). "
    "A query with every key hidden gets NaN."
)
WHY_ATTN_NO_HEAD_AXIS = (
    "the mask has no head axis: against the scores (B, H, N, M) a (B, 1, M) mask lines its B up with "
    "H, and the call fails. Give it one, mask.unsqueeze(-3), so that every head gets the same mask."
)
WHY_ATTN_ZERO = (
    "hidden scores are set to 0, not -inf: exp(0) = 1, so the hidden keys still get weight. Use "
    "S.masked_fill(~mask, float('-inf')), whose weight is exactly zero after the softmax."
)
WHY_ATTN_AFTER = (
    "the mask is applied after the softmax (A * mask): the hidden keys get no weight, but the rows "
    "no longer sum to one. Mask the scores before the softmax, which then renormalises over the "
    "keys left."
)
WHY_ATTN_IGNORED = (
    "the mask is not used, so the queries also read the keys it hides (the padded source tokens, or "
    "the future): S = S.masked_fill(~mask.unsqueeze(-3), float('-inf')) when a mask is given."
)
ATTENTION_MISTAKES = [
    Mistake(WHY_ATTN_KV_FROM_X, _attention("_KVFromX", kv="X")),
    Mistake(WHY_ATTN_SWAPPED, _attention("_Swapped", kv="swapped"), "shape"),
    Mistake(WHY_ATTN_SCALE_D, _attention("_ScaleD", scale="D")),
    Mistake(WHY_ATTN_NO_SCALE, _attention("_NoScale", scale="none")),
    Mistake(WHY_ATTN_SOFTMAX_QUERIES, _attention("_SoftmaxQueries", softmax_dim=-2)),
    Mistake(WHY_ATTN_NO_W_O, _attention("_NoWo", output=False)),
    Mistake(WHY_ATTN_RESHAPE, _attention("_Reshape", split="reshape")),
    Mistake(WHY_ATTN_INTERLEAVED, _attention("_Interleaved", split="interleaved")),
    Mistake(WHY_ATTN_INVERTED, _attention("_Inverted", mask_as="inverted"), "nan"),
    Mistake(WHY_ATTN_NO_HEAD_AXIS, _attention("_NoHeadAxis", mask_as="no_head_axis"), "raises"),
    Mistake(WHY_ATTN_ZERO, _attention("_Zero", mask_as="zero")),
    Mistake(WHY_ATTN_AFTER, _attention("_After", mask_as="after")),
    Mistake(WHY_ATTN_IGNORED, _attention("_Ignored", mask_as="ignored")),
]

_register(
    ScratchExercise(
        name="encoder_decoder.attention",
        prompt=(
            "Write MultiHeadAttention.forward(X, X_k, X_v, mask=None), the attention class of the "
            "whole model: queries from X (B, N, D), keys from X_k and values from X_v (B, M, D), so "
            "that self-attention is attn(X, X, X, mask) and cross-attention attn(X, X_mem, X_mem, "
            "mask). Head h uses features h d_k .. (h+1) d_k - 1 (d_k = D // H) of W_q(X), W_k(X_k), "
            "W_v(X_v); its weights are softmax over the keys of Q_h K_h^T / sqrt(d_k), with the keys "
            "where the bool mask is False hidden (-inf) before the softmax; the mask is (N, M), "
            "(B, 1, M) or (B, N, M), the same for every head. Return W_o of the heads side by side, "
            "(B, N, D)."
        ),
        solution=scratch.MultiHeadAttention,
        mistakes=ATTENTION_MISTAKES,
        cases=_attention_cases,
        observe=_observe_attention,
        expected=_expected_attention,
        describe=_describe_attention,
        atol=1e-10,
        rtol=1e-8,
        example="MultiHeadAttention",
        passed="matches the package's attention layer, its weights loaded into yours,",
    )
)


# ---------------------------------------------------------------------------------------------------
# 6. The decoder block's forward: three pre-norm sub-layers (the chapter's eq-ed-decoder); the
#    reference solution is scratch/seq2seq.py's DecoderBlock


def _block_cases() -> list[tuple]:
    """``(D, H, X, X_mem, causal, mem_mask)``: N < M and N > M (so that swapped masks cannot run), the
    last source padded."""
    cases = []
    for D, H, B, N, M, seed in ((16, 4, 2, 5, 7, 0), (12, 3, 3, 6, 4, 1)):
        g = torch.Generator().manual_seed(60 + seed)
        X, X_mem = randn(g, B, N, D), randn(g, B, M, D)
        keep = torch.ones(B, M, dtype=torch.bool)
        keep[-1, M // 2 + 1 :] = False  # padding at the end of the last source
        causal = torch.ones(N, N, dtype=torch.bool).tril()  # (N, N): query n sees keys m <= n
        cases.append((D, H, X, X_mem, causal, keep[:, None, :]))
    return cases


def _describe_block(case: tuple) -> str:
    D, H, X, X_mem, _, _ = case
    B, N, _ = X.shape
    return f"case: D={D}, H={H}; X (B, N, D) = {(B, N, D)}, X_mem (B, M, D) = {tuple(X_mem.shape)}"


def _run_block(answer: Any, case: tuple) -> nn.Module:
    D, H = case[:2]
    return _build(answer, (D, H), scratch_state_dict(package_decoder_block(D, H)), "DecoderBlock")


def _observe_block(answer: Any, case: tuple) -> dict:
    _, _, X, X_mem, causal, mem_mask = case
    block = _run_block(answer, case)
    with torch.no_grad():
        out = block(X.clone(), X_mem.clone(), causal.clone(), mem_mask.clone())
    return {"the block's output": _tensor(out, "DecoderBlock.forward")}


def _expected_block(case: tuple) -> dict:
    D, H, X, X_mem, _, mem_mask = case
    package = package_decoder_block(D, H)
    B, N, M = X.shape[0], X.shape[1], X_mem.shape[1]
    with torch.no_grad():  # the package's block is causal by construction
        out = package(X, package.cross_attn.memory_kv(X_mem), mem_mask.expand(B, N, M))
    return {"the block's output": out}


def _first_call_inputs(module: nn.Module, run: Callable[[], Any]) -> dict[str, tuple]:
    """The positional arguments with which ``module``'s attention layers and the MLP's first layer are
    first called while ``run()`` runs (up to where it raises, if it does)."""
    seen: dict[str, tuple] = {}
    hooks = [
        module.get_submodule(name).register_forward_pre_hook(
            lambda m, args, name=name: seen.setdefault(name, args)
        )
        for name in ("self_attn", "cross_attn", "mlp.fc1")  # fc1: also when mlp is taken apart
    ]
    try:
        run()
    except Exception:  # the checker reports the learner's error; the calls made before it
        pass  # are what locates it
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def _close(a: Any, b: Tensor) -> bool:
    return (
        isinstance(a, Tensor)
        and a.shape == b.shape
        and torch.allclose(a.double(), b.double(), atol=1e-10, rtol=1e-8)
    )


def _same_mask(a: Any, b: Tensor) -> bool:
    """A mask (``None`` = every key visible) equal to ``b`` once broadcast to its shape."""
    try:
        a = torch.ones_like(b) if a is None else torch.as_tensor(a).bool().expand(b.shape)
    except RuntimeError:
        return False
    return torch.equal(a, b)


def _locate_block(answer: Any, case: tuple) -> str | None:
    """Which sub-layer of the learner's block first receives something other than the package's."""
    D, H, X, X_mem, causal, mem_mask = case
    block = _run_block(answer, case)
    with torch.no_grad():
        seen = _first_call_inputs(block, lambda: block(X, X_mem, causal, mem_mask))
        p = package_decoder_block(D, H)
        B, N, M = X.shape[0], X.shape[1], X_mem.shape[1]
        h1 = p.norm1(X)
        X1 = X + p.self_attn(h1)
        h2 = p.norm2(X1)
        X2 = X1 + p.cross_attn(h2, p.cross_attn.memory_kv(X_mem), mem_mask.expand(B, N, M))
        h3 = p.norm3(X2)
    s, c = seen.get("self_attn"), seen.get("cross_attn")
    if s is None:
        return "your forward does not call the self-attention, self.self_attn."
    if not all(_close(t, h1) for t in s[:3]):
        return (
            "the self-attention does not read LN_1(X): its queries, keys and values all come from "
            "the block's input, normalised, self.self_attn(h, h, h, causal) with h = self.ln1(X)."
        )
    if not _same_mask(s[3] if len(s) > 3 else None, causal.expand(B, N, N)):
        return "the self-attention's mask is not the causal mask it is given (True = may attend)."
    if c is None:
        return "your forward does not call the cross-attention, self.cross_attn, after it."
    if not _close(c[0], h2):
        return (
            "the cross-attention's queries are not LN_2(X'), the stream after the self-attention "
            "sub-layer and its residual (X' = X + self-attention(LN_1(X)))."
        )
    if not (_close(c[1], X_mem) and _close(c[2], X_mem)):
        return "the cross-attention's keys and values are not the memory X_mem, as it is given."
    if not _same_mask(c[3] if len(c) > 3 else None, mem_mask.expand(B, N, M)):
        what = " (the causal mask (N, N)?)" if len(c) > 3 and _same_mask(c[3], causal) else ""
        return (
            f"the cross-attention's mask is not mem_mask{what}: its keys are the M source tokens, "
            "and mem_mask (B, 1, M) hides the padded ones (True = real). The causal mask belongs to "
            "the self-attention."
        )
    if "mlp.fc1" not in seen:
        return "your forward does not call the MLP, self.mlp, after the cross-attention."
    if not _close(seen["mlp.fc1"][0], h3):
        return (
            "the MLP does not read LN_3(X''), the stream after the cross-attention sub-layer and "
            "its residual (X'' = X' + cross-attention(...))."
        )
    return (
        "every sub-layer reads the right input, yet the output differs: the block returns "
        "X'' + MLP(LN_3(X''))."
    )


class _Block(DecoderBlock):
    """Wrong decoder blocks, each changing one thing (a class attribute) in the reference."""

    kv = "memory"  # cross-attention's keys and values: "memory" or "stream" (LN_2(X'), causal)
    self_mask = "causal"  # "causal", "none", "inverted", "mem_mask" (the masks swapped)
    cross_mask = "mem_mask"  # "mem_mask", "none", "causal"
    queries = "X1"  # cross-attention's queries from LN_2 of "X1" (X') or "X" (the block's input)
    arrangement = "pre"  # "pre", "post", "normed_residual", "no_norm", "one_norm", "cross_first"
    cross_residual = True
    memory_normed = False

    def forward(self, X, X_mem, causal, mem_mask):
        masks = {"causal": causal, "none": None, "inverted": ~causal, "mem_mask": mem_mask}
        a = self.arrangement
        ln1, ln2, ln3 = (self.ln1,) * 3 if a == "one_norm" else (self.ln1, self.ln2, self.ln3)
        if a == "no_norm":
            ln1 = ln2 = ln3 = nn.Identity()

        def self_sub(Z):
            h = ln1(Z)
            return (h if a == "normed_residual" else Z) + self.self_attn(
                h, h, h, masks[self.self_mask]
            )

        def cross_sub(Z, Q_from):
            h = ln2(Q_from)
            if self.kv == "stream":  # a second causal self-attention over the target
                out = self.cross_attn(h, h, h, causal)
            else:
                kv = self.ln2(X_mem) if self.memory_normed else X_mem
                out = self.cross_attn(h, kv, kv, masks[self.cross_mask])
            base = h if a == "normed_residual" else Z
            return base + out if self.cross_residual else out

        if a == "post":
            X1 = self.ln1(X + self.self_attn(X, X, X, causal))
            X2 = self.ln2(X1 + self.cross_attn(X1, X_mem, X_mem, mem_mask))
            return self.ln3(X2 + self.mlp(X2))
        if a == "cross_first":
            X1 = cross_sub(X, X)
            X2 = self_sub(X1)
        else:
            X1 = self_sub(X)
            X2 = cross_sub(X1, X if self.queries == "X" else X1)
        h3 = ln3(X2)
        return (h3 if a == "normed_residual" else X2) + self.mlp(h3)


def _block(name: str, **attrs: Any) -> type:
    return type(name, (_Block,), attrs)


WHY_KV_FROM_STREAM = (
    "the cross-attention takes its keys and values from the decoder stream, LN_2(X'), not from the "
    "memory: the sub-layer is then a second (causal) self-attention over the target and never reads "
    "the source. Queries from LN_2(X'), keys and values from X_mem: "
    "self.cross_attn(self.ln2(X1), X_mem, X_mem, mem_mask)."
)
WHY_NO_CAUSAL = (
    "the self-attention is given no mask, so each target position also reads the positions after it, "
    "the very tokens it is trained to predict: pass the causal mask, self.self_attn(h, h, h, causal)."
)
WHY_INVERTED_CAUSAL = (
    "the causal mask is inverted (~causal, the convention of nn.MultiheadAttention's attn_mask, where "
    "True hides a key): each position sees only its future and the last one sees nothing (NaN). Here "
    "True means 'may attend': pass causal as it is."
)
WHY_MASK_MISFITS = (
    "a mask does not fit its scores, and the call fails: mem_mask (B, 1, M) has one entry per source "
    "token, so it belongs to the cross-attention, whose keys and values are the memory X_mem; the "
    "self-attention takes causal (N, N). Were the masks swapped, or do the cross-attention's keys come "
    "from the decoder stream?"
)
WHY_NO_MEM_MASK = (
    "the cross-attention is given no mask, so every target position also reads the padded source "
    "tokens: pass mem_mask, self.cross_attn(self.ln2(X1), X_mem, X_mem, mem_mask)."
)
WHY_QUERIES_FROM_INPUT = (
    "the cross-attention's queries come from LN_2(X), the block's input; they come from LN_2(X'), the "
    "stream after the self-attention sub-layer, X' = X + self-attention(LN_1(X))."
)
WHY_POST_NORM = (
    "your block is post-norm, a LayerNorm after each residual sum as in the original transformer; "
    "this block is pre-norm: each sub-layer reads the normalised stream, LN(X), and its output is "
    "added to the stream itself, which is never normalised."
)
WHY_NORMED_RESIDUAL = (
    "your residual connections start from the normalised stream: X' = X + self-attention(LN_1(X)) "
    "adds to X itself, not to LN_1(X) (and likewise X'' and the output)."
)
WHY_NO_NORM = (
    "your block has no LayerNorm: each sub-layer reads the raw stream. Normalise each sub-layer's "
    "input: ln1 before the self-attention, ln2 before the cross-attention's queries, ln3 before the MLP."
)
WHY_ONE_NORM = (
    "you used ln1 before every sub-layer; each has its own LayerNorm: ln1 before the self-attention, "
    "ln2 before the cross-attention, ln3 before the MLP."
)
WHY_CROSS_FIRST = (
    "the cross-attention comes before the self-attention; the order is causal self-attention, then "
    "cross-attention (queries from its result), then the MLP."
)
WHY_NO_CROSS_RESIDUAL = (
    "the cross-attention has no residual connection: add its output to the stream, "
    "X'' = X' + cross-attention(LN_2(X'), X_mem)."
)
WHY_MEMORY_NORMED = (
    "the memory is normalised again (ln2 applied to X_mem too): ln2 normalises the queries' stream "
    "only; X_mem is used as it is given (the encoder already ends with a LayerNorm)."
)
BLOCK_MISTAKES = [
    Mistake(WHY_KV_FROM_STREAM, _block("_KVFromStream", kv="stream")),
    Mistake(WHY_NO_CAUSAL, _block("_NoCausal", self_mask="none")),
    Mistake(WHY_INVERTED_CAUSAL, _block("_InvertedCausal", self_mask="inverted"), "nan"),
    Mistake(
        WHY_MASK_MISFITS,
        _block("_SwappedMasks", self_mask="mem_mask", cross_mask="causal"),
        "raises",
    ),
    Mistake(WHY_NO_MEM_MASK, _block("_NoMemMask", cross_mask="none")),
    Mistake(WHY_QUERIES_FROM_INPUT, _block("_QueriesFromInput", queries="X")),
    Mistake(WHY_POST_NORM, _block("_PostNorm", arrangement="post")),
    Mistake(WHY_NORMED_RESIDUAL, _block("_NormedResidual", arrangement="normed_residual")),
    Mistake(WHY_NO_NORM, _block("_NoNorm", arrangement="no_norm")),
    Mistake(WHY_ONE_NORM, _block("_OneNorm", arrangement="one_norm")),
    Mistake(WHY_CROSS_FIRST, _block("_CrossFirst", arrangement="cross_first")),
    Mistake(WHY_NO_CROSS_RESIDUAL, _block("_NoCrossResidual", cross_residual=False)),
    Mistake(WHY_MEMORY_NORMED, _block("_MemoryNormed", memory_normed=True)),
]

_register(
    ScratchExercise(
        name="encoder_decoder.decoder_block",
        prompt=(
            "Write DecoderBlock.forward(X, X_mem, causal, mem_mask), a pre-norm decoder block with "
            "three sub-layers, each added to the stream: X' = X + self_attn(LN_1(X)) with the causal "
            "mask (queries, keys and values from LN_1(X)); X'' = X' + cross_attn with queries from "
            "LN_2(X') and keys and values from the memory X_mem, masked by mem_mask; return "
            "X'' + mlp(LN_3(X'')). The attention layers are scratch/seq2seq.py's "
            "MultiHeadAttention: attn(X, X_k, X_v, mask)."
        ),
        solution=DecoderBlock,
        mistakes=BLOCK_MISTAKES,
        cases=_block_cases,
        observe=_observe_block,
        expected=_expected_block,
        locate=_locate_block,
        describe=_describe_block,
        atol=1e-10,
        rtol=1e-8,
        example="DecoderBlock",
        passed="matches the package's pre-norm DecoderBlock, its weights loaded into yours,",
    )
)


# ---------------------------------------------------------------------------------------------------
# 6b. The decoder's forward pass, Seq2Seq.decode (the chapter's eq-ed-model, second and third lines);
#     the reference solution is scratch/seq2seq.py's Seq2Seq


def _decode_cases() -> list[tuple]:
    """``(config, src, tgt_in)``: padded sources of other lengths than the targets (``N != M``),
    ``B != H``; two decoder blocks in the first case, so that the blocks' chaining shows."""
    task = _date_task()
    V = task.vocab_size
    src, tgt = task.tensors(task.sample(3, seed=51))
    src2, tgt2 = task.tensors(task.sample(2, seed=52))
    width = int((src2 != PAD).sum(dim=1).max())
    return [
        (Seq2SeqConfig(V, V, task.src_len, task.tgt_len, d_model=16, H=2, n_encoder_layers=1,
                       n_decoder_layers=2), src, tgt[:, :-1]),
        (Seq2SeqConfig(V, V, task.src_len, task.tgt_len, d_model=24, H=4, n_encoder_layers=2,
                       n_decoder_layers=1), src2[:, :width], tgt2[:, :6]),
    ]  # fmt: skip


def _describe_decode(case: tuple) -> str:
    config, src, tgt_in = case
    return (
        f"case: src (B, M) = {tuple(src.shape)} with padding, tgt_in (B, N) = {tuple(tgt_in.shape)}, "
        f"D={config.d_model}, H={config.H}, L_d = {config.n_decoder_layers}"
    )


def _observe_decode(answer: Any, case: tuple) -> dict:
    config, src, tgt_in = case
    model = _build(answer, (config,), scratch_state_dict(package_seq2seq(config)), "Seq2Seq")
    with torch.no_grad():
        logits = model(src.clone(), tgt_in.clone())  # forward: decode(tgt_in, *encode(src))
    return {"the logits": _tensor(logits, "Seq2Seq.forward")}


def _expected_decode(case: tuple) -> dict:
    config, src, tgt_in = case
    with torch.no_grad():
        return {"the logits": package_seq2seq(config)(src, tgt_in)[0]}


class _Decode(scratch.Seq2Seq):
    """Wrong ``decode`` methods, each changing one thing (a class attribute) in the reference."""

    positions = "R_tgt"  # the position table added: "R_tgt", "none" or "R_src"
    causal = (
        "tril"  # "tril", "none", "triu" (the future instead of the past), "strict" (no diagonal)
    )
    mem_mask = "keys"  # "keys" keep[:, None, :], "none", "queries" keep[:, :, None]
    final = "ln_dec"  # "ln_dec", "none" or "ln_enc"
    chain = True  # each block reads the previous block's output (False: the embeddings)

    def decode(self, tgt_in, X_mem, keep):
        N = tgt_in.shape[1]
        positions = torch.arange(N, device=tgt_in.device)
        X = self.E_tgt(tgt_in)
        if self.positions != "none":
            X = X + getattr(self, self.positions)(positions)
        ones = torch.ones(N, N, dtype=torch.bool, device=tgt_in.device)
        causal = {"tril": ones.tril(), "none": None, "triu": ones.triu(), "strict": ones.tril(-1)}
        mem_mask = {"keys": keep[:, None, :], "none": None, "queries": keep[:, :, None]}
        X0 = X
        for block in self.decoder:
            X = block(X if self.chain else X0, X_mem, causal[self.causal], mem_mask[self.mem_mask])
        norm = {"ln_dec": self.ln_dec, "none": nn.Identity(), "ln_enc": self.ln_enc}[self.final]
        return self.W_vocab(norm(X))


def _decode(name: str, **attrs: Any) -> type:
    return type(name, (_Decode,), attrs)


WHY_DECODE_NO_POSITIONS = (
    "the target's positions are missing: without them the decoder cannot tell where in the date it "
    "is. X = self.E_tgt(tgt_in) + self.R_tgt(positions), positions = 0 .. N-1."
)
WHY_DECODE_SOURCE_POSITIONS = (
    "you added the source's position table R_src to the target; the target has its own, "
    "self.R_tgt(positions)."
)
WHY_DECODE_NO_FINAL_NORM = (
    "the final LayerNorm is missing: a pre-norm stack never normalises its stream, so the decoder "
    "ends with one before the head, self.W_vocab(self.ln_dec(X))."
)
WHY_DECODE_ENCODER_NORM = (
    "you ended the decoder with the encoder's LayerNorm, ln_enc; each stack has its own, "
    "self.W_vocab(self.ln_dec(X))."
)
WHY_DECODE_NO_CAUSAL = (
    "the decoder's self-attention gets no causal mask, so each position reads the target tokens after "
    "it, the answers it is trained to predict: causal = torch.ones(N, N).tril(), True where m <= n."
)
WHY_DECODE_TRIU = (
    "the causal mask is upper triangular: each position reads its future instead of its past. "
    "Keep the lower triangle, torch.ones(N, N, dtype=torch.bool).tril()."
)
WHY_DECODE_STRICT = (
    "the causal mask hides the diagonal (tril(-1)): a position may read itself, its own input token. "
    "With the diagonal hidden the first position has no key at all and its softmax is NaN: use "
    "tril(), not tril(-1)."
)
WHY_DECODE_NO_MEM_MASK = (
    "the cross-attention gets no mask, so the decoder also reads the padded source tokens: "
    "mem_mask = keep[:, None, :], (B, 1, M), True at the real source tokens."
)
WHY_DECODE_MEM_MASK_QUERIES = (
    "mem_mask is keep[:, :, None], (B, M, 1), which does not fit the cross-attention's scores "
    "(B, H, N, M), and the call fails: the mask is over the source keys, keep[:, None, :], (B, 1, M)."
)
WHY_DECODE_NOT_CHAINED = (
    "every decoder block reads the embeddings: X = block(X0, ...) in the loop. Each block reads the "
    "previous block's output, X = block(X, X_mem, causal, mem_mask)."
)
DECODE_MISTAKES = [
    Mistake(WHY_DECODE_NO_POSITIONS, _decode("_NoPositions", positions="none")),
    Mistake(WHY_DECODE_SOURCE_POSITIONS, _decode("_SourcePositions", positions="R_src")),
    Mistake(WHY_DECODE_NO_FINAL_NORM, _decode("_NoFinalNorm", final="none")),
    Mistake(WHY_DECODE_ENCODER_NORM, _decode("_EncoderNorm", final="ln_enc")),
    Mistake(WHY_DECODE_NO_CAUSAL, _decode("_NoCausal", causal="none")),
    Mistake(WHY_DECODE_TRIU, _decode("_Triu", causal="triu")),
    Mistake(WHY_DECODE_STRICT, _decode("_Strict", causal="strict"), "nan"),
    Mistake(WHY_DECODE_NO_MEM_MASK, _decode("_NoMemMask", mem_mask="none")),
    Mistake(WHY_DECODE_MEM_MASK_QUERIES, _decode("_MemMaskQueries", mem_mask="queries"), "raises"),
    Mistake(WHY_DECODE_NOT_CHAINED, _decode("_NotChained", chain=False)),
]

_register(
    ScratchExercise(
        name="encoder_decoder.decode",
        prompt=(
            "Write Seq2Seq.decode(tgt_in, X_mem, keep) -> logits (B, N, |V|), the decoder's forward "
            "pass (the rest of the class is scratch/seq2seq.py's): the target's embeddings plus its "
            "positions, E_tgt(tgt_in) + R_tgt(0 .. N-1); the causal mask (N, N), True where m <= n, "
            "and mem_mask = keep[:, None, :], (B, 1, M); every decoder block in turn, each reading "
            "the previous one's output, block(X, X_mem, causal, mem_mask); then ln_dec and W_vocab."
        ),
        solution=scratch.Seq2Seq,
        mistakes=DECODE_MISTAKES,
        cases=_decode_cases,
        observe=_observe_decode,
        expected=_expected_decode,
        describe=_describe_decode,
        atol=1e-10,
        rtol=1e-8,
        example="Seq2Seq",
        passed="matches the package's Seq2Seq, its weights loaded into yours,",
    )
)


# ---------------------------------------------------------------------------------------------------
# The learner's whole model and its training on dates (lab part 9)


def lab_seq2seq(
    attention: type[nn.Module] = scratch.MultiHeadAttention,
    decoder_block: type[nn.Module] = scratch.DecoderBlock,
    decode: Callable[..., Tensor] = scratch.Seq2Seq.decode,
) -> type[nn.Module]:
    """``scratch/seq2seq.py``'s ``Seq2Seq`` built from the lab's parts: ``attention`` in every attention
    layer (the encoder's and both of every decoder block's), ``decoder_block`` for every decoder block,
    ``decode`` as its decoder's forward pass. Its parameters have the file's names, so
    :func:`scratch_state_dict` of a package model loads into it. With the defaults, the references,
    it computes what the file's ``Seq2Seq`` computes."""

    class LabSeq2Seq(scratch.Seq2Seq):
        parts = (attention, decoder_block, decode)

        def __init__(self, config) -> None:
            super().__init__(config)
            D, H = config.d_model, config.H
            self.decoder = nn.ModuleList(
                decoder_block(D, H) for _ in range(config.n_decoder_layers)
            )
            for block in self.encoder:
                block.attn = attention(D, H)
            for block in self.decoder:
                block.self_attn, block.cross_attn = attention(D, H), attention(D, H)

    LabSeq2Seq.decode = decode
    return LabSeq2Seq


REFERENCE_PARTS = (scratch.MultiHeadAttention, scratch.DecoderBlock, scratch.Seq2Seq.decode)


def package_copy(model: nn.Module) -> PackageSeq2Seq:
    """The package's ``Seq2Seq`` with the weights of ``model`` (a :func:`lab_seq2seq` or the file's
    ``Seq2Seq``), on its device and in its dtype: for the package's cached decoding, beam search and
    attention maps."""
    weight = next(model.parameters())
    with torch.random.fork_rng(devices=[]):  # its own initialisation is overwritten
        package = PackageSeq2Seq(model.config).to(device=weight.device, dtype=weight.dtype)
    own = model.state_dict()
    package.load_state_dict(
        {k: torch.cat([own[n] for n in scratch_names(k)]) for k in package.state_dict()}
    )
    return package.eval()


class RecipeOptimizer:
    """The recipe's optimizer as a training step sees it: ``zero_grad()`` and ``step()``. It is
    :func:`~transformer_course.train.make_optimizer`'s AdamW, whose ``step()`` first clips the
    gradients' global norm to ``grad_clip``, as :func:`~transformer_course.train.train` does between
    the backward pass and the update; the loop sets the learning rate of every step."""

    def __init__(self, model: nn.Module, cfg: TrainConfig) -> None:
        self.adamw = make_optimizer(model, cfg)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.clip = math.inf if cfg.grad_clip is None else cfg.grad_clip
        self.param_groups = self.adamw.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        nn.utils.clip_grad_norm_(self.params, self.clip)  # eq. (eq-train-clip)
        self.adamw.step()


@dataclass
class LabRun:
    """The learner's model trained on dates: ``model`` (the class given to :func:`train_on_dates`),
    its copy in the package's ``Seq2Seq`` (``package``), the loss of every step, the seconds the steps
    took and the training pairs; ``chapter_run`` says whether it is the chapter's run, reused."""

    model: nn.Module
    package: PackageSeq2Seq
    losses: list[float]
    seconds: float
    train_pairs: list[tuple[str, str]]
    chapter_run: bool


def train_on_dates(
    Model: type[nn.Module],
    step: Callable[..., Any],
    recipe: DatesRecipe = DATES_RECIPE,
    device: torch.device | str = "cpu",
    steps: int | None = None,
    seed: int = 0,
) -> LabRun:
    """Part 9: train a ``Model`` (:func:`lab_seq2seq` of the lab's parts) on dates with the training
    step ``step(model, optimizer, src, tgt)``, the chapter's recipe and data: the same initialisation
    (the package's, loaded by name), the same batches, AdamW with clipping (:class:`RecipeOptimizer`),
    warm-up and cosine decay (:func:`~transformer_course.train.lr_at`), every step (no time budget).

    When every part and the step are the reference solutions, this is the chapter's run,
    ``train_dates(recipe, device, steps, seed)``, and it is returned as that run makes it (reused, not
    trained again, where ``make test`` keeps the chapter's runs); ``tests/test_encoder_decoder_lab.py``
    proves the inline training with the references the same computation (on the CPU: on a GPU the
    chapter's run computes in bfloat16, the inline one in float32)."""
    if getattr(Model, "parts", None) == REFERENCE_PARTS and step is train_step:
        run = train_dates(recipe, device, steps, seed)
        model = Model(run.model.config).to(device)
        model.load_state_dict(scratch_state_dict(run.model))
        hist = run.history
        return LabRun(model.eval(), run.model.eval(), list(hist.train_loss), hist.seconds,
                      run.train_pairs, chapter_run=True)  # fmt: skip
    recipe = recipe.with_steps(steps)
    torch.manual_seed(seed)  # as train_dates: the data, then the package's initialisation
    task = DateTask()
    pairs = task.sample(recipe.n_train, seed=1)
    src, tgt = (t.to(device) for t in task.tensors(pairs))
    config = Seq2SeqConfig(
        task.vocab_size, task.vocab_size, task.src_len, task.tgt_len, recipe.d_model, recipe.H,
        recipe.n_encoder_layers, recipe.n_decoder_layers,
    )  # fmt: skip
    package = PackageSeq2Seq(config).to(device)
    model = Model(config).to(device)
    model.load_state_dict(scratch_state_dict(package))
    cfg = dataclasses.replace(recipe.train, seed=seed)
    optimizer = RecipeOptimizer(model, cfg)
    gen = torch.Generator().manual_seed(cfg.seed)  # the batches, as tc.train.train draws them
    losses = []
    start = time.perf_counter()
    for i in range(cfg.max_steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(i, cfg)  # eq. (eq-train-schedule)
        model.train()
        rows = torch.randint(0, len(src), (recipe.batch_size,), generator=gen).to(device)
        losses.append(float(step(model, optimizer, src[rows], tgt[rows])))
    seconds = time.perf_counter() - start
    model.eval()
    return LabRun(model, package_copy(model), losses, seconds, pairs, chapter_run=False)


# ---------------------------------------------------------------------------------------------------
# 7. One training step: shift, forward, the loss without the padding, backward, step (the chapter's
#    eq-ed-shift and eq-ed-loss)


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, src: Tensor, tgt: Tensor
) -> float:
    """One teacher-forced step on a batch: ``src (B, M)``, ``tgt (B, N + 1)`` = BOS, the target, EOS,
    padding (``model.config.pad_id``); returns the loss, the mean cross-entropy over the real
    target tokens."""
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # the decoder reads BOS, y_1..; predicts y_1, .., EOS
    logits = model(src, tgt_in)  # (B, N, |V|): every position at once
    loss = F.cross_entropy(  # (B N, |V|) against (B N,); padded targets do not count
        logits.flatten(0, 1), tgt_out.flatten(), ignore_index=model.config.pad_id
    )
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _wrong_step(
    reads: str = "shifted",
    ignore_pad: bool = True,
    reduction: str = "mean",
    zero_grad: bool = True,
    step: bool = True,
    flatten: bool = True,
) -> Callable:
    """A training step with one typical mistake (the reference with every default)."""

    def wrong(model, optimizer, src, tgt):
        tgt_in, tgt_out = {
            "shifted": (tgt[:, :-1], tgt[:, 1:]),
            "unshifted": (tgt[:, :-1], tgt[:, :-1]),
            "wrong_way": (tgt[:, 1:], tgt[:, :-1]),
            "whole": (tgt, tgt[:, 1:]),
        }[reads]
        logits = model(src, tgt_in)
        pad = model.config.pad_id if ignore_pad else -100
        if not flatten:  # (B, N, |V|) as it comes: cross_entropy takes dim 1 for the classes
            loss = F.cross_entropy(logits, tgt_out, ignore_index=pad)
        elif reduction == "per_sequence":
            each = F.cross_entropy(
                logits.transpose(1, 2), tgt_out, ignore_index=pad, reduction="none"
            )
            real = (tgt_out != pad).double()
            loss = ((each * real).sum(1) / real.sum(1)).mean()
        else:
            loss = F.cross_entropy(
                logits.flatten(0, 1), tgt_out.flatten(), ignore_index=pad, reduction=reduction
            )
        if zero_grad:
            optimizer.zero_grad()
        loss.backward()
        if step:
            optimizer.step()
        return loss.item()

    return wrong


WHY_STEP_PAD_COUNTED = (
    "the padded target positions count in the loss: they are no tokens to predict, and counting them "
    "trains the model to predict padding. Leave them out: F.cross_entropy(..., "
    "ignore_index=model.config.pad_id)."
)
WHY_STEP_NOT_SHIFTED = (
    "the targets are not shifted: each position is scored against the very token it reads. The "
    "decoder reads tgt[:, :-1] (BOS first) and position n is scored against the next token, "
    "tgt[:, 1:]."
)
WHY_STEP_WRONG_WAY = (
    "the shift goes the wrong way: the decoder reads tgt[:, 1:], the answers, and is scored against "
    "tgt[:, :-1]. It reads tgt[:, :-1] (BOS first) and is scored against tgt[:, 1:]."
)
WHY_STEP_WHOLE = (
    "the decoder reads the whole target, one position more than there are tokens to predict: it "
    "reads tgt[:, :-1] and is scored against tgt[:, 1:]."
)
WHY_STEP_NOT_FLAT = (
    "F.cross_entropy was given the (B, N, |V|) logits as they are: it takes dim 1 for the classes. "
    "Flatten them to (B N, |V|) and the targets to (B N,): logits.flatten(0, 1), tgt_out.flatten()."
)
WHY_STEP_NO_ZERO_GRAD = (
    "the gradients accumulate from step to step: call optimizer.zero_grad() before loss.backward()."
)
WHY_STEP_SUM = (
    "the loss is the sum over the target tokens; it is their mean (F.cross_entropy's default "
    "reduction), so that the step does not grow with the batch and the target lengths."
)
WHY_STEP_PER_SEQUENCE = (
    "you averaged each sequence's loss, then the sequences, so a short target weighs as much as a "
    "long one; the loss is the mean over all real target tokens of the batch."
)
WHY_STEP_NO_STEP = (
    "the parameters did not change: call optimizer.step() after loss.backward() (and "
    "optimizer.zero_grad() before the backward pass, not between it and the step)."
)
STEP_MISTAKES = [
    Mistake(WHY_STEP_PAD_COUNTED, _wrong_step(ignore_pad=False)),
    Mistake(WHY_STEP_NOT_SHIFTED, _wrong_step(reads="unshifted")),
    Mistake(WHY_STEP_WRONG_WAY, _wrong_step(reads="wrong_way")),
    Mistake(WHY_STEP_WHOLE, _wrong_step(reads="whole"), "raises"),
    Mistake(WHY_STEP_NOT_FLAT, _wrong_step(flatten=False), "raises"),
    Mistake(WHY_STEP_NO_ZERO_GRAD, _wrong_step(zero_grad=False)),
    Mistake(WHY_STEP_SUM, _wrong_step(reduction="sum")),
    Mistake(WHY_STEP_PER_SEQUENCE, _wrong_step(reduction="per_sequence")),
    Mistake(WHY_STEP_NO_STEP, _wrong_step(step=False)),
]
_LR = 0.1  # plain SGD, so that the size of every gradient shows in the weights


@lru_cache(maxsize=1)
def _date_task() -> DateTask:
    return DateTask()


def _step_cases() -> list[tuple]:
    """``(config, batches)``: the task turned around (an ISO date in, a human date out), so that the
    targets have different lengths and padding; two batches, so two steps."""
    task = _date_task()
    V = task.vocab_size
    pairs = task.sample(8, seed=21)
    src = torch.tensor([task.encode(iso, 11) for _, iso in pairs])  # 10 characters + EOS
    tgt = torch.tensor([task.encode(h, task.src_len + 1, bos=True) for h, _ in pairs])
    tgt = tgt[:, : int((tgt != PAD).sum(dim=1).max())]  # BOS, the date, EOS, padding
    config = Seq2SeqConfig(V, V, 11, task.src_len + 1, d_model=16, H=2, n_encoder_layers=1,
                           n_decoder_layers=1)  # fmt: skip
    return [(config, [(src[:4], tgt[:4]), (src[4:], tgt[4:])])]


def _describe_step(case: tuple) -> str:
    config, batches = case
    return (
        f"case: {len(batches)} steps of SGD (lr {_LR}) on batches src {tuple(batches[0][0].shape)}, "
        f"tgt {tuple(batches[0][1].shape)} with padded targets; D={config.d_model}, H={config.H}"
    )


def _flat(state: dict[str, Tensor]) -> Tensor:
    return torch.cat([state[k].detach().double().reshape(-1) for k in sorted(state)])


def _observe_step(answer: Any, case: tuple) -> dict:
    config, batches = case
    model = scratch.Seq2Seq(config).double()
    model.load_state_dict(scratch_state_dict(package_seq2seq(config)))
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=_LR)
    losses = []
    for src, tgt in batches:
        loss = answer(model, optimizer, src.clone(), tgt.clone())
        try:
            losses.append(float(loss.detach() if isinstance(loss, Tensor) else loss))
        except (TypeError, ValueError, RuntimeError):
            raise _Verdict(
                f"train_step must return the loss as a number (loss.item()), got a "
                f"{type(loss).__name__}."
            ) from None
    return {
        "the losses": torch.tensor(losses, dtype=torch.float64),
        "the weights after the steps": _flat(model.state_dict()),
    }


def _expected_step(case: tuple) -> dict:
    config, batches = case
    package = copy.deepcopy(package_seq2seq(config)).requires_grad_(True).train()
    optimizer = torch.optim.SGD(package.parameters(), lr=_LR)
    losses = []
    for src, tgt in batches:
        logits, _ = package(src, tgt[:, :-1])  # the package's loss, eq-ed-loss, in float64:
        loss = F.cross_entropy(  # Seq2Seq.forward takes it in float32, whose rounding varies
            logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=config.pad_id
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {
        "the losses": torch.tensor(losses, dtype=torch.float64),
        "the weights after the steps": _flat(scratch_state_dict(package)),
    }


_register(
    ScratchExercise(
        name="encoder_decoder.train_step",
        prompt=(
            "Write train_step(model, optimizer, src, tgt) for a scratch Seq2Seq (model(src, tgt_in) "
            "returns the logits (B, N, |V|)): tgt (B, N + 1) is BOS, the target, EOS, then padding "
            "(model.config.pad_id). Feed the decoder tgt_in = tgt[:, :-1], score its logits against "
            "tgt_out = tgt[:, 1:] with the mean cross-entropy over the real target tokens (padding "
            "left out), then zero the gradients, backpropagate and step the optimizer; return the "
            "loss as a number."
        ),
        solution=train_step,
        mistakes=STEP_MISTAKES,
        cases=_step_cases,
        observe=_observe_step,
        expected=_expected_step,
        describe=_describe_step,
        kind="function",
        example="train_step",
        atol=1e-10,
        rtol=1e-8,
        passed="the losses and the weights match two steps of the package's Seq2Seq and its loss",
    )
)


# ---------------------------------------------------------------------------------------------------
# 8. Greedy decoding without a cache (the chapter's eq-ed-greedy); the reference solution is
#    scratch/seq2seq.py's greedy_decode


def _wrong_greedy(
    pad_after_eos: bool = True,
    mark_first: bool = False,
    stop: str = "all",
    position: int = -1,
    last_only: bool = False,
    start_with_bos: bool = True,
    short: bool = False,
    only_new: bool = False,
    trim: bool = False,
) -> Callable:
    """Greedy decoding with one typical mistake (the reference with every default)."""

    @torch.no_grad()
    def wrong(model, src, bos, eos):
        c, B = model.config, src.shape[0]
        X_mem, keep = model.encode(src)
        out = torch.full((B, c.tgt_len), c.pad_id, dtype=torch.long)
        out[:, 0] = bos if start_with_bos else c.pad_id
        done = torch.zeros(B, dtype=torch.bool)
        for t in range(1, c.tgt_len - 1 if short else c.tgt_len):
            prefix = out[:, t - 1 : t] if last_only else out[:, :t]
            nxt = model.decode(prefix, X_mem, keep)[:, position].argmax(dim=-1)
            if mark_first:
                done |= nxt == eos
            out[:, t] = torch.where(done, c.pad_id, nxt) if pad_after_eos else nxt
            done |= nxt == eos
            if (done.any() if stop == "any" else done.all()) and stop != "never":
                break
        if trim:  # only the positions written: shorter than tgt_len when every row stopped early
            return out[:, : t + 1]
        return out[:, 1:] if only_new else out

    return wrong


WHY_GREEDY_AFTER_EOS = (
    "your rows go on after their EOS: once a row has produced EOS, write padding in it (torch.where("
    "done, pad_id, nxt)), and stop when every row is done."
)
WHY_GREEDY_EOS_PADDED = (
    "the EOS itself is replaced by padding: you mark a row done before writing its token. Write the "
    "token first, out[:, t] = torch.where(done, pad_id, nxt), then done |= nxt == eos."
)
WHY_GREEDY_STOP_ANY = (
    "you stop as soon as one row has produced EOS (done.any()), which cuts the other rows short; stop "
    "when every row is done, done.all()."
)
WHY_GREEDY_FIRST_POSITION = (
    "you chose the next token from the first position's logits; the prediction of the next token is "
    "at the last position of the prefix, logits[:, -1]."
)
WHY_GREEDY_LAST_TOKEN = (
    "you fed only the newest token to the decoder, so it predicts from one token, read at position 0; "
    "without a cache the decoder reads the whole prefix at every step, model.decode(out[:, :t], ...)."
)
WHY_GREEDY_NO_BOS = (
    "the first decoder input is padding, not bos: out[:, 0] = bos, the start token the model was "
    "trained to read first."
)
WHY_GREEDY_SHORT = (
    "your loop stops one step early and never writes the last position; a row may use all tgt_len "
    "positions: t runs from 1 to tgt_len - 1, range(1, tgt_len)."
)
WHY_GREEDY_TRIM = (
    "when every row stops before the last position, your tensor stops there too; return "
    "(B, tgt_len) token ids whatever happens, padding (pad_id) after the last token written, as the "
    "package's greedy_decode does."
)
WHY_GREEDY_ONLY_NEW = (
    "you returned the generated tokens only; return the whole (B, tgt_len) tensor, bos first, as the "
    "package's greedy_decode does."
)
GREEDY_MISTAKES = [
    Mistake(WHY_GREEDY_AFTER_EOS, _wrong_greedy(pad_after_eos=False, stop="never")),
    Mistake(WHY_GREEDY_EOS_PADDED, _wrong_greedy(mark_first=True)),
    Mistake(WHY_GREEDY_STOP_ANY, _wrong_greedy(stop="any")),
    Mistake(WHY_GREEDY_FIRST_POSITION, _wrong_greedy(position=0)),
    Mistake(WHY_GREEDY_LAST_TOKEN, _wrong_greedy(last_only=True)),
    Mistake(WHY_GREEDY_NO_BOS, _wrong_greedy(start_with_bos=False)),
    Mistake(WHY_GREEDY_SHORT, _wrong_greedy(short=True)),
    Mistake(WHY_GREEDY_ONLY_NEW, _wrong_greedy(only_new=True), "shape"),
    Mistake(WHY_GREEDY_TRIM, _wrong_greedy(trim=True), "shape"),
]


def _greedy_cases() -> list[tuple]:
    """``(config, seed, src)``: untrained models whose greedy outputs end at different steps, and in
    one row of each of the first two cases never (it fills all tgt_len positions); in the third case
    every row ends early, at the same step."""
    task = _date_task()
    V = task.vocab_size
    src = task.tensors(task.sample(6, seed=31))[0]
    src3 = task.tensors(task.sample(6, seed=32))[0]
    width = int((src3 != PAD).sum(dim=1).max())
    return [
        (Seq2SeqConfig(V, V, task.src_len, task.tgt_len, d_model=16, H=2, n_encoder_layers=1,
                       n_decoder_layers=1), GREEDY_SEEDS[0], src),
        (Seq2SeqConfig(V, V, task.src_len, task.tgt_len, d_model=24, H=4, n_encoder_layers=2,
                       n_decoder_layers=2), GREEDY_SEEDS[1], src3[:, :width]),
        (Seq2SeqConfig(V, V, task.src_len, task.tgt_len, d_model=16, H=2, n_encoder_layers=1,
                       n_decoder_layers=1), GREEDY_SEEDS[2], task.tensors(task.sample(4, seed=33))[0]),
    ]  # fmt: skip


# The checkers' weights of each case (package_seq2seq's seed): chosen so that the rows end at different
# steps (the first case has a row whose first token is EOS, both a row that never ends), so that
# every mistake gives other tokens than every other mistake, and (the third) so that every row ends
# at step 5 of 11.
GREEDY_SEEDS = (17, 22, 11)


def _greedy_model(config: Seq2SeqConfig, seed: int) -> nn.Module:
    """The scratch ``Seq2Seq`` with the package model's checker weights, float64, evaluation mode."""
    with torch.random.fork_rng(devices=[]):
        model = scratch.Seq2Seq(config).double().eval()
    model.load_state_dict(scratch_state_dict(package_seq2seq(config, seed)))
    return model


def _describe_greedy(case: tuple) -> str:
    config, _, src = case
    return (
        f"case: src (B, M) = {tuple(src.shape)}, tgt_len = {config.tgt_len}, D={config.d_model}, "
        f"L_e = {config.n_encoder_layers}, L_d = {config.n_decoder_layers}"
    )


def _observe_greedy(answer: Any, case: tuple) -> dict:
    config, seed, src = case
    out = answer(_greedy_model(config, seed), src.clone(), BOS, EOS)
    return {"the tokens": _tensor(out, "greedy_decode")}


def _expected_greedy(case: tuple) -> dict:
    config, seed, src = case  # the package's greedy decoding, with its caches
    return {"the tokens": package_seq2seq(config, seed).greedy_decode(src, BOS, EOS)}


_register(
    ScratchExercise(
        name="encoder_decoder.greedy_decode",
        prompt=(
            "Write greedy_decode(model, src, bos, eos) for a scratch Seq2Seq, without a cache: encode "
            "the source once (model.encode(src) -> X_mem, keep); start every row with bos; at each "
            "step run the decoder on the whole prefix, model.decode(out[:, :t], X_mem, keep), and "
            "append the arg-max of the last position's logits; after a row's eos write only padding "
            "(model.config.pad_id); stop when every row has produced eos or after tgt_len positions. "
            "Return (B, tgt_len) token ids."
        ),
        solution=greedy_decode,
        mistakes=GREEDY_MISTAKES,
        cases=_greedy_cases,
        observe=_observe_greedy,
        expected=_expected_greedy,
        describe=_describe_greedy,
        kind="function",
        example="greedy_decode",
        atol=0.0,
        rtol=0.0,
        passed="the same tokens as the package's cached greedy_decode",
    )
)
