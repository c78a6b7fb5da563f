"""Sequence-to-sequence tasks generated in code: dates written the ways people write them, into ISO.

Chapter: *Encoder-decoder*. ``"21st of November 2026"``, ``"11/21/26"``, ``"Nov 21, 2026"`` and a dozen
other formats all map to ``"2026-11-21"``. The task has a real alignment structure (the day, month and
year of the output come from different places in the input, in an order that depends on the format),
so the cross-attention maps of a trained model can be read. Every format is unambiguous: slashes are
always month/day/year (US), dots always day.month.year.
"""

from __future__ import annotations

import datetime as dt
import random

import torch
from torch import Tensor

__all__ = ["DateTask", "format_date"]

MONTHS = [
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
]  # fmt: skip
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _ordinal(d: int) -> str:
    suffix = "th" if 11 <= d % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(d % 10, "th")
    return f"{d}{suffix}"


FORMATS = {
    "ordinal_of": lambda x: f"{_ordinal(x.day)} of {MONTHS[x.month - 1]} {x.year}",
    "us_slash_short": lambda x: f"{x.month}/{x.day}/{x.year % 100:02d}",
    "us_slash_long": lambda x: f"{x.month:02d}/{x.day:02d}/{x.year}",
    "abbrev_comma": lambda x: f"{MONTHS[x.month - 1][:3]} {x.day}, {x.year}",
    "month_day_year": lambda x: f"{MONTHS[x.month - 1]} {x.day}, {x.year}",
    "month_ordinal": lambda x: f"{MONTHS[x.month - 1]} {_ordinal(x.day)}, {x.year}",
    "day_month_year": lambda x: f"{x.day} {MONTHS[x.month - 1]} {x.year}",
    "dotted": lambda x: f"{x.day}.{x.month}.{x.year}",
    "dashed_abbrev": lambda x: f"{x.day:02d}-{MONTHS[x.month - 1][:3]}-{x.year}",
    "weekday": lambda x: f"{WEEKDAYS[x.weekday()]}, {MONTHS[x.month - 1]} {x.day}, {x.year}",
    "lower_abbrev": lambda x: f"{x.day} {MONTHS[x.month - 1][:3].lower()} {x.year}",
    "iso_slash": lambda x: f"{x.year}/{x.month:02d}/{x.day:02d}",
}


def format_date(date: dt.date, style: str) -> str:
    """``date`` written in one of the :data:`FORMATS` (e.g. ``"ordinal_of"``)."""
    try:
        return FORMATS[style](date)
    except KeyError:
        raise ValueError(f"unknown date style {style!r}; choose from {sorted(FORMATS)}") from None


class DateTask:
    """Pairs (human date, ISO date) as padded token tensors.

    Token ids: ``0`` = padding, ``1`` = start of target (BOS), ``2`` = end (EOS), then one id per
    character. Two-digit years mean 1950-2049, so dates are drawn from that range.

    """

    PAD, BOS, EOS = 0, 1, 2
    FIRST, LAST = dt.date(1950, 1, 1), dt.date(2049, 12, 31)

    def __init__(self) -> None:
        chars = sorted(
            set("".join(MONTHS + WEEKDAYS) + "".join(MONTHS).lower() + "0123456789/,.- thsndrfo")
        )
        self.itos = ["<pad>", "<bos>", "<eos>", *chars]
        self.stoi = {c: i for i, c in enumerate(self.itos)}
        # every month and weekday name at every width: the longest input sets src_len
        year = [dt.date(2000, 1, 1) + dt.timedelta(days=k) for k in range(366)]
        self.src_len = max(len(f(d)) for f in FORMATS.values() for d in year) + 1  # + EOS
        self.tgt_len = 10 + 2  # BOS + "YYYY-MM-DD" + EOS

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def sample(self, n: int, seed: int) -> list[tuple[str, str]]:
        """``n`` random (input, ISO) string pairs, reproducible from ``seed``."""
        rng = random.Random(seed)
        span = (self.LAST - self.FIRST).days
        pairs = []
        for _ in range(n):
            date = self.FIRST + dt.timedelta(days=rng.randrange(span + 1))
            pairs.append((format_date(date, rng.choice(sorted(FORMATS))), date.isoformat()))
        return pairs

    def encode(self, text: str, length: int, bos: bool = False) -> list[int]:
        unknown = sorted({c for c in text if c not in self.stoi})
        if unknown:
            raise ValueError(f"characters not in the date vocabulary: {unknown}")
        ids = ([self.BOS] if bos else []) + [self.stoi[c] for c in text] + [self.EOS]
        if len(ids) > length:
            raise ValueError(f"{text!r} needs {len(ids)} tokens but the task allows {length}")
        return ids + [self.PAD] * (length - len(ids))

    def decode(self, ids: list[int] | Tensor) -> str:
        out = []
        for i in ids.tolist() if isinstance(ids, Tensor) else ids:
            if i == self.EOS:
                break
            if i not in (self.PAD, self.BOS):
                out.append(self.itos[i])
        return "".join(out)

    def tensors(self, pairs: list[tuple[str, str]]) -> tuple[Tensor, Tensor]:
        """``src (n, src_len)`` and ``tgt (n, tgt_len)`` (``tgt`` starts with BOS, ends with EOS)."""
        src = torch.tensor([self.encode(s, self.src_len) for s, _ in pairs])
        tgt = torch.tensor([self.encode(t, self.tgt_len, bos=True) for _, t in pairs])
        return src, tgt
