"""Exercises of the *Encoder-decoder* lab: shifted targets for teacher forcing, the key padding mask,
cross-attention from scratch, and the decoder's causal + padding mask.

Chapter: *Encoder-decoder* (Dramko 2025 sec. 5.1-5.2; Turner 2023 sec. 4.3; Vaswani et al. 2017).
Token ids follow :class:`transformer_course.data.DateTask`: ``0`` is padding, ``1`` is BOS, ``2`` is
EOS. Masks are bool, ``True`` = may attend, as everywhere in the package.

The checker reports a wrong answer by subtracting it from the reference, which bool tensors do not
support, so the two mask exercises register a view of their solution that returns the mask as 0/1
float64 (:func:`_compared_as_float`); a learner may return a bool or a 0/1 tensor. The bool solution
itself is ``key_padding_mask.__wrapped__`` (and is what ``tc.exercises.solution`` prints).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..data import DateTask
from . import Mistake, exercise

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
