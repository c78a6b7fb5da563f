"""Data: the tiny-shakespeare corpus (downloaded once, verified, cached) and batches of token windows.

Chapter: *Autoregressive language models* and the labs that train on text. No download happens at
import; :func:`tinyshakespeare_text` fetches the file the first time it is needed.

Where the file comes from, in order:

1. ``$TRANSFORMER_COURSE_DATA/tinyshakespeare/input.txt`` when that environment variable is set (CI
   points it at a shared copy);
2. the cache, ``$XDG_CACHE_HOME/transformer_course`` (default ``~/.cache/transformer_course``);
3. a download from :data:`TINYSHAKESPEARE_URL` into the cache, checked against its SHA-256.

Offline with no copy, the error says where to put the file.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import tempfile
import urllib.request

import torch
from torch import Tensor

__all__ = [
    "TINYSHAKESPEARE_SHA256",
    "TINYSHAKESPEARE_URL",
    "cache_dir",
    "get_batch",
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
