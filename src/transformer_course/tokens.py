"""Data as tokens: characters, byte-pair encoding and image patches.

Chapter: *Data as tokens* (Turner 2023, sec. 1; MIT 6.390, sec. 9.2; the notes on Bishop & Bishop 2024,
sec. 2.3 and 2.5). A transformer never sees text or pixels, only a sequence of tokens. This module
turns data into tokens three ways:

* :class:`CharTokenizer`: one token per character, the vocabulary being the sorted distinct
  characters of a text (tiny-shakespeare gives 65).
* :class:`BPETokenizer`: byte-pair encoding (Sennrich et al. 2016) on UTF-8 bytes, so every string
  can be encoded and there is no "unknown character".
* :func:`embedding` and :func:`embedding_reference`: token ids to vectors, a row lookup in an
  embedding matrix ``E`` (``|V| x D``, ``|V|`` the vocabulary size), equal to one-hot vectors times
  ``E`` (``eq-tok-onehot``).
* :func:`patchify` and :class:`PatchEmbedding`: an image cut into ``P x P`` patches, each flattened
  (the rows ``p_n`` of the book's ``X_pix``) and mapped linearly to a ``d_model`` vector,
  ``x_n = W_p p_n + b`` (Turner 2023, fig. 2, where the map is ``W``; Dosovitskiy et al. 2021).
  Convention: rows are tokens, so a batch of images becomes ``(B, N, d_model)``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .runtime import shape_of as _shape

__all__ = [
    "BPETokenizer",
    "CharTokenizer",
    "PatchEmbedding",
    "embedding",
    "embedding_reference",
    "merge_pair",
    "pair_counts",
    "patchify",
    "patchify_1d",
    "pretokenize",
    "unpatchify",
]


def _as_id_list(ids: Iterable[int] | Tensor) -> list[int]:
    """Token ids as a list of Python ints; a tensor must be 1-D (one sequence)."""
    if isinstance(ids, Tensor):
        if ids.dim() != 1:
            raise ValueError(
                f"ids has shape {_shape(ids)}; decode takes one sequence, a 1-D tensor of ids "
                "(decode a batch row by row: [tok.decode(row) for row in batch])"
            )
        return [int(i) for i in ids.tolist()]
    return [int(i) for i in ids]


# --------------------------------------------------------------------------------------------------
# Characters
# --------------------------------------------------------------------------------------------------


class CharTokenizer:
    """Character-level tokenizer: token ``i`` is the ``i``-th character of a fixed vocabulary.

    Attributes:
        itos: list of the vocabulary's characters; ``itos[i]`` is the character with id ``i``.
        stoi: dict from character to id, the inverse of ``itos``.
        vocab_size: number of distinct characters ``|V|``; ids run from ``0`` to ``|V| - 1``.

    Raises:
        ValueError: if ``chars`` is empty, repeats a character or holds a string that is not exactly
            one character.
    """

    def __init__(self, chars: Sequence[str]) -> None:
        chars = list(chars)
        if not chars:
            raise ValueError("the vocabulary is empty; build it from a non-empty text")
        bad = [c for c in chars if not isinstance(c, str) or len(c) != 1]
        if bad:
            raise ValueError(f"every vocabulary entry must be one character, got {bad[:5]!r}")
        if len(set(chars)) != len(chars):
            dup = sorted({c for c in chars if chars.count(c) > 1})
            raise ValueError(f"the vocabulary repeats {dup!r}; each character must appear once")
        self.itos: list[str] = chars
        self.stoi: dict[str, int] = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """Vocabulary = the sorted distinct characters of ``text`` (sorted by code point)."""
        if not text:
            raise ValueError("cannot build a vocabulary from an empty text")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        """The id of each character of ``text``, in order: ``len(encode(text)) == len(text)``.

        Raises:
            ValueError: listing every character of ``text`` missing from the vocabulary (each once,
                in order of first appearance).
        """
        unknown = [c for c in dict.fromkeys(text) if c not in self.stoi]
        if unknown:
            listed = ", ".join(repr(c) for c in unknown)
            raise ValueError(
                f"{len(unknown)} character(s) not in the vocabulary of {self.vocab_size}: "
                f"{listed}; build the tokenizer with CharTokenizer.from_text(...) on a text that "
                "contains them"
            )
        return [self.stoi[c] for c in text]

    def encode_tensor(self, text: str) -> Tensor:
        """:meth:`encode` as a 1-D ``torch.long`` tensor of shape ``(len(text),)`` (on the CPU)."""
        return torch.tensor(self.encode(text), dtype=torch.long)

    def decode(self, ids: Iterable[int] | Tensor) -> str:
        """The string whose characters have ids ``ids`` (a list or a 1-D tensor).

        Raises:
            ValueError: naming the first id outside ``0 .. vocab_size - 1``.
        """
        out = []
        for i in _as_id_list(ids):
            if not 0 <= i < self.vocab_size:
                raise ValueError(
                    f"id {i} is not a token id: valid ids are 0 to {self.vocab_size - 1} "
                    f"(vocab_size={self.vocab_size})"
                )
            out.append(self.itos[i])
        return "".join(out)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


# --------------------------------------------------------------------------------------------------
# Byte-pair encoding
# --------------------------------------------------------------------------------------------------

# A GPT-2-like pre-split: a word with at most one leading space, a run of punctuation with at most
# one leading space, or a run of whitespace. Every character falls in one of the three classes, so
# the pieces concatenate back to the text. Merges never cross a piece boundary.
_PIECE = re.compile(r" ?\w+| ?[^\w\s]+|\s+")


def _pieces(text: str) -> list[str]:
    return _PIECE.findall(text)


def pretokenize(text: str) -> list[str]:
    """Split ``text`` into the pieces that BPE works inside: words with their leading space,
    runs of punctuation, runs of whitespace. ``"".join(pretokenize(text)) == text``.

    :class:`BPETokenizer` counts pairs and applies merges within each piece, never across two, so
    ``" the"`` can become one token but ``"e t"`` never does (the same rule as GPT-2's tokenizer).

    Raises:
        TypeError: if ``text`` is not a string.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return _pieces(text)


def _count_pairs(words: dict[tuple[int, ...], int]) -> Counter[tuple[int, int]]:
    """How often each adjacent pair of ids occurs, each word weighted by its frequency."""
    counts: Counter[tuple[int, int]] = Counter()
    for word, freq in words.items():
        for pair in pairwise(word):
            counts[pair] += freq
    return counts


def _merge(word: Sequence[int], pair: tuple[int, int], new_id: int) -> tuple[int, ...]:
    """Replace each occurrence of ``pair`` in ``word``, left to right, by ``new_id``."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def pair_counts(ids: Iterable[int] | Tensor) -> Counter[tuple[int, int]]:
    r"""How often each adjacent pair ``(ids[i], ids[i+1])`` occurs in one sequence.

    .. math:: c(a, b) = \sum_{n=1}^{N-1} [s_n = a]\,[s_{n+1} = b]

    (eq. ``eq-tok-bpe-pair``; one step of BPE training, Sennrich et al. 2016). Pairs are counted at
    every position, so ``[1, 1, 1]`` holds ``(1, 1)`` twice. A list or a 1-D tensor of ids works.

    Implements: eq-tok-bpe-pair
    """
    ids = _as_id_list(ids)
    return Counter(pairwise(ids))


def merge_pair(ids: Iterable[int] | Tensor, pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every occurrence of ``pair`` in ``ids``, scanning left to right, by ``new_id``.

    This is what one BPE merge does to a sequence. Occurrences never overlap: after a match the scan
    moves past both ids, so merging ``(1, 1)`` in ``[1, 1, 1]`` gives ``[new_id, 1]``.

    Raises:
        ValueError: if ``pair`` is not two ids, or ``new_id`` already occurs in ``ids`` (a merge
            must create a new token, or decoding would become ambiguous).
    """
    ids = _as_id_list(ids)
    if not isinstance(pair, tuple | list) or len(pair) != 2:
        raise ValueError(f"pair must be two ids (a, b), got {pair!r}")
    a, b = int(pair[0]), int(pair[1])
    if new_id in ids:
        raise ValueError(
            f"new_id={new_id} already occurs in ids; a merge creates a new token, so give it an id "
            f"no token uses yet (for byte-level BPE: 256 + the number of merges so far)"
        )
    return list(_merge(ids, (a, b), new_id))


class BPETokenizer:
    """Byte-pair encoding on UTF-8 bytes (Sennrich et al. 2016; the byte-level variant of GPT-2).

    Ids ``0..255`` are the byte values; merge ``k`` (0-based) creates id ``256 + k`` standing for
    the concatenation of the two tokens it joins. Build one with :meth:`train`.

    Attributes:
        merges: the learned pairs of ids, in the order they were learned.
        vocab: dict from id to the bytes that token stands for.
        vocab_size: ``256 + len(merges)``.

    Raises:
        ValueError: if a merge refers to an id that does not exist yet when it is learned.
    """

    def __init__(self, merges: Sequence[tuple[int, int]] = ()) -> None:
        self.merges: list[tuple[int, int]] = []
        self.vocab: dict[int, bytes] = {i: bytes([i]) for i in range(256)}
        for a, b in merges:
            new_id = 256 + len(self.merges)
            if a not in self.vocab or b not in self.vocab:
                raise ValueError(
                    f"merge {len(self.merges)} joins ({a}, {b}) but only ids 0 to {new_id - 1} "
                    "exist at that point; a merge may only join tokens learned before it"
                )
            self.merges.append((a, b))
            self.vocab[new_id] = self.vocab[a] + self.vocab[b]
        self._rank = {pair: k for k, pair in enumerate(self.merges)}

    @classmethod
    def train(cls, text: str, vocab_size: int) -> BPETokenizer:
        """Learn ``vocab_size - 256`` merges from ``text``.

        The algorithm: split the text into pieces (words with their leading space, punctuation,
        whitespace) and each piece into its UTF-8 bytes; then repeatedly find the most frequent
        adjacent pair of tokens over all pieces and replace it everywhere by a new token. Pairs are
        counted at every position, so ``"aaa"`` holds ``("a", "a")`` twice.

        Ties: among pairs with the highest count, the smallest pair of ids ``(a, b)`` is merged
        (compared as tuples), so training is deterministic. Training stops early, with fewer merges,
        when no piece has two tokens left.

        Raises:
            ValueError: if ``vocab_size < 256``: the 256 byte values are always in the vocabulary,
                which is what lets any string be encoded.
        """
        if vocab_size < 256:
            raise ValueError(
                f"vocab_size={vocab_size} is too small: a byte-level BPE vocabulary always holds "
                "the 256 byte values, so ask for vocab_size >= 256 (256 means no merges)"
            )
        words = Counter(tuple(p.encode("utf-8")) for p in _pieces(text))
        merges: list[tuple[int, int]] = []
        while 256 + len(merges) < vocab_size:
            counts = _count_pairs(words)
            if not counts:
                break
            best = min(
                counts, key=lambda pair: (-counts[pair], pair)
            )  # most frequent, then smallest
            new_id = 256 + len(merges)
            merged: Counter[tuple[int, ...]] = Counter()
            for word, freq in words.items():
                merged[_merge(word, best, new_id) if best[0] in word else word] += freq
            words = merged
            merges.append(best)
        return cls(merges)

    @property
    def vocab_size(self) -> int:
        return 256 + len(self.merges)

    def _encode_piece(self, piece: str) -> list[int]:
        """Apply the merges to one piece in the order they were learned.

        Merging, again and again, the present pair that was learned earliest gives the same result
        as running through all merges in order: a merge can only create pairs learned after it.
        """
        word: tuple[int, ...] = tuple(piece.encode("utf-8"))
        while len(word) > 1:
            present = [p for p in pairwise(word) if p in self._rank]
            if not present:
                break
            pair = min(present, key=self._rank.__getitem__)
            word = _merge(word, pair, 256 + self._rank[pair])
        return list(word)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; any string works, since every byte is a token."""
        ids: list[int] = []
        cache: dict[str, list[int]] = {}
        for piece in _pieces(text):
            if piece not in cache:
                cache[piece] = self._encode_piece(piece)
            ids.extend(cache[piece])
        return ids

    def _bytes(self, ids: Iterable[int] | Tensor) -> list[bytes]:
        out = []
        for i in _as_id_list(ids):
            if i not in self.vocab:
                raise ValueError(
                    f"id {i} is not a token id: valid ids are 0 to {self.vocab_size - 1} "
                    f"(256 bytes + {len(self.merges)} merges)"
                )
            out.append(self.vocab[i])
        return out

    def decode(self, ids: Iterable[int] | Tensor) -> str:
        """The text whose tokens are ``ids``: ``decode(encode(s)) == s`` for every string ``s``.

        The tokens' bytes are joined first and decoded as UTF-8 once, so a character split over
        several tokens comes back whole. A sequence that is not valid UTF-8 (say, a lone token
        holding half a character) shows U+FFFD in place of the broken bytes.

        Raises:
            ValueError: naming the first id outside ``0 .. vocab_size - 1``.
        """
        return b"".join(self._bytes(ids)).decode("utf-8", errors="replace")

    def tokens_as_strings(self, text: str) -> list[str]:
        """How ``text`` splits into tokens, one string per token, e.g. ``["ev", "al", "uation"]``.

        Bytes that are only part of a character are shown escaped (``"\\xe2"``).
        """
        return [
            b.decode("utf-8", errors="backslashreplace") for b in self._bytes(self.encode(text))
        ]

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


# --------------------------------------------------------------------------------------------------
# Embeddings: ids to vectors
# --------------------------------------------------------------------------------------------------


def _check_embedding_args(ids: Tensor, E: Tensor) -> None:
    if not isinstance(ids, Tensor) or not isinstance(E, Tensor):
        raise TypeError(
            f"ids and E must be torch tensors, got {type(ids).__name__} and {type(E).__name__}; "
            "turn a list of ids into one with torch.tensor(ids)"
        )
    if ids.dtype not in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        raise TypeError(
            f"ids must hold integer token ids, got dtype {ids.dtype}; use torch.long ids "
            "(e.g. tok.encode_tensor(text) or torch.tensor(ids, dtype=torch.long))"
        )
    if E.dim() != 2:
        raise ValueError(
            f"E has shape {_shape(E)}; the embedding matrix must be 2-D, (vocab_size, D): one row "
            "per token"
        )
    V = E.shape[0]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= V):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise ValueError(
            f"token id {bad} is outside the vocabulary: E has {V} rows (vocab_size={V}), so ids run "
            f"from 0 to "
            f"{V - 1}"
        )


def embedding_reference(ids: Tensor, E: Tensor) -> Tensor:
    r"""Embed token ids as one-hot vectors times the embedding matrix, term by term.

    .. math:: X^{(0)} = O E, \qquad O_{nv} = [s_n = v], \quad O \in \{0,1\}^{N\times |\mathcal{V}|},
              \quad E \in \mathbb{R}^{|\mathcal{V}|\times D}

    (eq. ``eq-tok-onehot``.) Row ``n`` of ``O`` is the one-hot vector of token ``s_n``, so row ``n``
    of the product is row ``s_n`` of ``E``: see :func:`embedding`, which returns the same numbers.

    Implements: eq-tok-onehot

    Args:
        ids: integer ids of any shape ``(...)``, each in ``0 .. vocab_size - 1``.
        E: ``(vocab_size, D)``, one row per vocabulary entry (the book's :math:`|\mathcal{V}|\times D`).

    Returns:
        ``(..., D)``, in ``E``'s dtype and device.

    Raises:
        TypeError: if ``ids`` is not an integer tensor.
        ValueError: if ``E`` is not 2-D or an id is outside ``0 .. vocab_size - 1``.
    """
    _check_embedding_args(ids, E)
    O = torch.nn.functional.one_hot(ids.long(), E.shape[0]).to(E.dtype)  # (..., V)
    return O @ E  # (..., |V|) @ (|V|, D) -> (..., D)


def embedding(ids: Tensor, E: Tensor) -> Tensor:
    """Embed token ids by looking up rows of ``E``: ``X[..., :] = E[ids[...], :]``.

    The efficient form of eq. ``eq-tok-onehot`` (``torch.nn.functional.embedding``, which is what
    ``torch.nn.Embedding`` calls); it equals :func:`embedding_reference` without building the
    ``(..., V)`` one-hot tensor.

    Implements: eq-tok-onehot

    Raises:
        TypeError: if ``ids`` is not an integer tensor.
        ValueError: if ``E`` is not 2-D or an id is outside ``0 .. vocab_size - 1``.
    """
    _check_embedding_args(ids, E)
    return torch.nn.functional.embedding(ids.long(), E)  # (..., D)


# --------------------------------------------------------------------------------------------------
# Image patches
# --------------------------------------------------------------------------------------------------


def _check_patch_size(patch_size: int, name: str = "patch_size") -> int:
    if isinstance(patch_size, bool) or not isinstance(patch_size, int) or patch_size < 1:
        raise ValueError(f"{name} must be a positive int, got {patch_size!r}")
    return patch_size


def patchify(images: Tensor, patch_size: int, stride: int | None = None) -> Tensor:
    r"""Cut images into ``P x P`` patches and flatten each, the ``vec`` of Turner fig. 2: the rows
    :math:`\mathbf{p}_n` of the book's :math:`X_\text{pix}` in eqs. ``eq-tok-patch`` and ``eq-vit-patch``
    (:class:`PatchEmbedding` adds the linear map).

    .. math:: \text{row } n \text{ of the output} = \operatorname{vec}(\text{patch}_n)
              \in \mathbb{R}^{C P^2}

    Args:
        images: ``(B, C, H, W)``, ``H`` and ``W`` multiples of ``P``.
        patch_size: ``P``.
        stride: ``S``, the step between patches (the book's :math:`\Delta`); ``None`` means
            ``S = P`` (non-overlapping patches, the ViT's). With ``S < P`` the patches overlap (book
            eq. ``eq-vit-overlap``): the image is padded with ``(P - S) / 2`` zeros on every side and
            patch ``(i, j)`` starts at pixel ``(S i, S j)`` of the padded image, so
            ``N = (H / S) * (W / S)`` as with ``P = S``.

    Returns:
        ``(B, N, C*P*P)`` with ``N = (H/S) * (W/S)``. Patches are in row-major order (left to right
        along the top row of patches, then the next row down); each patch is flattened in
        ``(C, P, P)`` order, channel first, then pixel row, then pixel column.

    Raises:
        ValueError: for a 3-D image (add the batch dimension with ``unsqueeze(0)``), any other
            number of dimensions, ``H``/``W`` not divisible by ``S``, or ``P - S`` odd or negative.
    """
    P = _check_patch_size(patch_size)
    S = P if stride is None else _check_patch_size(stride, "stride")
    if not isinstance(images, Tensor):
        raise TypeError(f"images must be a torch.Tensor, got {type(images).__name__}")
    if images.dim() == 3:
        raise ValueError(
            f"images has shape {_shape(images)}, one image (C, H, W); patchify takes a batch "
            "(B, C, H, W): add the batch dimension with images.unsqueeze(0)"
        )
    if images.dim() != 4:
        raise ValueError(f"images has shape {_shape(images)}; patchify takes (B, C, H, W)")
    if S != P:
        return _overlapping_patches(images, P, S)
    B, C, H, W = images.shape
    if H % P or W % P:
        raise ValueError(
            f"image size H x W = {H} x {W} is not divisible by patch_size={P}; crop or pad the "
            f"images to multiples of {P}, or choose a patch size that divides both"
        )
    x = images.reshape(B, C, H // P, P, W // P, P)  # (B, C, rows of patches, P, cols, P)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, H/P, W/P, C, P, P)
    return x.reshape(B, (H // P) * (W // P), C * P * P)


def _overlapping_patches(images: Tensor, P: int, S: int) -> Tensor:
    if S > P or (P - S) % 2:
        raise ValueError(
            f"overlapping patches need a stride S <= P with P - S even (the padding (P - S) / 2 "
            f"is split evenly), got patch_size={P}, stride={S}"
        )
    H, W = images.shape[-2:]
    if H % S or W % S:
        raise ValueError(f"image size H x W = {H} x {W} is not divisible by stride={S}")
    pad = (P - S) // 2
    cols = F.unfold(images, kernel_size=P, stride=S, padding=pad)  # (B, C*P*P, N), vec in (C, P, P)
    return cols.transpose(1, 2)  # (B, N, C*P*P), patches row-major


def patchify_1d(series: Tensor, window: int) -> Tensor:
    r"""Cut sequences of vectors into non-overlapping windows and flatten each: 1-D patches.

    The time-series analogue of :func:`patchify`: ``C`` channels (the book's :math:`C_\text{in}`)
    over ``T`` time steps become ``N = T / P`` rows, row ``n`` holding steps ``n P .. n P + P - 1`` of
    every channel; the window ``P`` is a one-dimensional patch. The rows are the
    :math:`\mathbf{f}_n` of book eq. ``eq-tok-linear``, which an ``nn.Linear`` maps to tokens.

    Implements: eq-tok-linear

    Args:
        series: ``(B, C, T)``, ``T`` a multiple of ``P``.
        window: ``P``, the number of time steps per token.

    Returns:
        ``(B, N, C*P)``; each window is flattened in ``(C, P)`` order, channel first, then time
        (the layout of a ``Conv1d`` weight, so ``Conv1d(C, D, kernel_size=P, stride=P)`` with copied
        weights equals a linear map of these rows).

    Raises:
        ValueError: for a 2-D series (add the batch dimension with ``unsqueeze(0)``), any other
            number of dimensions, or ``T`` not divisible by ``P``.
    """
    L = _check_patch_size(window, "window")
    if not isinstance(series, Tensor):
        raise TypeError(f"series must be a torch.Tensor, got {type(series).__name__}")
    if series.dim() == 2:
        raise ValueError(
            f"series has shape {_shape(series)}, one series (C, T); patchify_1d takes a batch "
            "(B, C, T): add the batch dimension with series.unsqueeze(0)"
        )
    if series.dim() != 3:
        raise ValueError(f"series has shape {_shape(series)}; patchify_1d takes (B, C, T)")
    B, C, T = series.shape
    if T % L:
        raise ValueError(
            f"series length T={T} is not divisible by window={L}; crop or pad it to a multiple "
            f"of {L}, or choose a window that divides {T}"
        )
    x = series.reshape(B, C, T // L, L)  # (B, C, N, L)
    return x.permute(0, 2, 1, 3).reshape(B, T // L, C * L)  # (B, N, C*L)


def unpatchify(
    patches: Tensor, patch_size: int, image_size: int | tuple[int, int], channels: int
) -> Tensor:
    """The inverse of :func:`patchify`: ``(B, N, C*P*P)`` back to images ``(B, C, H, W)``.

    Args:
        patches: ``(B, N, C*P*P)`` in the layout :func:`patchify` returns.
        patch_size: ``P``.
        image_size: ``(H, W)``, or one int for square images.
        channels: ``C``.

    Raises:
        ValueError: if ``H`` or ``W`` is not divisible by ``P`` or ``patches`` is not
            ``(B, (H/P)*(W/P), C*P*P)``.
    """
    P = _check_patch_size(patch_size)
    H, W = (image_size, image_size) if isinstance(image_size, int) else image_size
    if H % P or W % P:
        raise ValueError(f"image size H x W = {H} x {W} is not divisible by patch_size={P}")
    N, D = (H // P) * (W // P), channels * P * P
    if not isinstance(patches, Tensor) or patches.dim() != 3 or patches.shape[1:] != (N, D):
        got = _shape(patches) if isinstance(patches, Tensor) else type(patches).__name__
        raise ValueError(
            f"patches has shape {got} but {channels}-channel {H} x {W} images in {P} x {P} "
            f"patches need (B, N, C*P*P) = (B, {N}, {D})"
        )
    x = patches.reshape(patches.shape[0], H // P, W // P, channels, P, P)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(patches.shape[0], channels, H, W)


class PatchEmbedding(nn.Module):
    r"""Image to tokens: flatten each ``P x P`` patch and map it linearly to ``d_model``, book eq.
    ``eq-tok-patch``.

    .. math:: \mathbf{x}_n = W \operatorname{vec}(\text{patch}_n) + \mathbf{b}, \qquad
              W \in \mathbb{R}^{d_\text{model} \times C P^2}

    (Turner 2023, fig. 2; Dosovitskiy et al. 2021, eq. 1; the book's :math:`W_p`.) In row form for a
    batch: ``X = patchify(images) @ W^T + b``, shape ``(B, N, d_model)``.

    Implements: eq-tok-patch, eq-vit-patch, eq-vit-overlap

    Args:
        patch_size: ``P``.
        channels: ``C``, e.g. 3 for RGB.
        d_model: width of each token.
        bias: whether to add ``b``.
        stride: ``S`` of :func:`patchify` (the book's :math:`\Delta`); ``None`` (the ViT's choice)
            gives non-overlapping patches, a smaller ``S`` overlapping ones (book eq.
            ``eq-vit-overlap``).
    """

    def __init__(
        self,
        patch_size: int,
        channels: int,
        d_model: int,
        bias: bool = True,
        stride: int | None = None,
    ) -> None:
        super().__init__()
        self.patch_size = _check_patch_size(patch_size)
        self.stride = self.patch_size if stride is None else _check_patch_size(stride, "stride")
        self.channels = channels
        self.d_model = d_model
        # nn.Linear stores W as (out, in) = (d_model, C*P*P) and computes x @ W^T + b.
        self.proj = nn.Linear(channels * patch_size * patch_size, d_model, bias=bias)

    def forward(self, images: Tensor) -> Tensor:
        """``images`` ``(B, C, H, W)`` to tokens ``(B, N, d_model)``, ``N = (H/P) * (W/P)``.

        Raises:
            ValueError: if ``C`` differs from ``channels`` or the shape does not suit
                :func:`patchify`.
        """
        if isinstance(images, Tensor) and images.dim() == 4 and images.shape[1] != self.channels:
            raise ValueError(
                f"images has shape {_shape(images)} with C={images.shape[1]} channels but this "
                f"PatchEmbedding was built for channels={self.channels}"
            )
        return self.proj(patchify(images, self.patch_size, self.stride))  # (B, N, C*P*P) @ W^T + b

    def as_conv2d(self) -> nn.Conv2d:
        """The same map as a convolution with ``kernel_size = P`` and ``stride = S`` (weights copied).

        ``conv(images).flatten(2).transpose(1, 2)`` equals ``self(images)``: a strided convolution
        applies one linear map to each patch, which is how ViTs are usually coded.
        """
        P, S, w = self.patch_size, self.stride, self.proj.weight
        conv = nn.Conv2d(
            self.channels,
            self.d_model,
            kernel_size=P,
            stride=S,
            padding=(P - S) // 2,
            bias=self.proj.bias is not None,
            device=w.device,
            dtype=w.dtype,
        )
        with torch.no_grad():
            conv.weight.copy_(w.reshape(self.d_model, self.channels, P, P))  # vec is (C, P, P)
            if self.proj.bias is not None:
                conv.bias.copy_(self.proj.bias)
        return conv

    def extra_repr(self) -> str:
        overlap = f", stride={self.stride}" if self.stride != self.patch_size else ""
        return f"patch_size={self.patch_size}{overlap}, channels={self.channels}, d_model={self.d_model}"
