"""Write src/transformer_course/tokens/gpt2_sample.json: a sample text, GPT-2's ids for it, and the part
of GPT-2's ranks that encoding it consults (maintainer-run; the course reads the file, never this script).

    pip download openai-whisper==20250625 --no-deps --no-binary :all: -d /tmp/wdl   # the sdist
    pip install tiktoken regex                                                     # this script only
    .venv/bin/python scripts/gpt2_fixture.py --sdist /tmp/wdl/openai_whisper-20250625.tar.gz

Where the numbers come from:

* GPT-2's ranks: ``whisper/assets/gpt2.tiktoken`` inside the PyPI sdist of ``openai-whisper`` (MIT
  licence, OpenAI): one token a line, base64 bytes and rank. The script checks that its sha256 is the
  hash tiktoken expects of ``r50k_base.tiktoken``, the table of its ``gpt2`` encoding, and records both
  hashes.
* The reference ids: tiktoken's own encoder (Rust), built offline from the full table with tiktoken's
  GPT-2 pattern and ``{"<|endoftext|>": 50256}``, encoding the sample with special tokens allowed.

The subset: every token that the BPE lookup *finds* while encoding the sample's pieces (tiktoken's
rule: merge the adjacent pair whose concatenation has the lowest rank, until none is in the table),
plus the 256 single bytes. A lookup that misses in the full table misses in the subset too, and one
that hits has the same rank, so encoding these pieces with the subset takes exactly the same steps.
The pieces are those of four variants: GPT-2's pattern or the course's, each with ``"<|endoftext|>"``
registered or treated as text (the page shows the wrong variants, which must be what the full table
gives). The script proves the claim: tiktoken with the subset equals tiktoken with the full table,
and the course's ``BPETokenizer.from_ranks`` with the subset equals it with the full table, for every
variant; and the course's encoding equals tiktoken's ids.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import inspect
import json
import pathlib
import platform
import re
import sys
import tarfile

import transformer_course as tc
from transformer_course.tokens import BPETokenizer, pretokenize, read_tiktoken, split_special

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "transformer_course" / "tokens" / "gpt2_sample.json"
MEMBER = "whisper/assets/gpt2.tiktoken"
SPECIAL = {"<|endoftext|>": 50256}

# Lines of Coriolanus (public domain, the opening of tiny-shakespeare), then prose written for the
# course: contractions (GPT-2 splits off 's 't 're 've 'm 'll 'd, lower case only), digits and
# numbers that are not digits, runs of spaces and newlines, non-ASCII letters, an emoji, CJK, and
# text that holds only the start of a special token.
SAMPLE = (
    "First Citizen:\n"
    "Before we proceed any further, hear me speak.\n"
    "\n"
    "All:\n"
    "Speak, speak.\n"
    "<|endoftext|>"
    "MENENIUS:\n"
    "I'll tell you a pretty tale: it's one you've heard, I'd wager, and they're sure we'll hear it.\n"
    "I'm sure the belly answer'd--\n"
    "<|endoftext|>\n"
    "The ledger, 2024-11-24: 1,000 ducats at 3.5% = 35 ducats a year (x² and ½ too).\n"
    "Tabs\tand  double  spaces,   triple   spaces and trailing spaces   \n"
    "\n"
    "\n"
    "A café in Zürich serves naïve crème brûlée 😀 — “quoted” text… 日本語 too.\n"
    "CAPITALS SHOUT: WE'LL, IT'S, DON'T.\n"
    "A marker typed halfway, <|endof, is only text.<|endoftext|>"
)


def lookups(piece: bytes, ranks: dict[bytes, int], found: set[bytes]) -> list[int]:
    """tiktoken's merge rule on one piece, recording every concatenation that the table holds."""
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, at = None, 0
        for i in range(len(parts) - 1):
            joined = parts[i] + parts[i + 1]
            rank = ranks.get(joined)
            if rank is not None:
                found.add(joined)
                if best is None or rank < best:
                    best, at = rank, i
        if best is None:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return [ranks[p] for p in parts]


# (pattern, special tokens) of each variant whose lookups the subset covers
VARIANTS = {
    "gpt2 pattern, special registered": ("gpt2", list(SPECIAL)),
    "gpt2 pattern, special as text": ("gpt2", []),
    "course pattern, special registered": ("course", list(SPECIAL)),
    "course pattern, special as text": ("course", []),
}


def require(ok: bool, why: str) -> None:
    if not ok:
        raise SystemExit(f"error: {why}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=pathlib.Path, required=True, help="openai-whisper's sdist")
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args()
    import regex  # maintainer-only dependencies, imported here so that --help works without them
    import tiktoken
    from tiktoken_ext import openai_public

    sdist_bytes = args.sdist.read_bytes()
    with tarfile.open(args.sdist) as tar:
        names = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}
        raw = tar.extractfile(names[MEMBER]).read()
        licence = tar.extractfile(names["LICENSE"]).read().decode().splitlines()
        pkg_info = tar.extractfile(names["PKG-INFO"]).read().decode()
    version = re.search(r"^Version: (\S+)", pkg_info, re.M).group(1)
    sha = hashlib.sha256(raw).hexdigest()
    expected = re.search(
        r'expected_hash="([0-9a-f]{64})"', inspect.getsource(openai_public.r50k_base)
    ).group(1)
    require(sha == expected, f"{MEMBER} has sha256 {sha}, not tiktoken's r50k_base hash {expected}")
    ranks = read_tiktoken(raw)
    print(f"{MEMBER}: {len(ranks):,} tokens, sha256 {sha} (= tiktoken's r50k_base)")

    pat_str = openai_public.r50k_pat_str
    full = tiktoken.Encoding("gpt2-full", pat_str=pat_str, mergeable_ranks=ranks,
                             special_tokens=SPECIAL)  # fmt: skip
    ids = full.encode(SAMPLE, allowed_special="all")
    print(
        f"sample: {len(SAMPLE)} characters -> {len(ids)} GPT-2 tokens (tiktoken {tiktoken.__version__})"
    )

    # The course's re version of GPT-2's pattern cuts the same pieces as the regex module's (GPT-2's
    # released pattern and tiktoken's faster one).
    for span, is_special in split_special(SAMPLE, SPECIAL):
        if not is_special:
            ours = pretokenize(span, "gpt2")
            require(
                ours == regex.findall(tc.tokens.GPT2_REGEX, span) == regex.findall(pat_str, span),
                f"the course's GPT-2 pattern cuts {span!r} differently from the regex module",
            )

    found: set[bytes] = set()
    for pattern, special in VARIANTS.values():
        for span, is_special in split_special(SAMPLE, special):
            if not is_special:
                for piece in pretokenize(span, pattern):
                    lookups(piece.encode("utf-8"), ranks, found)
    subset = {t: r for t, r in ranks.items() if len(t) == 1 or t in found}
    print(f"subset: {len(subset)} tokens ({len(subset) - 256} found by the lookups + 256 bytes)")

    # The proof: the subset gives what the full table gives, in tiktoken and in the course.
    part = tiktoken.Encoding("gpt2-subset", pat_str=pat_str, mergeable_ranks=subset,
                             special_tokens=SPECIAL)  # fmt: skip
    require(part.encode(SAMPLE, allowed_special="all") == ids, "tiktoken: subset != full table")
    require(
        part.encode(SAMPLE, disallowed_special=()) == full.encode(SAMPLE, disallowed_special=()),
        "tiktoken, special as text: subset != full table",
    )
    for name, (pattern, special) in VARIANTS.items():
        specials = {s: SPECIAL[s] for s in special}
        course_full = BPETokenizer.from_ranks(ranks, specials, pattern=pattern).encode(SAMPLE)
        course_part = BPETokenizer.from_ranks(subset, specials, pattern=pattern).encode(SAMPLE)
        require(course_full == course_part, f"{name}: subset != full table")
        print(f"  {name}: subset = full table ({len(course_full)} ids)")
    course = BPETokenizer.from_ranks(ranks, SPECIAL, pattern="gpt2").encode(SAMPLE)
    require(course == ids, "the course's GPT-2 encoding differs from tiktoken's")
    require(full.decode(ids) == SAMPLE, "tiktoken's decode does not give the sample back")
    print("the course's BPETokenizer.from_ranks(gpt2 ranks) = tiktoken's ids; decode round-trips")
    try:  # more evidence, not stored: the whole of tiny-shakespeare, if there is a local copy
        corpus = tc.data.tinyshakespeare_path(download=False).read_text(encoding="utf-8")
    except FileNotFoundError:
        print("(no local tiny-shakespeare: the whole-corpus comparison is skipped)")
    else:
        gpt2 = BPETokenizer.from_ranks(ranks, SPECIAL, pattern="gpt2")
        require(gpt2.encode(corpus) == full.encode(corpus), "tiny-shakespeare: course != tiktoken")
        print(f"tiny-shakespeare ({len(corpus):,} characters): the course's ids = tiktoken's")

    data = {
        "about": "A sample text, GPT-2's ids for it (tiktoken) and the part of GPT-2's ranks that "
        "encoding it consults. Written by scripts/gpt2_fixture.py; do not edit.",
        "text": SAMPLE,
        "ids": ids,
        "special_tokens": SPECIAL,
        "ranks": {
            base64.b64encode(t).decode(): r for t, r in sorted(subset.items(), key=lambda x: x[1])
        },
        "covers": list(VARIANTS),
        "source": {
            "ranks_file": MEMBER,
            "ranks_sha256": sha,
            "ranks_tokens": len(ranks),
            "ranks_equal_tiktoken_r50k_base": True,  # checked above against tiktoken's expected hash
            "package": f"openai-whisper {version} (PyPI sdist {args.sdist.name})",
            "package_sha256": hashlib.sha256(sdist_bytes).hexdigest(),
            "licence": " ".join(line for line in licence[:3] if line.strip()),
            "reference_ids": f"tiktoken {tiktoken.__version__}: tiktoken.Encoding(pat_str=r50k_pat_str, "
            "mergeable_ranks=<the full table>, special_tokens={'<|endoftext|>': 50256})"
            ".encode(text, allowed_special='all')",
            "pat_str": pat_str,
            "python": platform.python_version(),
        },
    }
    args.out.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out} "
          f"({args.out.stat().st_size:,} bytes)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
