"""BPE training speed: the course's recount, its fast trainer and Hugging Face `tokenizers`, one text.

    python bench/bpe.py                 # 1,000 merges on the whole of tiny-shakespeare (~1 minute)
    python bench/bpe.py --quick         # 20,000 characters, 30 merges (smoke test)

Learns ``--merges`` merges from tiny-shakespeare with GPT-2's pre-tokenization three ways:

* ``BPETokenizer.train_reference``: the readable rule, which recounts every pair after each merge
  (run once: it is the slow one);
* ``BPETokenizer.train``: the fast trainer (an index from pairs to the words holding them and a heap
  with lazy deletion, so a merge updates only the counts it changes); best of ``--repeats`` after a
  warm-up run;
* Hugging Face ``tokenizers`` (Rust): ``models.BPE`` with the ``ByteLevel`` pre-tokenizer (GPT-2's
  pattern) and ``BpeTrainer`` over the 256 byte symbols; best of ``--repeats`` after a warm-up;
  skipped with a note when the library is missing (``pip install -e '.[bench]'``).

Both course trainers start from the text (pre-tokenization included), as ``tokenizers`` does. The
fast trainer must learn exactly the recount's merges (``merges_identical``); the tokens that
``tokenizers`` learns are compared as byte strings (its ties are broken in another order, so a few
may differ). Target: ``fast_seconds <= 2.0`` on a 2-core CPU. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import os
import time

from common import report

import transformer_course as tc
from transformer_course.runtime import machine
from transformer_course.tokens import BPETokenizer

TARGETS = {"fast_seconds": ["<=", 2.0], "merges_identical": ["==", True]}


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-ins for the 256 bytes (what ``ByteLevel`` writes), back to bytes."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def hf_trainer(text: str, merges: int):
    """A function learning ``merges`` merges with Hugging Face ``tokenizers``, or None without it."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        return None

    def train() -> list[bytes]:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=256 + merges,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            min_frequency=0,
            show_progress=False,
        )
        tok.train_from_iterator([text], trainer=trainer)
        decode = _byte_decoder()
        vocab = tok.get_vocab()
        return [bytes(decode[c] for c in t) for t, _ in sorted(vocab.items(), key=lambda x: x[1])]

    return train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--merges", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3, help="best of, for the fast trainers")
    parser.add_argument("--chars", type=int, default=None, help="only the first characters")
    parser.add_argument("--quick", action="store_true", help="20,000 characters, 30 merges")
    parser.add_argument("--device", default="cpu", help="cpu only (training BPE is Python code)")
    parser.add_argument("--note", default="", help="recorded as is, e.g. how the run was pinned")
    args = parser.parse_args()
    if args.quick:
        args.merges, args.chars, args.repeats = 30, 20_000, 1
    if args.device != "cpu":
        print(f"note: --device {args.device} ignored; BPE training is Python code on the CPU")
    text = tc.data.tinyshakespeare_path().read_text(encoding="utf-8")[: args.chars]
    vocab_size = 256 + args.merges
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    print(f"machine: {machine('cpu')}; this process may run on cores {cores}")
    print(f"text: {len(text):,} characters of tiny-shakespeare; {args.merges} merges; "
          "GPT-2's pre-tokenization")  # fmt: skip

    def fast() -> BPETokenizer:
        return BPETokenizer.train(text, vocab_size, pattern="gpt2")

    hf = hf_trainer(text, args.merges)
    fast()  # warm-up (also builds GPT-2's pattern once)
    if hf is not None:
        hf()
    fast_times, hf_times = [], []
    for _ in range(args.repeats):  # alternate, so that drift on the machine hits both
        seconds, fast_tok = _timed(fast)
        fast_times.append(seconds)
        if hf is not None:
            seconds, hf_tokens = _timed(hf)
            hf_times.append(seconds)
    recount_seconds, recount_tok = _timed(
        lambda: BPETokenizer.train_reference(text, vocab_size, pattern="gpt2")
    )
    identical = fast_tok.merges == recount_tok.merges
    fast_seconds = min(fast_times)
    print(f"recount (train_reference), once:      {recount_seconds:8.3f} s")
    print(f"fast (train), best of {args.repeats}:              {fast_seconds:8.3f} s  "
          f"(all: {', '.join(f'{t:.3f}' for t in fast_times)}); "
          f"{recount_seconds / fast_seconds:.0f}x faster than the recount")  # fmt: skip
    print(f"same merges as the recount: {identical} ({len(fast_tok.merges)} merges)")
    results = {
        "targets": TARGETS,
        "device": "cpu",
        "machine": machine("cpu"),
        "cpus_allowed": cores,
        "note": args.note,
        "characters": len(text),
        "merges": len(fast_tok.merges),
        "repeats": args.repeats,
        "pattern": "gpt2",
        "recount_seconds": round(recount_seconds, 3),
        "fast_seconds": round(fast_seconds, 3),
        "fast_all_seconds": [round(t, 3) for t in fast_times],
        "speedup_vs_recount": round(recount_seconds / fast_seconds, 1),
        "merges_identical": identical,
    }
    if hf is None:
        print("Hugging Face tokenizers: not installed, skipped (pip install -e '.[bench]')")
        results["hf_seconds"] = None
    else:
        import tokenizers

        ours = {fast_tok.vocab[256 + k] for k in range(len(fast_tok.merges))}
        theirs = set(hf_tokens[256:])
        hf_seconds = min(hf_times)
        print(f"Hugging Face tokenizers {tokenizers.__version__}, best of {args.repeats}: "
              f"{hf_seconds:8.3f} s; the course's fast trainer takes {fast_seconds / hf_seconds:.1f}x "
              f"as long; {len(ours & theirs)} of the {len(ours)} learned tokens are the same byte "
              "strings")  # fmt: skip
        results |= {
            "hf_seconds": round(hf_seconds, 3),
            "hf_version": tokenizers.__version__,
            "fast_vs_hf_ratio": round(fast_seconds / hf_seconds, 2),
            "tokens_shared_with_hf": len(ours & theirs),
        }
    report(results)


if __name__ == "__main__":
    main()
