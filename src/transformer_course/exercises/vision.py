"""Exercises of the *Vision transformers* lab: counting patches, the class token and the learned
positions, mean pooling over the patch tokens, a shift augmentation by padding and cropping, and a
whole ViT assembled from the package's blocks (checked with a package ViT's weights loaded into it).

Chapter: *Vision transformers* (Turner 2023 sec. 4.2, fig. 2 and footnote 19; MIT 6.390 sec. 9.5.1;
Dosovitskiy et al. 2021, eq. 1). Inputs are float64 (integers for the counting exercise) so the
checkers can compare exactly; the class token's row is offset from the patch rows so that every
wrong way of pooling gives different numbers.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import block, position, tokens
from ..vision import ViT, ViTConfig
from . import _REGISTRY, ClassExercise, Exercise, Feedback, Mistake, exercise, randn

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
    return randn(gen, B, N, D), randn(gen, D), randn(gen, N + 1, D)  # X_p, x_cls, R


def _prepend(X_p: Tensor, x_cls: Tensor) -> Tensor:
    return torch.cat([x_cls.expand(X_p.shape[0], 1, -1), X_p], dim=1)  # (B, 1 + N, D)


@exercise(
    name="vision.cls_and_positions",
    prompt=(
        "X_p (B, N, D) holds the patch embeddings, x_cls (D,) the learned class token and R (N+1, D) "
        "the learned positions. Return X0 (B, N+1, D): the class token first in every sequence, then "
        "the N patches, plus R (row 0 of R is the class token's position)."
    ),
    make_inputs=_cls_inputs,
    mistakes=[
        Mistake(
            "the class token is appended at the end; it goes first (row 0), before the patches.",
            lambda X_p, x_cls, R: torch.cat([X_p, x_cls.expand(X_p.shape[0], 1, -1)], dim=1) + R,
        ),
        Mistake(
            "the positions were added before the class token was prepended, so the class token has "
            "no position: prepend first, then add all N+1 rows of R.",
            lambda X_p, x_cls, R: _prepend(X_p + R[1:], x_cls),
        ),
        Mistake(
            "the positions were added before the class token was prepended, with rows 0..N-1 of R: "
            "the class token has no position and every patch has the position of the token before "
            "it. Prepend first, then add all N+1 rows.",
            lambda X_p, x_cls, R: _prepend(X_p + R[:-1], x_cls),
        ),
    ],
)
def cls_and_positions(X_p: Tensor, x_cls: Tensor, R: Tensor) -> Tensor:
    B = X_p.shape[0]
    X = torch.cat([x_cls.expand(B, 1, -1), X_p], dim=1)  # (B, 1 + N, D), class token at n = 0
    return X + R  # (B, 1 + N, D) + (1 + N, D): every token gets its position, the class token too


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
    B, C, H_px, W_px, p = ((4, 1, 8, 8, 1), (3, 2, 6, 7, 2), (5, 1, 5, 9, 2))[trial % 3]
    images = 0.1 + torch.rand(B, C, H_px, W_px, generator=gen, dtype=torch.float64)  # no zero pixel
    shifts = torch.randint(-p, p + 1, (B, 2), generator=gen)  # (B, 2): [dy, dx] per image
    shifts[0] = torch.tensor([p, -p])  # distinct shifts, both axes used, so every mistake shows
    shifts[1] = torch.tensor([-p, 0])
    return images, shifts, p


def _crop(images: Tensor, shifts: Tensor, p: int, sign: int = 1, swap: bool = False) -> Tensor:
    H_px, W_px = images.shape[-2:]
    padded = F.pad(images, (p, p, p, p))  # (B, C, H_px + 2p, W_px + 2p), zeros around
    out = []
    for b in range(images.shape[0]):
        dy, dx = (int(s) for s in shifts[b])
        if swap:
            dy, dx = dx, dy
        top, left = p - sign * dy, p - sign * dx
        out.append(padded[b, :, top : top + H_px, left : left + W_px])  # (C, H_px, W_px)
    return torch.stack(out)


@exercise(
    name="vision.shift_images",
    prompt=(
        "Shift image b of images (B, C, H_px, W_px) by shifts[b] = [dy, dx] pixels (down and right; "
        "|dy|, |dx| <= max_shift), filling the uncovered border with zeros: pad every side with "
        "max_shift zeros, then crop an H_px x W_px window. Return (B, C, H_px, W_px)."
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
    B, _, H_px, W_px = images.shape  # (B, C, H_px, W_px)
    p = max_shift
    padded = F.pad(images, (p, p, p, p))  # (B, C, H_px + 2p, W_px + 2p), zeros around
    out = torch.empty_like(images)
    for b in range(B):
        dy, dx = int(shifts[b, 0]), int(shifts[b, 1])
        top, left = p - dy, p - dx  # out[i, j] = images[i - dy, j - dx]
        out[b] = padded[b, :, top : top + H_px, left : left + W_px]  # (C, H_px, W_px)
    return out


# ---------------------------------------------------------------------------------------------------
# 5. Assemble a ViT from the package's blocks (Dosovitskiy et al. eq. 1-4; the book's eq. eq-vit)
#
# The learner writes a class VisionTransformer(config) with the package ViT's submodule names (patch,
# cls, pos, stack, head). As in the multi-head layer exercise (multihead.LayerExercise), the checker
# builds it, loads the weights of a seeded package ViT into it by those names (here the names are the
# package's own, so its state_dict loads as it is), runs both on the same images and compares the
# logits. Each typical mistake is a small subclass of the reference solution that changes one thing,
# run with the same weights; the first one whose logits equal the learner's names what is wrong.

# (image_size, P, C_in, D, H, L, classes) per trial: grids of 4 x 4, 2 x 2 and 3 x 3 patches
_VIT_SIZES = ((8, 2, 2, 8, 2, 1, 10), (8, 4, 3, 12, 3, 2, 5), (6, 2, 3, 8, 4, 2, 7))


def _vit_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, ViT]:
    """Images (B, C_in, size, size) and a package ViT (class token) with seeded weights, in float64.

    The package initialises with N(0, 0.02^2) and a zero class token, under which many wrong models
    give almost the same logits. Here every matrix is drawn N(0, 1/fan_in), biases and LayerNorm
    shifts N(0, 0.2^2), the class token N(0, 0.5^2), LayerNorm gains 1 + N(0, 0.2^2) and the position
    table N(0, 1), so every mistake below changes the logits clearly (tests/test_vision.py proves it).
    """
    size, P, C, D, H, L, K = _VIT_SIZES[trial % 3]
    config = ViTConfig(
        image_size=size, patch_size=P, channels=C, n_classes=K, d_model=D, H=H, n_layers=L,
        dropout=0.0, pool="cls",
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):  # the default initialisation is overwritten below
        vit = ViT(config).double().eval().requires_grad_(False)
    for name, p in vit.named_parameters():
        if name == "pos.table.weight":
            p.copy_(randn(gen, *p.shape))
        elif name == "cls":
            p.copy_(0.5 * randn(gen, *p.shape))
        elif p.dim() == 2:
            p.copy_(randn(gen, *p.shape) / math.sqrt(p.shape[1]))
        elif "norm" in name and name.endswith("weight"):
            p.copy_(1 + 0.2 * randn(gen, *p.shape))
        else:
            p.copy_(0.2 * randn(gen, *p.shape))
    return randn(gen, 3, C, size, size), vit


class VisionTransformer(nn.Module):
    def __init__(self, config):
        super().__init__()
        c = self.config = config
        self.patch = tokens.PatchEmbedding(c.patch_size, c.channels, c.d_model)  # vec(patch) -> D
        self.cls = nn.Parameter(torch.zeros(1, 1, c.d_model))  # the class token
        self.pos = position.LearnedPositionalEmbedding(c.n_patches + 1, c.d_model)  # R: 1 + N rows
        self.stack = block.TransformerStack(
            block.PreNormBlock, c.n_layers, c.d_model, c.H, activation="gelu"
        )  # L pre-norm blocks and the final LayerNorm
        self.head = nn.Linear(c.d_model, c.n_classes)

    def forward(self, images):  # (B, C_in, H_px, W_px) -> logits (B, n_classes)
        X = self.patch(images)  # (B, N, D), patches in row-major order
        X = torch.cat([self.cls.expand(len(X), 1, -1), X], dim=1)  # class token first, (B, 1+N, D)
        X = self.pos(X)  # + R, row 0 for the class token
        X = self.stack(X)  # L pre-norm blocks, then the final LayerNorm
        return self.head(X[:, 0])  # the class token's row: x_pool -> z


class _ViT(VisionTransformer):
    """Wrong ViTs: the reference's parameters, and one class attribute per mistake."""

    cls_at = "front"  # "end": the class token appended after the patches
    positions = "after_cls"  # "before_cls": R[:N] added to the patches only; "none"
    grid = "rows"  # "columns": patches taken column by column (the patch grid transposed)
    channels_last = False  # each patch flattened in (P, P, C) order instead of (C, P, P)
    final_norm = True  # False: the blocks without the stack's final LayerNorm
    causal = False  # every token sees only the tokens before it
    activation = "gelu"
    pool = "cls"  # "mean_patches", "last", "head_then_mean" (== the mean of all 1 + N rows)
    softmax = False  # probabilities returned instead of logits

    def forward(self, images):
        c = self.config
        B, g, P = len(images), c.image_size // c.patch_size, c.patch_size
        if self.channels_last:
            x = images.reshape(B, c.channels, g, P, g, P).permute(0, 2, 4, 3, 5, 1)
            pixels = x.reshape(B, g * g, -1)  # (B, N, P*P*C)
        else:
            pixels = tokens.patchify(images, P)  # (B, N, C*P*P), row-major grid
        if self.grid == "columns":
            pixels = pixels.reshape(B, g, g, -1).transpose(1, 2).reshape(B, g * g, -1)
        X = self.patch.proj(pixels)  # (B, N, D)
        if self.positions == "before_cls":
            X = self.pos(X)  # rows 0..N-1 of R on the patches, the class token gets none
        cls = self.cls.expand(B, 1, -1)
        X = torch.cat([X, cls] if self.cls_at == "end" else [cls, X], dim=1)
        if self.positions == "after_cls":
            X = self.pos(X)
        blocks = self.stack.blocks
        if self.activation != "gelu" or self.causal:  # the same weights in blocks built otherwise
            blocks = [
                block.PreNormBlock(c.d_model, c.H, activation=self.activation, causal=self.causal)
                for _ in blocks
            ]
            for new, old in zip(blocks, self.stack.blocks, strict=True):
                new.to(X.dtype).eval().load_state_dict(old.state_dict())
        for blk in blocks:
            X = blk(X)
        if self.final_norm:
            X = self.stack.final_norm(X)
        if self.pool == "head_then_mean":
            return self.head(X).mean(dim=1)
        row = {
            "cls": lambda: X[:, -1] if self.cls_at == "end" else X[:, 0],
            "mean_patches": lambda: X[:, 1:].mean(dim=1),
            "last": lambda: X[:, -1],
        }[self.pool]()
        z = self.head(row)
        return z.softmax(dim=-1) if self.softmax else z


def _wrong_vit(name: str, **attrs: Any) -> type:
    """A subclass of :class:`_ViT` with some attributes changed: one typical mistake."""
    return type(name, (_ViT,), attrs)


VIT_MISTAKES = [
    Mistake(
        "the class token is appended after the patches (torch.cat([X, cls])): it goes first, at "
        "position 0, so it gets row 0 of the position table and the classifier reads row 0.",
        _wrong_vit("ClassTokenAtTheEnd", cls_at="end"),
    ),
    Mistake(
        "the positions were added before the class token was prepended (self.pos on the N patches, "
        "then the class token): the class token has no position and every patch gets the row of the "
        "token before it. Prepend the class token first, then add all 1 + N rows of R.",
        _wrong_vit("PositionsBeforeClassToken", positions="before_cls"),
    ),
    Mistake(
        "there are no positions: add the learned table, X = self.pos(X), after the class token is "
        "prepended; without it the model cannot tell where a patch came from.",
        _wrong_vit("NoPositions", positions="none"),
    ),
    Mistake(
        "the patches are taken column by column (the grid of patches transposed): patch n is "
        "row n // g, column n % g of the g x g grid, left to right along the top row first, as "
        "tc.tokens.patchify and self.patch do.",
        _wrong_vit("TransposedPatchGrid", grid="columns"),
    ),
    Mistake(
        "each patch is flattened channel-last, in (P, P, C) order: vec(patch) is in (C, P, P) "
        "order, channel first, as tc.tokens.patchify and self.patch do (nn.Linear's columns follow "
        "that order).",
        _wrong_vit("ChannelsLastPatches", channels_last=True),
    ),
    Mistake(
        "the final LayerNorm is missing (the blocks were run one by one without "
        "self.stack.final_norm): the pre-norm stack ends with a LayerNorm, so call self.stack(X).",
        _wrong_vit("NoFinalNorm", final_norm=False),
    ),
    Mistake(
        "the stack is causal (causal=True, a GPT's decoder): a ViT's encoder lets every token, the "
        "class token first of all, attend to every patch.",
        _wrong_vit("CausalStack", causal=True),
    ),
    Mistake(
        "the blocks use ReLU, TransformerStack's default: the ViT's MLPs use GELU, "
        "TransformerStack(PreNormBlock, L, D, H, activation='gelu').",
        _wrong_vit("ReluBlocks", activation="relu"),
    ),
    Mistake(
        "the mean of the patch tokens is classified, but the config says pool='cls': classify the "
        "class token's row, X[:, 0].",
        _wrong_vit("MeanOfPatches", pool="mean_patches"),
    ),
    Mistake(
        "the head was applied to every token and the logits averaged (the same as classifying the "
        "mean of all 1 + N rows, class token included): classify the class token's row alone, "
        "self.head(X[:, 0]).",
        _wrong_vit("HeadOnEveryToken", pool="head_then_mean"),
    ),
    Mistake(
        "the last token is classified (a language model's habit): the class token is row 0, "
        "X[:, 0].",
        _wrong_vit("LastToken", pool="last"),
    ),
    Mistake(
        "you returned probabilities (a softmax of the logits): forward returns the logits z; the "
        "loss (cross-entropy) applies the softmax itself.",
        _wrong_vit("Probabilities", softmax=True),
    ),
]


class _Verdict(Exception):
    """What is wrong with an answer, found before its logits are compared."""


def _build_vit(answer: Any, vit: ViT) -> nn.Module:
    """``answer(config)`` in float64 and evaluation mode, with ``vit``'s weights loaded by name."""
    module = answer(vit.config)
    if not isinstance(module, nn.Module):
        raise _Verdict(
            f"VisionTransformer(config) built a {type(module).__name__}, not an nn.Module: subclass "
            "nn.Module and call super().__init__() first."
        )
    want = {name: p.shape for name, p in vit.named_parameters()}
    own = {name: p.shape for name, p in module.named_parameters()}
    missing = [k for k in want if k not in own]
    extra = [k for k in own if k not in want]
    if missing or extra:
        said = [f"it has no parameter {_listed(missing)}"] if missing else []
        said += [f"it has parameters the checker does not know: {_listed(extra)}"] if extra else []
        raise _Verdict(
            f"your model's parameters do not have the lab's names ({'; '.join(said)}). The checker "
            "loads the package ViT's weights by name: build self.patch (PatchEmbedding), self.cls "
            "(nn.Parameter of shape (1, 1, D)), self.pos (LearnedPositionalEmbedding with 1 + N "
            "rows), self.stack (TransformerStack of PreNormBlock) and self.head (nn.Linear(D, "
            "n_classes)), and no other parameters."
        )
    for k, shape in want.items():
        if own[k] != shape:
            raise _Verdict(f"{k} has shape {tuple(own[k])} but must be {tuple(shape)}.")
    module = module.double().eval()
    module.load_state_dict(vit.state_dict(), strict=False)  # every parameter; buffers are kept
    return module


def _listed(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names[:6]) + (" ..." if len(names) > 6 else "")


def _run_vit(answer: Any, images: Tensor, vit: ViT) -> Any:
    """The logits of the model that ``answer`` builds, with ``vit``'s weights, on ``images``."""
    module = _build_vit(answer, vit)
    with torch.no_grad():
        return module(images.clone())


def _vit_case(images: Tensor, vit: ViT) -> str:
    c = vit.config
    return (
        f"[case: images {tuple(images.shape)}, P = {c.patch_size}, N = {c.n_patches}, "
        f"D = {c.d_model}, H = {c.H}, L = {c.n_layers}, {c.n_classes} classes]"
    )


@dataclass
class ViTExercise(ClassExercise):
    """An exercise whose answer is a class: ``answer(config)`` must build an ``nn.Module`` with the
    package :class:`~transformer_course.vision.ViT`'s parameter names; it is run with a seeded ViT's
    weights on ``trials`` configurations and its logits compared with the ViT's. A difference is
    explained by the first :class:`Mistake` (a wrong class) whose logits equal the learner's, then by
    the generic diagnoses of :class:`Exercise` (wrong shape, NaN, largest error). The pattern of
    :class:`.multihead.LayerExercise`, for a whole model."""

    example: str = "VisionTransformer"

    def _check_answer(self, answer: Any) -> Feedback:
        wrong = [  # each mistake as a function of the inputs, for Exercise._compare
            Mistake(m.why, lambda x, vit, cls=m.wrong: _run_vit(cls, x, vit)) for m in self.mistakes
        ]
        compare = replace(self, mistakes=wrong)
        for trial in range(self.trials):
            images, vit = self.make_inputs(torch.Generator().manual_seed(1000 + trial), trial)
            try:
                got = _run_vit(answer, images, vit)
            except NotImplementedError:
                return self._feedback(
                    "not attempted", "replace `raise NotImplementedError` with your code."
                )
            except _Verdict as verdict:
                return self._feedback("incorrect", f"{verdict} {_vit_case(images, vit)}")
            except Exception as err:  # the learner's bug: report it, never crash the notebook
                frames = [
                    f
                    for f in traceback.extract_tb(err.__traceback__)
                    if "/torch/" not in f.filename and "/transformer_course/" not in f.filename
                ]
                where = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames else ""
                return self._feedback(
                    "error",
                    f"your model raised {type(err).__name__}: {err}{where} "
                    f"{_vit_case(images, vit)}",
                )
            with torch.no_grad():
                expected = vit(images)
            verdict = Exercise._compare(compare, got, expected, (images, vit))
            if verdict is not None:
                return self._feedback("incorrect", f"{verdict} {_vit_case(images, vit)}")
        return self._feedback(
            "correct",
            f"matches the package's ViT, its weights loaded into yours, on {self.trials} "
            "configurations.",
        )


_REGISTRY_NAME = "vision.assemble_vit"
if _REGISTRY_NAME in _REGISTRY:
    raise ValueError(f"exercise {_REGISTRY_NAME!r} is defined twice")
_REGISTRY[_REGISTRY_NAME] = ViTExercise(
    name=_REGISTRY_NAME,
    prompt=(
        "Write the class VisionTransformer(config), an nn.Module for a ViTConfig with pool='cls', "
        "from the package's blocks: self.patch = PatchEmbedding(P, C_in, D), self.cls = "
        "nn.Parameter (1, 1, D), self.pos = LearnedPositionalEmbedding(1 + N, D), self.stack = "
        "TransformerStack(PreNormBlock, L, D, H, activation='gelu'), self.head = nn.Linear(D, "
        "n_classes). forward(images (B, C_in, size, size)) embeds the patches, prepends the class "
        "token, adds the positions, runs the stack and returns the logits of the class token's row, "
        "(B, n_classes)."
    ),
    solution=VisionTransformer,
    make_inputs=_vit_inputs,
    mistakes=VIT_MISTAKES,
)
