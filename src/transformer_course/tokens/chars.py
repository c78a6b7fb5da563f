"""Characters as tokens: :class:`CharTokenizer`, one token per character of a fixed vocabulary."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from ._ids import _as_id_list


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
