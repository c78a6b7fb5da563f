"""GPT-2's tokenizer as published: reading a ranks file, and the small sample that ships with the course.

OpenAI publishes GPT-2's byte-level BPE as a ranks table, one token a line: the token's bytes in
base64, a space, its rank (``gpt2.tiktoken``, identical to tiktoken's ``r50k_base.tiktoken``; MIT
licence). :func:`read_tiktoken` reads such a file; :meth:`.BPETokenizer.from_ranks` turns the table
into a tokenizer whose ids are GPT-2's.

The full table is 50,256 lines, too large to ship. ``gpt2_sample.json``, written by the maintainer
script ``scripts/gpt2_fixture.py``, holds a sample text, the part of the table that encoding the
sample consults (so the part gives exactly the ids the full table gives; the script proves it), and
the ids that tiktoken's own GPT-2 encoding returns for the sample, with the provenance of both.
:func:`gpt2_sample` loads it; :func:`gpt2_tokenizer` builds GPT-2's whole tokenizer from the full
table, downloaded (tiktoken's copy) or from a file, and checks it against the sha256 recorded there.
"""

from __future__ import annotations

import base64
import hashlib
import json
import pathlib
import urllib.request
from dataclasses import dataclass

__all__ = [
    "ENDOFTEXT",
    "GPT2_RANKS_URL",
    "GPT2Sample",
    "gpt2_sample",
    "gpt2_tokenizer",
    "read_tiktoken",
]

GPT2_RANKS_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
"""Where tiktoken downloads GPT-2's full ranks table (``r50k_base``, the same file as ``gpt2.tiktoken``)."""

ENDOFTEXT = "<|endoftext|>"  # GPT-2's one special token, id 50256
SAMPLE_PATH = pathlib.Path(__file__).with_name("gpt2_sample.json")


def read_tiktoken(text: str | bytes) -> dict[bytes, int]:
    """The ranks table of a ``.tiktoken`` file's contents: ``{token bytes: rank}``.

    Each non-empty line is ``<base64 of the token's bytes> <rank>``.

    Raises:
        ValueError: naming the first line that is not of that form, or a token listed twice.
    """
    if isinstance(text, bytes):
        text = text.decode("ascii")
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token64, rank_text = line.split()
            token = base64.b64decode(token64, validate=True)
            rank = int(rank_text)
        except ValueError as err:
            raise ValueError(
                f"line {n} of the ranks file is {line[:60]!r}, not '<base64 token> <rank>' ({err})"
            ) from None
        if token in ranks:
            raise ValueError(f"line {n}: the token {token!r} is listed twice")
        ranks[token] = rank
    return ranks


@dataclass(frozen=True)
class GPT2Sample:
    """A sample text with GPT-2's ids for it (from tiktoken) and the part of GPT-2's ranks it needs.

    Attributes:
        text: the sample: English prose and verse, contractions, digits, runs of spaces, newlines,
            non-ASCII letters, an emoji and ``"<|endoftext|>"``.
        ids: the ids tiktoken's GPT-2 encoding gives ``text`` (special tokens allowed).
        ranks: ``{token bytes: rank}``, the 256 single bytes and every token that encoding the sample
            looks up and finds, with the course's pattern or without the special token too.
        special_tokens: ``{"<|endoftext|>": 50256}``.
        source: where the ranks and the ids come from (file, package, version, sha256).
    """

    text: str
    ids: list[int]
    ranks: dict[bytes, int]
    special_tokens: dict[str, int]
    source: dict


def gpt2_sample(path: str | pathlib.Path = SAMPLE_PATH) -> GPT2Sample:
    """Load the GPT-2 sample that ships with the package (``tokens/gpt2_sample.json``)."""
    data = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    ranks = {base64.b64decode(t): int(r) for t, r in data["ranks"].items()}
    return GPT2Sample(
        text=data["text"],
        ids=[int(i) for i in data["ids"]],
        ranks=ranks,
        special_tokens={s: int(i) for s, i in data["special_tokens"].items()},
        source=data["source"],
    )


def gpt2_tokenizer(source: str | pathlib.Path = GPT2_RANKS_URL, sha256: str | None = "recorded"):
    """GPT-2's tokenizer with its full ranks table: ``BPETokenizer.from_ranks`` with GPT-2's
    pre-tokenizer and ``"<|endoftext|>"`` as id 50256, so that its ids are GPT-2's (and tiktoken's).

    ``source`` is a URL (by default :data:`GPT2_RANKS_URL`, 1.6 MB, read once) or a local
    ``.tiktoken`` file. ``sha256="recorded"`` checks the file against the hash in the sample's
    provenance (``gpt2_sample().source["ranks_sha256"]``), another string against that hash, ``None``
    not at all.

    Raises:
        ValueError: the file's sha256 is not the expected one (a partial or different file).
        OSError: the URL or the file cannot be read (offline, say).
    """
    from .bpe import BPETokenizer

    if str(source).startswith(("https://", "http://")):
        with urllib.request.urlopen(str(source), timeout=60) as response:
            data = response.read()
    else:
        data = pathlib.Path(source).read_bytes()
    expected = gpt2_sample().source["ranks_sha256"] if sha256 == "recorded" else sha256
    if expected is not None and hashlib.sha256(data).hexdigest() != expected:
        raise ValueError(
            f"{source} has sha256 {hashlib.sha256(data).hexdigest()}, not GPT-2's {expected}: a "
            "partial download or another table (pass sha256=None to use it anyway)"
        )
    return BPETokenizer.from_ranks(
        read_tiktoken(data), special_tokens={ENDOFTEXT: 50256}, pattern="gpt2"
    )
