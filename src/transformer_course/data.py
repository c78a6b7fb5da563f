"""Data: the tiny-shakespeare corpus (downloaded once, verified, cached) and batches of token windows.

Chapter: *Autoregressive language models* and the labs that train on text. No download happens at
import; :func:`tinyshakespeare_text` fetches the file the first time it is needed.

Where the file comes from, in order:

1. ``$TRANSFORMER_COURSE_DATA/tinyshakespeare/input.txt`` when that environment variable is set (CI
   points it at a shared copy);
2. the cache, ``$XDG_CACHE_HOME/transformer_course`` (default ``~/.cache/transformer_course``);
3. a download from :data:`TINYSHAKESPEARE_URL` into the cache, checked against its SHA-256.

Offline with no copy, the error says where to put the file.

Also scikit-learn's bundled 8x8 digits (no download), split as in scikit-learn's own example, and a
random-shift augmentation for them.
"""

from __future__ import annotations

import hashlib
import math
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
    "digits_split",
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
