r"""Pre-tokenization: the pieces that byte-pair encoding works inside, and special tokens.

Byte-pair encoding never merges across two pieces, so the split decides which tokens can exist. Two
splits are offered, by name:

* ``"course"``: ``" ?\w+| ?[^\w\s]+|\s+"``, a word with at most one leading space, a run of
  punctuation with at most one leading space, or a run of whitespace.
* ``"gpt2"``: the pattern of GPT-2's released tokenizer (Radford et al. 2019, ``encoder.py``),
  ``GPT2_REGEX`` below. It also splits off the English contractions (``'s``, ``'ll``, ...), keeps
  digits apart from letters, and leaves the last space of a run of whitespace to the next word.

GPT-2's pattern is written for the third-party ``regex`` module: ``\p{L}`` (any letter) and ``\p{N}``
(any number) are classes that Python's ``re`` lacks, and its ``\s`` is Unicode's ``White_Space``
property, which differs from ``re``'s ``\s`` on four control characters (U+001C to U+001F). The
look-alike ``[^\W\d_]`` is not ``\p{L}``: it also takes numbers that are not decimal digits, such
as ``"²"`` and ``"½"``. :func:`gpt2_pattern` therefore writes the same pattern for ``re`` with the
classes spelled out, read from :mod:`unicodedata` (letters: general categories ``L*``; numbers:
``N*``; whitespace: the 25 code points of ``White_Space``). The tests compare it with the ``regex``
module's own pattern on every code point: they agree on all that Python's Unicode database assigns;
a code point that a newer Unicode version assigns (the ``regex`` module ships its own, usually newer,
tables) is neither a letter nor a number to an older Python.

Special tokens (:func:`split_special`) are cut out before pre-tokenization, so BPE never sees them.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from collections.abc import Iterable

__all__ = ["GPT2_REGEX", "PATTERNS", "gpt2_pattern", "pretokenize", "split_special"]

# GPT-2's pattern as released, for the `regex` module (shown on the page; used by the tests).
GPT2_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# The course's own split. Every character falls in one of its three classes, so the pieces
# concatenate back to the text.
_PIECE = re.compile(r" ?\w+| ?[^\w\s]+|\s+")

PATTERNS = ("course", "gpt2")

# Unicode's White_Space property (what `regex`'s \s matches): 25 code points.
_WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def _escape(cp: int) -> str:
    return f"\\U{cp:08x}"  # an escape `re` reads inside a class, whatever the character


def _unicode_class(prefix: str) -> str:
    """The body of a character class holding every code point whose general category starts with
    ``prefix`` (``"L"`` letters, ``"N"`` numbers) in this Python's Unicode database, as ranges."""
    ranges: list[tuple[int, int]] = []
    start = None
    for cp in range(sys.maxunicode + 2):
        inside = cp <= sys.maxunicode and unicodedata.category(chr(cp)).startswith(prefix)
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            ranges.append((start, cp - 1))
            start = None
    return "".join(_escape(lo) if lo == hi else f"{_escape(lo)}-{_escape(hi)}" for lo, hi in ranges)


@functools.lru_cache(maxsize=1)
def gpt2_pattern() -> re.Pattern[str]:
    r"""GPT-2's pre-tokenization pattern (:data:`GPT2_REGEX`) for Python's ``re``.

    ``\p{L}``, ``\p{N}`` and ``\s`` become explicit classes (letters, numbers and Unicode's
    ``White_Space``, read from :mod:`unicodedata`), ``\S`` their complement; everything else is
    GPT-2's pattern unchanged: the contractions first, then a letter run, a number run or a run of
    other characters, each with at most one leading space, then whitespace. ``\s+(?!\S)`` takes a
    run of whitespace except its last character when a non-space follows, so that the last space
    goes with the next word. Built once, on first use (about a tenth of a second).
    """
    L, N, W = _unicode_class("L"), _unicode_class("N"), _WHITE_SPACE
    return re.compile(
        rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{W}{L}{N}]+|[{W}]+(?![^{W}])|[{W}]+"
    )


def _compiled(pattern: str) -> re.Pattern[str]:
    if pattern == "course":
        return _PIECE
    if pattern == "gpt2":
        return gpt2_pattern()
    raise ValueError(
        f"pattern={pattern!r} is not a pre-tokenization pattern; choose one of {PATTERNS} "
        "('course': words, punctuation and whitespace; 'gpt2': GPT-2's released pattern)"
    )


def pretokenize(text: str, pattern: str = "course") -> list[str]:
    """Split ``text`` into the pieces that BPE works inside; ``"".join(pretokenize(text)) == text``.

    With ``pattern="course"``: words with their leading space, runs of punctuation, runs of
    whitespace. With ``pattern="gpt2"``: GPT-2's split (see :func:`gpt2_pattern`), which also cuts
    off ``'s``, ``'t``, ``'re``, ``'ve``, ``'m``, ``'ll``, ``'d`` and separates digits from letters.

    :class:`BPETokenizer` counts pairs and applies merges within each piece, never across two, so
    ``" the"`` can become one token but ``"e t"`` never does (the same rule as GPT-2's tokenizer).

    Raises:
        TypeError: if ``text`` is not a string.
        ValueError: if ``pattern`` is not ``"course"`` or ``"gpt2"``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return _compiled(pattern).findall(text)


# --------------------------------------------------------------------------------------------------
# Special tokens
# --------------------------------------------------------------------------------------------------


def _check_special(special_tokens: Iterable[str]) -> list[str]:
    """The special tokens as a list, after checking that each is a non-empty string, once."""
    if isinstance(special_tokens, str):
        raise TypeError(
            f"special_tokens must be a collection of strings, got the string {special_tokens!r}; "
            f"write [{special_tokens!r}]"
        )
    tokens = list(special_tokens)
    for s in tokens:
        if not isinstance(s, str):
            raise TypeError(
                f"a special token must be a str, got {s!r} ({type(s).__name__}); special tokens "
                "are strings such as '<|endoftext|>'"
            )
        if not s:
            raise ValueError("a special token must not be empty: the empty string matches anywhere")
    seen: set[str] = set()
    dup = sorted({s for s in tokens if s in seen or seen.add(s)})
    if dup:
        raise ValueError(f"special token(s) {dup!r} registered twice; register each once")
    return tokens


@functools.lru_cache(maxsize=64)
def _special_regex(special_tokens: tuple[str, ...]) -> re.Pattern[str]:
    """One alternation of the escaped special tokens, longest first: at each place in the text the
    regex tries the alternatives in order, so among special tokens that start at the same place
    the longest wins, and the scan from the left finds the leftmost one first."""
    ordered = sorted(special_tokens, key=lambda s: (-len(s), s))
    return re.compile("|".join(re.escape(s) for s in ordered))


def split_special(text: str, special_tokens: Iterable[str]) -> list[tuple[str, bool]]:
    """Cut ``text`` at its special tokens: a list of ``(span, is_special)`` in order, joining back to
    ``text``; ordinary spans are never empty.

    Special tokens are found from the left; where two start at the same place (one is a prefix of the
    other, e.g. ``"<|end|>"`` and ``"<|end|>\\n"``), the longest wins. Text that only contains part of
    a special token (``"<|endof"``) is ordinary text.

    Raises:
        TypeError: if ``text`` or a special token is not a string.
        ValueError: if a special token is empty or registered twice.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    tokens = _check_special(special_tokens)
    if not tokens:
        return [(text, False)] if text else []
    out: list[tuple[str, bool]] = []
    start = 0
    for m in _special_regex(tuple(tokens)).finditer(text):
        if m.start() > start:
            out.append((text[start : m.start()], False))
        out.append((m.group(), True))
        start = m.end()
    if start < len(text):
        out.append((text[start:], False))
    return out
