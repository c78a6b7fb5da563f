"""Exercises of the *Vision transformers* lab: counting patches, the class token and the learned
positions, mean pooling over the patch tokens, and a shift augmentation by padding and cropping.

Chapter: *Vision transformers* (Turner 2023 sec. 4.2, fig. 2 and footnote 19; MIT 6.390 sec. 9.5.1;
Dosovitskiy et al. 2021, eq. 1). Inputs are float64 (integers for the counting exercise) so the
checkers can compare exactly; the class token's row is offset from the patch rows so that every
wrong way of pooling gives different numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import Mistake, exercise, randn

# ---------------------------------------------------------------------------------------------------
# 1. How many tokens, and how wide (Turner fig. 2; Dosovitskiy et al. sec. 3.1)


def _count_inputs(gen: torch.Generator, trial: int) -> tuple[int, int, int, int]:
    # (C, height, width, P): the digits, the ViT paper's ImageNet setting, two non-square images
    return ((1, 8, 8, 2), (3, 224, 224, 16), (3, 12, 20, 4), (2, 6, 9, 3))[trial % 4]


@exercise(
    name="vision.patch_count",
    prompt=(
        "A C-channel image of height x width pixels is cut into non-overlapping P x P patches. Return "
        "torch.tensor([N, d]): the number N of patches and the length d of one flattened patch."
    ),
    make_inputs=_count_inputs,
    trials=4,
    mistakes=[
        Mistake(
            "N is the pixel count divided by the patch's area P * P, not by P: "
            "N = (height / P) * (width / P).",
            lambda C, h, w, P: torch.tensor([h * w // P, C * P * P]),
        ),
        Mistake(
            "a flattened patch holds P * P pixels in each of the C channels: d = C * P * P.",
            lambda C, h, w, P: torch.tensor([(h // P) * (w // P), P * P]),
        ),
        Mistake(
            "N assumes a square image; count the rows of patches times the columns of patches, "
            "(height / P) * (width / P).",
            lambda C, h, w, P: torch.tensor([(h // P) ** 2, C * P * P]),
        ),
        Mistake(
            "N and d are swapped: return [N, d], the number of tokens first.",
            lambda C, h, w, P: torch.tensor([C * P * P, (h // P) * (w // P)]),
        ),
    ],
)
def patch_count(C: int, height: int, width: int, P: int) -> Tensor:
    N = (height // P) * (width // P)  # rows of patches times columns of patches
    d = C * P * P  # vec of a (C, P, P) patch
    return torch.tensor([N, d])


# ---------------------------------------------------------------------------------------------------
# 2. Prepend the class token, then add the learned positions (Dosovitskiy et al. eq. 1)


def _cls_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, Tensor]:
    B, N, D = ((2, 4, 6), (3, 9, 8), (1, 16, 4))[trial % 3]
    return randn(gen, B, N, D), randn(gen, D), randn(gen, N + 1, D)  # X_p, x_cls, E


def _prepend(X_p: Tensor, x_cls: Tensor) -> Tensor:
    return torch.cat([x_cls.expand(X_p.shape[0], 1, -1), X_p], dim=1)  # (B, 1 + N, D)


@exercise(
    name="vision.cls_and_positions",
    prompt=(
        "X_p (B, N, D) holds the patch embeddings, x_cls (D,) the learned class token and E (N+1, D) "
        "the learned positions. Return X0 (B, N+1, D): the class token first in every sequence, then "
        "the N patches, plus E (row 0 of E is the class token's position)."
    ),
    make_inputs=_cls_inputs,
    mistakes=[
        Mistake(
            "the class token is appended at the end; it goes first (row 0), before the patches.",
            lambda X_p, x_cls, E: torch.cat([X_p, x_cls.expand(X_p.shape[0], 1, -1)], dim=1) + E,
        ),
        Mistake(
            "the positions were added before the class token was prepended, so the class token has "
            "no position: prepend first, then add all N+1 rows of E.",
            lambda X_p, x_cls, E: _prepend(X_p + E[1:], x_cls),
        ),
        Mistake(
            "the positions were added before the class token was prepended, with rows 0..N-1 of E: "
            "the class token has no position and every patch has the position of the token before "
            "it. Prepend first, then add all N+1 rows.",
            lambda X_p, x_cls, E: _prepend(X_p + E[:-1], x_cls),
        ),
    ],
)
def cls_and_positions(X_p: Tensor, x_cls: Tensor, E: Tensor) -> Tensor:
    B = X_p.shape[0]
    X = torch.cat([x_cls.expand(B, 1, -1), X_p], dim=1)  # (B, 1 + N, D), class token at n = 0
    return X + E  # (B, 1 + N, D) + (1 + N, D): every token gets its position, the class token too


# ---------------------------------------------------------------------------------------------------
# 3. Mean pooling over the patch tokens (Turner sec. 4.2; the package's ViT with pool="mean")


def _pool_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor]:
    B, N, D = ((2, 4, 6), (3, 9, 5), (4, 16, 8))[trial % 3]
    X = randn(gen, B, 1 + N, D)  # (B, 1 + N, D)
    X[:, 0] += 3.0  # the class token's row differs clearly from the patch rows
    return (X,)


@exercise(
    name="vision.mean_pool",
    prompt=(
        "X (B, 1+N, D) is the output of a ViT's last layer: the class token in row 0, then N patch "
        "tokens. Return h (B, D), the average of the N patch tokens (the class token left out)."
    ),
    make_inputs=_pool_inputs,
    mistakes=[
        Mistake(
            "the class token is included in the average; average rows 1..N only (X[:, 1:]).",
            lambda X: X.mean(dim=1),
        ),
        Mistake(
            "the average is over the features of each token; average over the tokens (dim=1) to get "
            "one D-vector per image.",
            lambda X: X[:, 1:].mean(dim=-1),
        ),
        Mistake(
            "you summed the patch tokens (Turner writes h as a sum); divide by N for the mean, as the "
            "ViT paper's global average pooling and the package's pool='mean' do.",
            lambda X: X[:, 1:].sum(dim=1),
        ),
        Mistake(
            "you returned the class token's output; mean pooling averages the patch tokens instead.",
            lambda X: X[:, 0],
        ),
    ],
)
def mean_pool(X: Tensor) -> Tensor:
    return X[:, 1:].mean(dim=1)  # (B, N, D) -> (B, D): patch tokens only


# ---------------------------------------------------------------------------------------------------
# 4. A shift augmentation by padding and cropping


def _shift_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, int]:
    B, C, H, W, p = ((4, 1, 8, 8, 1), (3, 2, 6, 7, 2), (5, 1, 5, 9, 2))[trial % 3]
    images = 0.1 + torch.rand(B, C, H, W, generator=gen, dtype=torch.float64)  # no zero pixels
    shifts = torch.randint(-p, p + 1, (B, 2), generator=gen)  # (B, 2): [dy, dx] per image
    shifts[0] = torch.tensor([p, -p])  # distinct shifts, both axes used, so every mistake shows
    shifts[1] = torch.tensor([-p, 0])
    return images, shifts, p


def _crop(images: Tensor, shifts: Tensor, p: int, sign: int = 1, swap: bool = False) -> Tensor:
    H, W = images.shape[-2:]
    padded = F.pad(images, (p, p, p, p))  # (B, C, H + 2p, W + 2p), zeros around
    out = []
    for b in range(images.shape[0]):
        dy, dx = (int(s) for s in shifts[b])
        if swap:
            dy, dx = dx, dy
        top, left = p - sign * dy, p - sign * dx
        out.append(padded[b, :, top : top + H, left : left + W])  # (C, H, W)
    return torch.stack(out)


@exercise(
    name="vision.shift_images",
    prompt=(
        "Shift image b of images (B, C, H, W) by shifts[b] = [dy, dx] pixels (down and right; "
        "|dy|, |dx| <= max_shift), filling the uncovered border with zeros: pad every side with "
        "max_shift zeros, then crop an H x W window. Return (B, C, H, W)."
    ),
    make_inputs=_shift_inputs,
    mistakes=[
        Mistake(
            "the content moves the wrong way: a positive dy must move the image down, so crop from row "
            "max_shift - dy (and column max_shift - dx).",
            lambda x, s, p: _crop(x, s, p, sign=-1),
        ),
        Mistake(
            "dy and dx are swapped: shifts[b, 0] moves rows (down), shifts[b, 1] moves columns (right).",
            lambda x, s, p: _crop(x, s, p, swap=True),
        ),
        Mistake(
            "pixels wrap around the border (torch.roll); the augmentation fills the uncovered border "
            "with zeros: pad, then crop.",
            lambda x, s, p: torch.stack(
                [
                    torch.roll(x[b], (int(s[b, 0]), int(s[b, 1])), dims=(-2, -1))
                    for b in range(len(x))
                ]
            ),
        ),
        Mistake(
            "every image got the first image's shift; image b moves by its own shifts[b].",
            lambda x, s, p: _crop(x, s[:1].expand(len(x), 2), p),
        ),
    ],
)
def shift_images(images: Tensor, shifts: Tensor, max_shift: int) -> Tensor:
    B, _, H, W = images.shape  # (B, C, H, W)
    p = max_shift
    padded = F.pad(images, (p, p, p, p))  # (B, C, H + 2p, W + 2p), zeros around
    out = torch.empty_like(images)
    for b in range(B):
        dy, dx = int(shifts[b, 0]), int(shifts[b, 1])
        top, left = p - dy, p - dx  # out[i, j] = images[i - dy, j - dx]
        out[b] = padded[b, :, top : top + H, left : left + W]  # (C, H, W)
    return out
