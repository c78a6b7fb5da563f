"""Exercises of the *Data as tokens* lab: characters to ids, one-hot embeddings, a BPE merge, special
tokens and image patches.

Each solution is written out in plain torch (no call into :mod:`transformer_course.tokens`), so that
``tc.exercises.solution(name)`` shows the learner the whole idea; the tests check that the package's
functions agree with these solutions.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from . import Mistake, exercise

# Lines of Coriolanus (public domain; the opening of tiny-shakespeare) for the text exercises.
_LINES = (
    "Before we proceed any further, hear me speak.",
    "You are all resolved rather to die than to famish?",
    "First, you know Caius Marcius is chief enemy to the people.",
    "Let us kill him, and we'll have corn at our own price.",
    "We are accounted poor citizens, the patricians good.",
)


# --------------------------------------------------------------------------------------------------
# 1. Characters to ids
# --------------------------------------------------------------------------------------------------


def _text_inputs(gen: torch.Generator, trial: int) -> tuple[str]:
    line = _LINES[trial % len(_LINES)]
    start = int(torch.randint(0, 8, (1,), generator=gen))
    return (line[start : start + 30],)


@exercise(
    name="tokens.char_encode",
    prompt=(
        "Build a character vocabulary from `text` (its distinct characters, sorted) and return the "
        "id of every character of `text` as a 1-D torch.long tensor of length len(text)."
    ),
    make_inputs=_text_inputs,
    mistakes=[
        Mistake(
            "your vocabulary lists the characters in order of first appearance; the course sorts the "
            "distinct characters (sorted(set(text))), so ' ' and capitals come first.",
            lambda text: torch.tensor(
                [list(dict.fromkeys(text)).index(c) for c in text], dtype=torch.long
            ),
        ),
        Mistake(
            "your ids start at 1; ids are positions in the vocabulary list, counted from 0 (they index "
            "the rows of the embedding matrix).",
            lambda text: torch.tensor([sorted(set(text)).index(c) + 1 for c in text]),
        ),
        Mistake(
            "you returned Unicode code points (ord(c)); an id is the character's position in this "
            "text's own vocabulary, 0 .. V-1.",
            lambda text: torch.tensor([ord(c) for c in text], dtype=torch.long),
        ),
    ],
)
def char_encode(text: str) -> Tensor:
    vocab = sorted(set(text))  # the distinct characters, sorted by code point
    stoi = {c: i for i, c in enumerate(vocab)}  # character -> id
    return torch.tensor([stoi[c] for c in text], dtype=torch.long)  # (len(text),)


# --------------------------------------------------------------------------------------------------
# 2. One-hot vectors times E equal a row lookup
# --------------------------------------------------------------------------------------------------


def _embed_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor]:
    B, N, V, D = ((2, 5, 7, 3), (1, 8, 10, 4), (3, 4, 6, 5))[trial % 3]
    ids = torch.randint(0, V, (B, N), generator=gen)
    ids[0, 0] = 0  # token 0 always appears: it is the one an off-by-one loses
    return ids, torch.randn(V, D, generator=gen, dtype=torch.float64)


@exercise(
    name="tokens.one_hot_embed",
    prompt=(
        "ids is a (B, N) tensor of token ids in 0..V-1 and E the (V, D) embedding matrix. Without "
        "indexing E, build the one-hot vectors O (B, N, V) and return O @ E, shape (B, N, D)."
    ),
    make_inputs=_embed_inputs,
    mistakes=[
        Mistake(
            "you returned the one-hot tensor O itself, shape (B, N, V); the embeddings are O @ E, "
            "shape (B, N, D).",
            lambda ids, E: torch.nn.functional.one_hot(ids, E.shape[0]).to(E.dtype),
        ),
        Mistake(
            "each token got the row before its own (E[s - 1]): ids count from 0, so token s is row s "
            "of E and token 0 is the first row. (Some sources number tokens 1..V; PyTorch does not.)",
            lambda ids, E: E[(ids - 1) % E.shape[0]],
        ),
    ],
)
def one_hot_embed(ids: Tensor, E: Tensor) -> Tensor:
    V = E.shape[0]
    O = torch.nn.functional.one_hot(ids, num_classes=V).to(E.dtype)  # (B, N, V), one 1 per row
    return O @ E  # (B, N, V) @ (V, D) -> (B, N, D): row n of O picks row s_n of E


# --------------------------------------------------------------------------------------------------
# 3. One byte-pair-encoding merge
# --------------------------------------------------------------------------------------------------


def _merge_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, tuple[int, int], int]:
    if trial == 0:  # "aaabdaaabac": the pair (a, a) overlaps itself in "aaa"
        return torch.tensor(list(b"aaabdaaabac")), (97, 97), 258
    ids = torch.randint(97, 101, (14 + 3 * trial,), generator=gen)
    counts: dict[tuple[int, int], int] = {}
    for a, b in zip(ids[:-1].tolist(), ids[1:].tolist(), strict=True):
        counts[(a, b)] = counts.get((a, b), 0) + 1
    pair = min(counts, key=lambda p: (-counts[p], p))  # the most frequent pair, as BPE picks it
    return ids, pair, 256 + 4 * trial


def _merge_with_id(ids: Tensor, pair: tuple[int, int], new_id: int) -> Tensor:
    return bpe_merge(ids, pair, new_id)


def _merge_first_only(ids: Tensor, pair: tuple[int, int], new_id: int) -> Tensor:
    seq = ids.tolist()
    for i in range(len(seq) - 1):
        if (seq[i], seq[i + 1]) == tuple(pair):
            return torch.tensor([*seq[:i], new_id, *seq[i + 2 :]])
    return ids


def _merge_without_skip(ids: Tensor, pair: tuple[int, int], new_id: int) -> Tensor:
    seq, out = ids.tolist(), []
    for i in range(len(seq)):  # moves on by one even after a match
        if i + 1 < len(seq) and (seq[i], seq[i + 1]) == tuple(pair):
            out.append(new_id)
        else:
            out.append(seq[i])
    return torch.tensor(out)


@exercise(
    name="tokens.bpe_merge",
    prompt=(
        "Apply one BPE merge: scan the 1-D tensor `ids` left to right and replace every "
        "occurrence of the adjacent pair `pair = (a, b)` by the single id `new_id` (occurrences "
        "do not overlap: after a match, continue after b). Return a 1-D torch.long tensor; it is "
        "shorter than ids by the number of merges made."
    ),
    make_inputs=_merge_inputs,
    mistakes=[
        Mistake(
            "you merged only the first occurrence of the pair; BPE replaces every occurrence, "
            "scanning the whole sequence.",
            _merge_first_only,
        ),
        Mistake(
            "after a match, move past both ids of the pair (i += 2): your output keeps the second "
            "id of each merged pair, and with the pair (a, a) turns 'a a a' into 'new new a' "
            "instead of 'new a'.",
            _merge_without_skip,
        ),
        Mistake(
            "the merged token must get the id you are given, new_id; yours used 256 (the first merge's "
            "id). Later merges get 257, 258, ...",
            lambda ids, pair, new_id: _merge_with_id(ids, pair, 256),
        ),
        Mistake(
            "the merged token must get the id you are given, new_id; yours used max(ids) + 1, which "
            "may clash with a token learned earlier.",
            lambda ids, pair, new_id: _merge_with_id(ids, pair, int(ids.max()) + 1),
        ),
    ],
)
def bpe_merge(ids: Tensor, pair: tuple[int, int], new_id: int) -> Tensor:
    seq, out, i = ids.tolist(), [], 0
    while i < len(seq):
        if i + 1 < len(seq) and (seq[i], seq[i + 1]) == tuple(pair):
            out.append(new_id)  # the pair becomes one new token
            i += 2  # skip both halves: matches never overlap
        else:
            out.append(seq[i])
            i += 1
    return torch.tensor(out, dtype=torch.long)


# --------------------------------------------------------------------------------------------------
# 4. Patchify by hand
# --------------------------------------------------------------------------------------------------


def _patch_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, int]:
    B, C_in, H_px, W_px, P = ((2, 3, 6, 4, 2), (1, 2, 8, 12, 4), (2, 3, 9, 6, 3))[trial % 3]
    return torch.randn(B, C_in, H_px, W_px, generator=gen, dtype=torch.float64), P


def _patches_by_loop(images: Tensor, P: int, column_major: bool, layout: str) -> Tensor:
    B, C_in, H_px, W_px = images.shape
    grid = [(i, j) for i in range(H_px // P) for j in range(W_px // P)]
    if column_major:
        grid = sorted(grid, key=lambda ij: (ij[1], ij[0]))
    rows = []
    for i, j in grid:
        patch = images[:, :, i * P : (i + 1) * P, j * P : (j + 1) * P]  # (B, C_in, P, P)
        if layout == "transposed":
            patch = patch.transpose(-2, -1)  # (B, C_in, P_col, P_row)
        elif layout == "channels_last":
            patch = patch.permute(0, 2, 3, 1)  # (B, P, P, C_in)
        rows.append(patch.reshape(B, C_in * P * P))
    return torch.stack(rows, dim=1)  # (B, N, C_in*P*P)


@exercise(
    name="tokens.patchify",
    prompt=(
        "Cut a batch of images (B, C_in, H_px, W_px) into non-overlapping P x P patches and return them as "
        "tokens (B, N, C_in*P*P), N = (H_px/P)*(W_px/P). Patch order: row-major (left to right along the "
        "top row of patches, then the next row). Inside a patch: channel first, then pixel row, "
        "then pixel column, i.e. patch.reshape(C_in*P*P) of a (C_in, P, P) patch."
    ),
    make_inputs=_patch_inputs,
    mistakes=[
        Mistake(
            "your patches are in column-major order (down the first column of patches first); the "
            "course goes along each row of patches first, like reading text.",
            lambda images, P: _patches_by_loop(images, P, True, "plain"),
        ),
        Mistake(
            "each patch is transposed: you flattened pixel columns before pixel rows. Flatten a "
            "(C_in, P, P) patch as channel, row, column.",
            lambda images, P: _patches_by_loop(images, P, False, "transposed"),
        ),
        Mistake(
            "your patches are flattened channel-last, as (P, P, C_in); the course (and Conv2d's weight "
            "layout) flattens (C_in, P, P): all of channel 0, then channel 1, ...",
            lambda images, P: _patches_by_loop(images, P, False, "channels_last"),
        ),
        Mistake(
            "you reshaped the images to (B, N, C_in*P*P) directly, without moving the patch axes "
            "together first: each 'patch' mixes pixels from different patches and channels. Reshape "
            "to (B, C_in, H_px/P, P, W_px/P, P), permute to (B, H_px/P, W_px/P, C_in, P, P), then reshape.",
            lambda images, P: images.reshape(images.shape[0], -1, images.shape[1] * P * P),
        ),
    ],
)
def patchify(images: Tensor, P: int) -> Tensor:
    B, C_in, H_px, W_px = images.shape
    x = images.reshape(B, C_in, H_px // P, P, W_px // P, P)  # (B, C_in, patch rows, P, cols, P)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, H_px/P, W_px/P, C_in, P, P): patch index first
    return x.reshape(B, (H_px // P) * (W_px // P), C_in * P * P)  # (B, N, C_in*P*P)


# --------------------------------------------------------------------------------------------------
# 5. How many tokens does an image make?
# --------------------------------------------------------------------------------------------------


@exercise(
    name="tokens.count_tokens",
    prompt=(
        "An H_px x W_px image with C_in channels is cut into P x P patches; pixels left over at the "
        "right and bottom edges (when P does not divide H_px or W_px) are cropped. Return (N, d): the "
        "number of patch tokens N and the length d of a flattened patch vec(patch_n)."
    ),
    make_inputs=lambda gen, trial: ((224, 224, 16, 3), (32, 48, 8, 1), (30, 45, 7, 3))[trial % 3],
    mistakes=[
        Mistake(
            "N is the number of P x P patches, so divide the pixel count by P twice (once per side): "
            "you divided H_px*W_px by P only once.",
            lambda H_px, W_px, P, C_in: torch.tensor([H_px * W_px // P, C_in * P * P]),
        ),
        Mistake(
            "a patch holds C_in*P*P numbers, one per channel and pixel; your d forgot the C_in channels.",
            lambda H_px, W_px, P, C_in: torch.tensor([(H_px // P) * (W_px // P), P * P]),
        ),
        Mistake(
            "the patches form a grid of (H_px/P) rows times (W_px/P) columns: multiply the two counts, "
            "do not add them.",
            lambda H_px, W_px, P, C_in: torch.tensor([H_px // P + W_px // P, C_in * P * P]),
        ),
        Mistake(
            "you rounded up, counting partial patches at the edges; the leftover pixels are cropped, "
            "so use floor division on each side: (H_px // P) * (W_px // P).",
            lambda H_px, W_px, P, C_in: torch.tensor(
                [math.ceil(H_px / P) * math.ceil(W_px / P), C_in * P * P]
            ),
        ),
        Mistake(
            "floor each side separately: H_px*W_px // (P*P) counts leftover edge pixels as if they formed "
            "whole patches; use (H_px // P) * (W_px // P).",
            lambda H_px, W_px, P, C_in: torch.tensor([H_px * W_px // (P * P), C_in * P * P]),
        ),
    ],
)
def count_tokens(H_px: int, W_px: int, P: int, C_in: int) -> Tensor:
    N = (H_px // P) * (W_px // P)  # whole patches only: a grid of H_px//P rows and W_px//P columns
    d = C_in * P * P  # one number per channel and pixel of a patch
    return torch.tensor([N, d])


# --------------------------------------------------------------------------------------------------
# 6. Special tokens
# --------------------------------------------------------------------------------------------------

# Three special tokens; "<|end|>" is a prefix of "<|end|>\n" (an end of turn that takes its newline).
_SPECIAL_IDS = {"<|endoftext|>": 400, "<|end|>": 401, "<|end|>\n": 402}


@functools.lru_cache(maxsize=1)
def _small_bpe():
    """A small BPE tokenizer of the package, learned from the exercise lines (no special tokens)."""
    from ..tokens import BPETokenizer  # the exercise's input; the solution never calls into it

    return BPETokenizer.train(" ".join(_LINES), vocab_size=300, pattern="course")


def _special_inputs(gen: torch.Generator, trial: int):
    specials = list(_SPECIAL_IDS)
    parts = []
    for k in range(4 + trial):
        line = _LINES[int(torch.randint(0, len(_LINES), (1,), generator=gen))]
        cut = int(torch.randint(10, len(line), (1,), generator=gen))
        parts.append(line[:cut])
        parts.append(specials[(k + trial) % 3])  # every special token, the prefix pair among them
    parts.insert(2, "<|end")  # only the start of a special token: ordinary text
    return "".join(parts), dict(_SPECIAL_IDS), _small_bpe().encode


def _encode_whole(text, special_ids, encode):
    return torch.tensor(encode(text), dtype=torch.long)


def _encode_shortest_first(text, special_ids, encode):
    specials = sorted(special_ids, key=len)  # the shortest first: "<|end|>" before "<|end|>\n"
    ids, start, i = [], 0, 0
    while i < len(text):
        match = next((s for s in specials if text.startswith(s, i)), None)
        if match is None:
            i += 1
            continue
        ids += [*encode(text[start:i]), special_ids[match]]
        i = start = i + len(match)
    return torch.tensor(ids + encode(text[start:]), dtype=torch.long)


def _encode_first_occurrence(text, special_ids, encode):
    ids, rest = [], text
    for special in sorted(special_ids, key=len, reverse=True):
        before, found, rest_after = rest.partition(special)  # only the first occurrence
        if found:
            ids += [*encode(before), special_ids[special]]
            rest = rest_after
    return torch.tensor(ids + encode(rest), dtype=torch.long)


@exercise(
    name="tokens.encode_with_special",
    prompt=(
        "Encode `text` with special tokens: `special_ids` maps each special token (a string such as "
        "'<|endoftext|>') to its id, and `encode(s)` returns the ordinary ids of a string without "
        "special tokens. Scan `text` from the left; where a special token starts, the longest one "
        "that matches there wins; it becomes its one id, and the text between special tokens goes "
        "through `encode`. Return the ids as a 1-D torch.long tensor."
    ),
    make_inputs=_special_inputs,
    mistakes=[
        Mistake(
            "the special tokens went through the ordinary encoder, so they were split into pieces "
            "and merged into their neighbours; find them first and give each its one id.",
            _encode_whole,
        ),
        Mistake(
            "where two special tokens start at the same place, take the longest: you matched "
            "'<|end|>' inside '<|end|>\\n' and left its newline as ordinary text (try the special "
            "tokens longest first).",
            _encode_shortest_first,
        ),
        Mistake(
            "only the first occurrence of each special token became its id (str.partition or "
            "str.find once); every occurrence is a special token.",
            _encode_first_occurrence,
        ),
    ],
)
def encode_with_special(text, special_ids, encode):
    specials = sorted(special_ids, key=len, reverse=True)  # the longest first
    ids, start, i = [], 0, 0
    while i < len(text):
        match = next((s for s in specials if text.startswith(s, i)), None)
        if match is None:
            i += 1  # ordinary text: look at the next position
            continue
        ids += encode(text[start:i])  # the ordinary text before the special token
        ids.append(special_ids[match])  # the special token: one id
        i = start = i + len(match)
    ids += encode(text[start:])  # the ordinary text after the last special token
    return torch.tensor(ids, dtype=torch.long)
