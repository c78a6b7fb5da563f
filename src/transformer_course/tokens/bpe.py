"""Byte-pair encoding on UTF-8 bytes: :class:`BPETokenizer`, with special tokens, GPT-2's ranks and a
streaming encoder; :func:`pair_counts` and :func:`merge_pair`, one training step by hand.

A tokenizer is a vocabulary of byte strings with ids, a rule for merging, a pre-tokenization pattern
(:mod:`.pretokenize`) and optional special tokens:

* trained by the course (:meth:`BPETokenizer.train`): ids ``0..255`` are the byte values, merge ``k``
  creates id ``256 + k``, and a piece is encoded by applying the merges in the order they were learned;
* built from a ranks table (:meth:`BPETokenizer.from_ranks`, e.g. GPT-2's): the id of a token is its
  rank, and a piece is encoded by merging, again and again, the adjacent pair whose concatenation has
  the lowest rank (tiktoken's rule; eq. ``eq-tok-bpe-rank``).

Both are one rule, :meth:`BPETokenizer._encode_piece`: merge the adjacent pair whose merged token has
the lowest id, the leftmost on a tie. Special tokens get ids after the merges (or the ranks), are cut
out of the text before anything else (:func:`.pretokenize.split_special`), and are in ``vocab`` with
their UTF-8 bytes.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import pairwise

from torch import Tensor

from ._ids import _as_id_list
from .bpe_train import _merge, train_merges, train_merges_reference
from .pretokenize import _check_special, _special_regex, pretokenize, split_special

__all__ = ["BPETokenizer", "merge_pair", "pair_counts"]


def pair_counts(ids: Iterable[int] | Tensor) -> Counter[tuple[int, int]]:
    r"""How often each adjacent pair ``(ids[i], ids[i+1])`` occurs in one piece ``w``.

    .. math:: n_w(v, v') = \sum_{i=1}^{|w|-1} [w_i = v]\,[w_{i+1} = v']

    (eq. ``eq-tok-bpe-pair``, the count inside one piece; the training count is
    :math:`c(v, v') = \sum_w f_w\, n_w(v, v')`, each distinct piece weighted by its frequency; one
    step of BPE training, Sennrich et al. 2016). Pairs are counted at every position, so
    ``[1, 1, 1]`` holds ``(1, 1)`` twice. A list or a 1-D tensor of ids works.

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


def _merge_part(
    x: int | bytes,
    k: int,
    pair: Sequence[int | bytes],
    vocab: Mapping[int, bytes],
    ids_of: Mapping[bytes, int],
) -> int:
    """The id that one side ``x`` of merge ``k`` names: an id, or a token's bytes."""
    if isinstance(x, bytes | bytearray):
        if bytes(x) not in ids_of:
            raise ValueError(
                f"merge {k} joins {tuple(pair)!r} but {bytes(x)!r} is not a token at that point: "
                "a merge may only join single bytes and tokens made by the merges before it"
            )
        return ids_of[bytes(x)]
    try:
        if isinstance(x, bool):
            raise TypeError
        x = operator.index(x)  # an int, or a NumPy / 0-d tensor integer
    except TypeError:
        raise TypeError(
            f"merge {k} is {tuple(pair)!r}: each side of a merge is a token id (int) or the "
            f"token's bytes (b'...'), not {type(x).__name__}"
        ) from None
    if x not in vocab:
        raise ValueError(
            f"merge {k} joins {tuple(pair)!r} but only ids 0 to {255 + k} exist at that point; a "
            "merge may only join tokens learned before it"
        )
    return x


def _words(text: str, special: Sequence[str], pattern: str) -> Counter[tuple[int, ...]]:
    """The distinct pieces of ``text`` as tuples of bytes, with their frequencies; special tokens are
    cut out first and never take part in training."""
    words: Counter[tuple[int, ...]] = Counter()
    for span, is_special in split_special(text, special):
        if not is_special:
            words.update(tuple(p.encode("utf-8")) for p in pretokenize(span, pattern))
    return words


class BPETokenizer:
    """Byte-pair encoding on UTF-8 bytes (Sennrich et al. 2016; the byte-level variant of GPT-2).

    ``BPETokenizer(merges, pattern=...)``: ids ``0..255`` are the byte values; merge ``k`` (0-based)
    creates id ``256 + k`` standing for the concatenation of the two tokens it joins. Build one with
    :meth:`train`, or from a ranks table such as GPT-2's with :meth:`from_ranks`.

    Every way of building one takes the pre-tokenization as the keyword ``pattern``, with no default:
    merges learned on GPT-2's pieces and applied to the course's pieces (or the other way round) give
    other tokens without any error (``"I'm"`` is one piece for the course, ``"I"`` and ``"'m"`` for
    GPT-2), so the pattern is named wherever the merges come from.

    Args:
        merges: the merges in the order they were learned, each a pair of ids (``(97, 98)``) or of
            the two tokens' bytes (``(b"a", b"b")``; a token made by an earlier merge is its whole
            byte string, ``(b"ab", b"c")``, the first token made with those bytes where two merges
            make the same string); the two forms may be mixed.
        special_tokens: strings such as ``"<|endoftext|>"`` that are never split or merged: each is
            one token, with ids after the merges (``256 + len(merges)``, ...) in the order given; a
            mapping ``{string: id}`` gives the ids instead.
        pattern: the pre-tokenization, ``"course"`` or ``"gpt2"`` (:func:`.pretokenize.pretokenize`):
            the one the merges were learned with.

    Attributes:
        merges: the learned pairs of ids, in the order they were learned (empty for a tokenizer
            built from ranks, which lists tokens, not merges).
        vocab: dict from every id to the bytes it decodes to, special tokens included (their UTF-8
            bytes), so ``len(vocab) == vocab_size`` when the ids have no gaps. A ranks table for
            :meth:`from_ranks` leaves the special tokens out: ``{t: i for i, t in vocab.items() if
            i not in special_tokens.values()}``.
        special_tokens: dict from special token to its id.
        pattern: the pre-tokenization pattern's name.
        vocab_size: one more than the largest id (``256 + len(merges) + len(special_tokens)`` for a
            trained tokenizer): the rows an embedding table needs.

    Raises:
        ValueError: if a merge refers to a token that does not exist yet when it is learned, or a
            special token is empty, registered twice or given an id that a token already has.
        TypeError: if a special token is not a string, or a merge's parts are neither ids nor bytes.
    """

    def __init__(
        self,
        merges: Sequence[tuple[int, int] | tuple[bytes, bytes]] = (),
        special_tokens: Sequence[str] | Mapping[str, int] = (),
        *,
        pattern: str,
    ) -> None:
        vocab = {i: bytes([i]) for i in range(256)}
        ids_of = {token: i for i, token in vocab.items()}  # bytes -> the first id standing for them
        checked: list[tuple[int, int]] = []
        for pair in merges:
            k, new_id = len(checked), 256 + len(checked)
            try:
                if isinstance(pair, str | bytes | bytearray):  # b"ab" would unpack into 97, 98
                    raise TypeError
                left, right = pair  # a tuple, a list, a row of a NumPy array or a tensor
            except (TypeError, ValueError):
                raise TypeError(f"merge {k} is {pair!r}; each merge is a pair (a, b)") from None
            a, b = (_merge_part(x, k, (left, right), vocab, ids_of) for x in (left, right))
            checked.append((a, b))
            vocab[new_id] = vocab[a] + vocab[b]
            ids_of.setdefault(vocab[new_id], new_id)
        merged = {pair: 256 + k for k, pair in enumerate(checked)}
        self._setup(vocab, merged, list(range(256)), special_tokens, pattern)
        self.merges = checked

    def _setup(
        self,
        vocab: dict[int, bytes],
        merged: dict[tuple[int, int], int],
        byte_ids: list[int],
        special_tokens: Sequence[str] | Mapping[str, int],
        pattern: str,
    ) -> None:
        pretokenize("", pattern)  # a clear error for an unknown pattern, now rather than later
        self.merges: list[tuple[int, int]] = []
        self.pattern = pattern
        self._merged = merged  # (a, b) -> the id of the token a + b
        self._byte_ids = byte_ids  # byte value -> the id of its one-byte token
        next_id = max(vocab) + 1
        if isinstance(special_tokens, Mapping):
            names = _check_special(special_tokens)
            ids = {s: special_tokens[s] for s in names}
        else:
            names = _check_special(special_tokens)
            ids = {s: next_id + k for k, s in enumerate(names)}
        for s, i in ids.items():
            if isinstance(i, bool) or not isinstance(i, int) or i < 0:
                raise ValueError(f"special token {s!r} has id {i!r}; ids are non-negative ints")
            if i in vocab:
                raise ValueError(
                    f"special token {s!r} has id {i}, which the token {vocab[i]!r} already has; "
                    f"give it an id from {next_id} on"
                )
        if len(set(ids.values())) != len(ids):
            raise ValueError(f"special tokens share an id: {ids}; give each its own")
        self.special_tokens: dict[str, int] = ids
        self._special_bytes = {i: s.encode("utf-8") for s, i in ids.items()}
        self.vocab: dict[int, bytes] = {**vocab, **self._special_bytes}
        self._special_re = _special_regex(tuple(ids)) if ids else None
        self._longest_special = max(map(len, ids), default=0)

    # ----------------------------------------------------------------------------------------------
    # Building a tokenizer

    @classmethod
    def from_ranks(
        cls,
        ranks: Mapping[bytes, int],
        special_tokens: Sequence[str] | Mapping[str, int] = (),
        *,
        pattern: str,
    ) -> BPETokenizer:
        """A tokenizer from a ranks table, ``{token bytes: rank}``, whose ids are the ranks.

        This is the form in which OpenAI's ``tiktoken`` keeps GPT-2's tokenizer (``gpt2.tiktoken`` /
        ``r50k_base``: 50,256 byte strings with their ranks; ``"<|endoftext|>"`` is id 50256; GPT-2
        itself was released as ``encoder.json`` and the 50,000 merges of ``vocab.bpe``, applied by
        rank). Ranks ``0..255`` are the 256 single bytes, but *not* in byte order: byte ``b`` has the
        rank the table gives it. A piece is encoded by merging, again and again, the adjacent pair of
        tokens whose concatenation is in the table with the lowest rank, the leftmost on a tie (eq.
        ``eq-tok-bpe-rank``, tiktoken's rule); for a table learned by BPE, this applies the merges in
        the order they were learned. For the vocabulary of a tokenizer trained by the course, this
        gives the ids of its merge list (the tests compare them); for an arbitrary merge list it may
        not, since a token can be the concatenation of more than one pair of tokens and the table
        joins any of them.

        Args:
            ranks: every token's bytes and its rank (its id); all 256 single bytes must be present.
            special_tokens: as for the constructor; a list gives ids from ``max(ranks) + 1`` on.
            pattern: the pre-tokenization the table was learned with (``"gpt2"`` for GPT-2's).

        Raises:
            ValueError: if a single byte is missing, a token is empty or two tokens share a rank.
        """
        vocab: dict[int, bytes] = {}
        for token, rank in ranks.items():
            token, rank = bytes(token), int(rank)
            if not token:
                raise ValueError("the ranks table holds an empty token; every token is 1+ bytes")
            if rank in vocab:
                raise ValueError(f"rank {rank} is given to both {vocab[rank]!r} and {token!r}")
            vocab[rank] = token
        ids = {token: rank for rank, token in vocab.items()}
        missing = [b for b in range(256) if bytes([b]) not in ids]
        if missing:
            raise ValueError(
                f"the ranks table lacks {len(missing)} single byte(s) (e.g. {bytes(missing[:3])!r}); "
                "a byte-level tokenizer needs all 256, so that every string can be encoded"
            )
        merged = {}  # every split of every token into two tokens: (a, b) -> id of a + b
        for rank, token in vocab.items():
            for cut in range(1, len(token)):
                a, b = ids.get(token[:cut]), ids.get(token[cut:])
                if a is not None and b is not None:
                    merged[(a, b)] = rank
        tok = cls.__new__(cls)
        tok._setup(vocab, merged, [ids[bytes([b])] for b in range(256)], special_tokens, pattern)
        return tok

    @classmethod
    def train(
        cls,
        text: str,
        vocab_size: int,
        special_tokens: Sequence[str] = (),
        *,
        pattern: str,
    ) -> BPETokenizer:
        """Learn ``vocab_size - 256 - len(special_tokens)`` merges from ``text``, fast.

        The same merges as :meth:`train_reference` (the tests check it), found by
        :func:`.bpe_train.train_merges`, which after each merge updates only the pair counts that
        the merge changes instead of recounting the whole text.

        Raises:
            ValueError: if ``vocab_size`` leaves no room for the 256 bytes and the special tokens.
        """
        words = _words(text, _check_special(special_tokens), pattern)
        n_merges = cls._n_merges(vocab_size, special_tokens)
        return cls(train_merges(words, n_merges), special_tokens, pattern=pattern)

    @classmethod
    def train_reference(
        cls,
        text: str,
        vocab_size: int,
        special_tokens: Sequence[str] = (),
        *,
        pattern: str,
    ) -> BPETokenizer:
        """Learn ``vocab_size - 256 - len(special_tokens)`` merges from ``text``, recounting each time.

        The algorithm: cut out the special tokens, split the rest into pieces (for the course's
        pattern: words with their leading space, punctuation, whitespace) and each piece into its
        UTF-8 bytes; then repeatedly find the most frequent adjacent pair of tokens over all pieces
        and replace it everywhere by a new token. Pairs are counted at every position, so ``"aaa"``
        holds ``("a", "a")`` twice.

        Ties: among pairs with the highest count, the smallest pair of ids ``(a, b)`` is merged
        (compared as tuples), so training is deterministic. Training stops early, with fewer merges,
        when no piece has two tokens left. Special tokens get the ids after the merges.

        Raises:
            ValueError: if ``vocab_size < 256 + len(special_tokens)``: the 256 byte values are always
                in the vocabulary, which is what lets any string be encoded.
        """
        words = _words(text, _check_special(special_tokens), pattern)
        n_merges = cls._n_merges(vocab_size, special_tokens)
        return cls(train_merges_reference(words, n_merges), special_tokens, pattern=pattern)

    @staticmethod
    def _n_merges(vocab_size: int, special_tokens: Sequence[str]) -> int:
        least = 256 + len(special_tokens)
        if vocab_size < least:
            extra = f" and {len(special_tokens)} special token(s)" if special_tokens else ""
            raise ValueError(
                f"vocab_size={vocab_size} is too small: a byte-level BPE vocabulary always holds "
                f"the 256 byte values{extra}, so ask for vocab_size >= {least} ({least} means no "
                "merges)"
            )
        return vocab_size - least

    @property
    def vocab_size(self) -> int:
        return max(self.vocab) + 1

    # ----------------------------------------------------------------------------------------------
    # Encoding

    def _encode_piece(self, piece: str) -> list[int]:
        """Merge, again and again, the adjacent pair whose merged token has the lowest id (the
        leftmost on a tie), until no adjacent pair forms a token.

        For a trained tokenizer the merged id is ``256 + k`` for merge ``k``, so this applies the
        merges in the order they were learned (a merge only creates pairs learned after it); for one
        built from ranks, the id is the rank of the concatenation (eq. ``eq-tok-bpe-rank``).
        """
        ids = [self._byte_ids[b] for b in piece.encode("utf-8")]
        merged = self._merged
        while len(ids) > 1:
            best, at = None, 0
            for i in range(len(ids) - 1):
                new = merged.get((ids[i], ids[i + 1]))
                if new is not None and (best is None or new < best):
                    best, at = new, i
            if best is None:
                break
            ids[at : at + 2] = [best]
        return ids

    def _encode_pieces(self, pieces: Iterable[str], cache: dict[str, list[int]]) -> list[int]:
        ids: list[int] = []
        for piece in pieces:
            if piece not in cache:
                cache[piece] = self._encode_piece(piece)
            ids.extend(cache[piece])
        return ids

    def _encode_ordinary(self, text: str, cache: dict[str, list[int]]) -> list[int]:
        return self._encode_pieces(pretokenize(text, self.pattern), cache)

    def encode(self, text: str) -> list[int]:
        r"""Token ids of ``text``; any string works, since every byte is a token.

        Special tokens are cut out first and become their own ids; the text between them is split
        into pieces and each piece is merged on its own:

        .. math:: i^\ast = \operatorname*{arg\,min}_{i\,:\; u_i u_{i+1} \in \mathcal{V}}
                  \operatorname{id}(u_i u_{i+1})

        (eq. ``eq-tok-bpe-rank``: of the piece's current tokens ``u_1 .. u_m``, merge the adjacent
        pair whose concatenation is the token with the lowest id, the leftmost on a tie; repeat.)

        Implements: eq-tok-bpe-rank

        Raises:
            TypeError: if ``text`` is not a string.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self._encode_spans(text, {})

    def _settle(self, text: str, cache: dict[str, list[int]]) -> tuple[int, list[int]]:
        """The ids of the longest prefix of ``text`` that no continuation can change, and its length.

        Special tokens: one that starts before ``visible`` is seen whole, so the split there is final,
        and the ordinary text before it is a whole span. The ordinary text after the last of them may
        go on: where a piece ends depends on at most the two characters after it (``\\s+(?!\\S)``
        looks at the character after the run it gave back; a lone ``'`` is a piece in ``x'r`` but
        the start of ``'re`` in ``x're``; every other alternative stops at the first character it
        cannot take), and the last two pieces hold at least two characters, so every piece of it but
        the last two is final. Those pieces are encoded as they are: cutting the text after them and
        splitting the cut text again could join the last of them with the one before (``"\\n\\n"``
        at the end of a text is one piece, but two before a word).
        """
        visible = len(text) - self._longest_special + 1  # a special token starting before is whole
        start, ids = 0, []
        if self._special_re is not None:
            for m in self._special_re.finditer(text):
                if m.start() >= visible:
                    break
                ids.extend(self._encode_ordinary(text[start : m.start()], cache))
                ids.append(self.special_tokens[m.group()])
                start = m.end()
        end = min(len(text), max(visible, start))  # text[start:end] is ordinary, for good
        pieces = pretokenize(text[start:end], self.pattern)[:-2]
        ids.extend(self._encode_pieces(pieces, cache))
        return start + sum(map(len, pieces)), ids

    def encode_iterable(self, chunks: Iterable[str]) -> Iterator[int]:
        """Encode a text given in chunks (e.g. the lines of a file opened in text mode), yielding ids
        as soon as they are final; ``list(encode_iterable(chunks)) == encode("".join(chunks))``.

        Only the unsettled end of the text is held: the last two pieces and, with special tokens,
        up to the length of the longest one minus one character, which may be the start of a
        special token. A chunk may end anywhere: inside a word, a run of whitespace or a special
        token. So memory stays bounded however long the text, unless it has no piece boundary: a
        text without one (a long run of one letter) is held whole and split again at every chunk,
        in time that grows with the square of its length.

        Raises:
            TypeError: if a chunk is not a string (open a file in text mode, ``open(path)``).
        """
        held = ""
        cache: dict[str, list[int]] = {}
        for chunk in chunks:
            if not isinstance(chunk, str):
                raise TypeError(
                    f"chunks must be strings, got {type(chunk).__name__}; open a file in text mode "
                    "(open(path, encoding='utf-8')), not 'rb'"
                )
            held += chunk
            cut, ids = self._settle(held, cache)
            yield from ids
            held = held[cut:]
            if len(cache) > 100_000:
                cache.clear()  # keep memory bounded on a long stream
        yield from self._encode_spans(held, cache)

    def _encode_spans(self, text: str, cache: dict[str, list[int]]) -> list[int]:
        ids: list[int] = []
        for span, is_special in split_special(text, self.special_tokens):
            if is_special:
                ids.append(self.special_tokens[span])
            else:
                ids.extend(self._encode_ordinary(span, cache))
        return ids

    # ----------------------------------------------------------------------------------------------
    # Decoding

    def _bytes(self, ids: Iterable[int] | Tensor) -> list[bytes]:
        out = []
        for i in _as_id_list(ids):
            token = self.vocab.get(i)
            if token is None:
                specials = len(self.special_tokens)
                raise ValueError(
                    f"id {i} is not a token id: valid ids are 0 to {self.vocab_size - 1} "
                    f"({len(self.vocab)} tokens, {specials} of them special; 256 bytes + "
                    f"{len(self.merges)} merges for a trained tokenizer)"
                )
            out.append(token)
        return out

    def decode(self, ids: Iterable[int] | Tensor) -> str:
        """The text whose tokens are ``ids``: ``decode(encode(s)) == s`` for every string ``s``.

        The tokens' bytes are joined first and decoded as UTF-8 once, so a character split over
        several tokens comes back whole. A sequence that is not valid UTF-8 (say, a lone token
        holding half a character) shows U+FFFD in place of the broken bytes. A special token's id
        decodes to its string.

        Raises:
            ValueError: naming the first id that is not a token's.
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
        extra = f", pattern={self.pattern!r}"
        if self.special_tokens:
            extra += f", special_tokens={list(self.special_tokens)!r}"
        return f"BPETokenizer(vocab_size={self.vocab_size}{extra})"
