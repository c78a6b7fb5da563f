"""Data: the tiny-shakespeare corpus (downloaded once, verified, cached) and batches of token windows.

Chapter: *Autoregressive language models* and the labs that train on text. No download happens at
import; :func:`tinyshakespeare_text` fetches the file the first time it is needed.

Where the file comes from, in order:

1. ``$TRANSFORMER_COURSE_DATA/tinyshakespeare/input.txt`` when that environment variable is set (CI
   points it at a shared copy);
2. the cache, ``$XDG_CACHE_HOME/transformer_course`` (default ``~/.cache/transformer_course``);
3. a download from :data:`TINYSHAKESPEARE_URL` into the cache, checked against its SHA-256.

Offline with no copy, the error says where to put the file.

Also scikit-learn's bundled 8x8 digits (no download), split as in scikit-learn's own example, with
label-preserving augmentations for them (chapter *Vision transformers*); and a sequence-to-sequence
task generated in code, dates written the ways people write them into ISO dates (chapter
*Encoder-decoder*).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import os
import pathlib
import random
import re
import shutil
import tempfile
import urllib.request

import torch
from torch import Tensor

__all__ = [
    "DATE_FORMATS",
    "TINYSHAKESPEARE_SHA256",
    "TINYSHAKESPEARE_URL",
    "DateTask",
    "cache_dir",
    "date_fields",
    "digits_split",
    "format_date",
    "get_batch",
    "random_affine",
    "random_shift",
    "tinyshakespeare_path",
    "tinyshakespeare_text",
    "train_val_split",
]

DATA_ENV = "TRANSFORMER_COURSE_DATA"
TINYSHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TINYSHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
TINYSHAKESPEARE_CHARS = 1_115_394


def cache_dir() -> pathlib.Path:
    """``$XDG_CACHE_HOME/transformer_course`` (default ``~/.cache/transformer_course``)."""
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "transformer_course"


def _sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tinyshakespeare_path(download: bool = True) -> pathlib.Path:
    """Path of a verified ``tinyshakespeare/input.txt``, downloading it into the cache if needed.

    Raises:
        FileNotFoundError: ``$TRANSFORMER_COURSE_DATA`` is set but holds no copy, or there is no copy
            and the download fails (offline); the message says where to put the file.
        ValueError: a copy exists but its checksum is wrong (a partial or different file).
    """
    rel = pathlib.Path("tinyshakespeare") / "input.txt"
    override = os.environ.get(DATA_ENV)
    if override:
        path = pathlib.Path(override).expanduser() / rel
        if not path.exists():
            raise FileNotFoundError(
                f"${DATA_ENV} is set to {override!r} but {path} does not exist; put the corpus "
                f"there (from {TINYSHAKESPEARE_URL}) or unset ${DATA_ENV} to use the cache"
            )
        _verify(path)
        return path
    path = cache_dir() / rel
    if path.exists():
        _verify(path)
        return path
    if not download:
        raise FileNotFoundError(f"no cached corpus at {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(TINYSHAKESPEARE_URL, timeout=30) as response:
            with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
                shutil.copyfileobj(response, tmp)
    except OSError as err:
        raise FileNotFoundError(
            f"could not download tiny-shakespeare from {TINYSHAKESPEARE_URL} ({err}). Offline? Copy "
            f"the file to {path}, or set ${DATA_ENV} to a folder that holds tinyshakespeare/input.txt"
        ) from err
    tmp_path = pathlib.Path(tmp.name)
    try:
        _verify(tmp_path)
    except ValueError:
        tmp_path.unlink()
        raise
    tmp_path.replace(path)
    return path


def _verify(path: pathlib.Path) -> None:
    digest = _sha256(path)
    if digest != TINYSHAKESPEARE_SHA256:
        raise ValueError(
            f"{path} is not the tiny-shakespeare corpus (SHA-256 {digest[:12]}..., expected "
            f"{TINYSHAKESPEARE_SHA256[:12]}...); delete it and let the package download it again"
        )


def tinyshakespeare_text() -> str:
    """The whole corpus: 1,115,394 characters, 65 distinct symbols."""
    return tinyshakespeare_path().read_text(encoding="utf-8")


def train_val_split(ids: Tensor, train_fraction: float = 0.9) -> tuple[Tensor, Tensor]:
    """Split a 1-D token sequence into its first ``train_fraction`` and the rest (no shuffling)."""
    if ids.dim() != 1:
        raise ValueError(f"ids must be a 1-D sequence of token ids, got shape {tuple(ids.shape)}")
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    n = int(train_fraction * len(ids))
    return ids[:n], ids[n:]


def get_batch(
    ids: Tensor,
    block_size: int,
    batch_size: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """``batch_size`` random windows of ``block_size`` tokens and the same windows shifted by one.

    Returns:
        ``x, y`` of shape ``(batch_size, block_size)``; ``y[b, n] = x[b, n + 1]`` is the next token,
        so one window gives ``block_size`` training targets (teacher forcing).
    """
    if len(ids) <= block_size:
        raise ValueError(
            f"a sequence of {len(ids)} tokens is too short for windows of {block_size} + 1"
        )
    starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)
    offsets = torch.arange(block_size + 1)
    windows = ids[starts[:, None] + offsets]  # (batch_size, block_size + 1)
    x, y = windows[:, :-1], windows[:, 1:]
    if device is not None:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    return x, y


def digits_split() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """scikit-learn's 8x8 digits, split as in its classification example: the first half (898 images)
    for training and the second half (899) for testing, no shuffling (Pedregosa et al. 2011).

    Returns:
        ``X_train (898, 1, 8, 8)``, ``y_train (898,)``, ``X_test (899, 1, 8, 8)``, ``y_test (899,)``;
        pixels scaled from 0..16 to 0..1.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    X = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0  # (1797, 1, 8, 8)
    y = torch.tensor(digits.target, dtype=torch.long)
    n = len(X) // 2
    return X[:n], y[:n], X[n:], y[n:]


def random_shift(
    images: Tensor, max_shift: int, generator: torch.Generator | None = None
) -> Tensor:
    """Translate each image by a random whole number of pixels in ``[-max_shift, max_shift]`` per axis,
    filling with zeros (a label-preserving augmentation for centred digits)."""
    if images.dim() != 4:
        raise ValueError(f"images must be (B, C, H, W), got {tuple(images.shape)}")
    B, _, H, W = images.shape
    p = max_shift
    padded = torch.nn.functional.pad(images, (p, p, p, p))  # (B, C, H + 2p, W + 2p)
    dy, dx = torch.randint(0, 2 * p + 1, (2, B), generator=generator)
    rows = (dy[:, None] + torch.arange(H)).to(images.device)  # (B, H)
    cols = (dx[:, None] + torch.arange(W)).to(images.device)  # (B, W)
    b = torch.arange(B, device=images.device)[:, None, None]
    return padded.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)


def random_affine(
    images: Tensor,
    degrees: float = 10.0,
    scale: float = 0.1,
    max_shift: float = 1.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Rotate each image by a random angle in ``[-degrees, degrees]``, zoom it by a random factor in
    ``[1 - scale, 1 + scale]`` and translate it by up to ``max_shift`` pixels per axis (any real amount),
    resampling bilinearly and filling with zeros; a label-preserving augmentation for centred digits.
    The random numbers are drawn on the CPU from ``generator``, so a seed gives the same images on
    every device.
    """
    if images.dim() != 4:
        raise ValueError(f"images must be (B, C, H, W), got {tuple(images.shape)}")
    if degrees < 0 or not 0 <= scale < 1 or max_shift < 0:
        raise ValueError(
            f"need degrees >= 0, 0 <= scale < 1 and max_shift >= 0, got {degrees}, {scale}, {max_shift}"
        )
    B, _, H, W = images.shape
    u = torch.rand(B, 4, generator=generator) * 2 - 1  # uniform in [-1, 1): angle, zoom, dx, dy
    angle = u[:, 0] * math.radians(degrees)
    zoom = 1 + u[:, 1] * scale
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom  # output -> input coordinates
    dx, dy = u[:, 2] * max_shift * 2 / W, u[:, 3] * max_shift * 2 / H  # pixels -> [-1, 1] units
    theta = torch.stack(
        [torch.stack([cos, -sin, dx], dim=1), torch.stack([sin, cos, dy], dim=1)], dim=1
    ).to(images.device, images.dtype)  # (B, 2, 3)
    grid = torch.nn.functional.affine_grid(theta, list(images.shape), align_corners=False)
    return torch.nn.functional.grid_sample(images, grid, align_corners=False, padding_mode="zeros")


# --------------------------------------------------------------------------------------------------
# Dates written the ways people write them, into ISO dates (chapter *Encoder-decoder*)
#
# "21st of November 2026", "11/21/26", "Nov 21, 2026" and a dozen other formats all map to
# "2026-11-21". The task has a real alignment structure (the day, month and year of the output come
# from different places in the input, in an order that depends on the format), so the cross-attention
# maps of a trained model can be read. Every format is unambiguous: slashes are always month/day/year
# (US), dots always day.month.year.

MONTHS = [
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
]  # fmt: skip
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _ordinal(d: int) -> str:
    suffix = "th" if 11 <= d % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(d % 10, "th")
    return f"{d}{suffix}"


DATE_FORMATS = {
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
    """``date`` written in one of the :data:`DATE_FORMATS` (e.g. ``"ordinal_of"``)."""
    try:
        return DATE_FORMATS[style](date)
    except KeyError:
        raise ValueError(
            f"unknown date style {style!r}; choose from {sorted(DATE_FORMATS)}"
        ) from None


def date_fields(text: str) -> dict[str, list[int]]:
    """Character positions of the year, month and day in ``text``, a date in any of the
    :data:`DATE_FORMATS` (chapter *Encoder-decoder* compares them with the cross-attention weights).

    Digit runs are assigned by the format's order: slashes are month/day/year unless the first run
    has four digits (``iso_slash``: year/month/day), dots are day.month.year; otherwise a four-digit
    run is the year and a shorter one the day. A month written as a name (or its first three
    letters, in any case) is the month's field. The suffix of an ordinal (``21st``) and a weekday's
    name belong to no field.

    Returns:
        ``{"year": [...], "month": [...], "day": [...]}``, positions in increasing order.
    """
    found: dict[str, list[int]] = {"year": [], "month": [], "day": []}
    runs = list(re.finditer(r"\d+|[A-Za-z]+", text))
    digits = [r for r in runs if r.group().isdigit()]
    if "/" in text:
        four_first = bool(digits) and len(digits[0].group()) == 4
        order: tuple[str, ...] | None = (
            ("year", "month", "day") if four_first else ("month", "day", "year")
        )
    elif "." in text:
        order = ("day", "month", "year")
    else:
        order = None
    if order is not None and len(digits) != len(order):
        raise ValueError(f"{text!r}: expected {len(order)} numbers, found {len(digits)}")
    for k, r in enumerate(digits):
        name = order[k] if order else ("year" if len(r.group()) == 4 else "day")
        found[name] += range(r.start(), r.end())
    for r in runs:
        word = r.group().lower()
        if len(word) >= 3 and any(m.lower().startswith(word) for m in MONTHS):
            found["month"] += range(r.start(), r.end())
    return {name: sorted(pos) for name, pos in found.items()}


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
        self.src_len = max(len(f(d)) for f in DATE_FORMATS.values() for d in year) + 1  # + EOS
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
            pairs.append((format_date(date, rng.choice(sorted(DATE_FORMATS))), date.isoformat()))
        return pairs

    def held_out(
        self, n: int, exclude: list[tuple[str, str]], seed: int = 2
    ) -> list[tuple[str, str]]:
        """``n`` random pairs whose inputs appear nowhere in ``exclude`` (e.g. the training pairs)."""
        seen = {s for s, _ in exclude}
        pairs: list[tuple[str, str]] = []
        while len(pairs) < n:
            fresh = [p for p in self.sample(3 * n, seed) if p[0] not in seen]
            pairs += fresh[: n - len(pairs)]
            seen |= {s for s, _ in fresh}
            seed += 1_000_003
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
