"""Masked auto-encoders for images: hide most patches, encode the rest, reconstruct the hidden pixels.

Chapter: *Masked models*, section *Masked auto-encoders for images* (He et al. 2022; Turner 2023
sec. 4.3). Each image's ``N`` patches are shuffled by a seeded random permutation and only the first
``N_vis = floor((1 - rho) N)`` are kept (:func:`random_patch_mask`, book eq. ``eq-mae-mask``). The
encoder, a :class:`.vision.ViT` whose patch map, positions and blocks are reused as they are, reads
only those ``N_vis`` patches (book eq. ``eq-mae-enc``); a narrower and shallower decoder receives the
``N_vis`` encoded tokens plus one learned mask token at each hidden position, adds its own positions
and predicts the pixels of every patch; the loss is the mean squared error over the hidden patches
alone (book eq. ``eq-mae-loss``). After pre-training the decoder is thrown away and
:func:`linear_probe` fits a linear classifier on the frozen encoder's mean-pooled features.

:data:`MAE_DIGITS_RECIPE` pre-trains on the training half of scikit-learn's digits with the same
number of optimiser steps and images per step as the supervised :data:`.vision.DIGITS_RECIPE`;
``bench/mae_digits.py`` compares the two over paired seeds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..block import PreNormBlock, TransformerStack
from ..data import digits_split, random_affine
from ..language_models import gpt2_init
from ..runtime import eval_mode, reusable_run
from ..tokens import patchify, unpatchify
from ..train import History, Recipe, TrainConfig, train
from ..vision import ViT, ViTConfig

__all__ = [
    "DIGITS_ENCODER",
    "MAE",
    "MAE_DIGITS_RECIPE",
    "MAEConfig",
    "MAERecipe",
    "MAERun",
    "PatchMask",
    "ProbeResult",
    "encoder_features",
    "fit_linear_probe",
    "linear_probe",
    "mae_loss",
    "patch_targets",
    "random_patch_mask",
    "train_mae_digits",
]


class PatchMask(NamedTuple):
    """Which patches each image keeps: ``keep (B, N_vis)`` the kept patch indices in the order the
    permutation drew them, ``mask (B, N)`` ``True`` where a patch is hidden, ``restore (B, N)`` the
    inverse permutation (entry ``n`` says where patch ``n`` sits in the shuffled order)."""

    keep: Tensor
    mask: Tensor
    restore: Tensor


def n_kept(n_patches: int, mask_ratio: float) -> int:
    """``N_vis = floor((1 - rho) N)``, the number of patches an image keeps (He et al.'s rounding).

    Raises:
        ValueError: ``mask_ratio`` outside (0, 1), or a ratio so high that no patch is kept.
    """
    if not 0.0 < mask_ratio < 1.0:
        raise ValueError(
            f"mask_ratio (rho) must lie strictly between 0 and 1 (the share of patches hidden), got "
            f"{mask_ratio}"
        )
    N_vis = int(n_patches * (1.0 - mask_ratio))
    if N_vis < 1:
        raise ValueError(
            f"mask_ratio={mask_ratio} keeps floor((1 - rho) N) = 0 of N={n_patches} patches; lower it "
            f"to at most {1 - 1 / n_patches:.4f} so the encoder sees at least one patch"
        )
    return N_vis


def random_patch_mask(
    batch_size: int,
    n_patches: int,
    mask_ratio: float,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> PatchMask:
    r"""Draw an independent random mask for each of ``batch_size`` images of ``n_patches`` patches.

    Implements: eq-mae-mask

    Image ``i``'s permutation :math:`\operatorname{perm}_i` is the argsort of ``N`` uniform numbers,
    its inverse ``restore`` the argsort of the permutation (each number's rank). The first
    :math:`N_\text{vis} = \lfloor (1 - \rho) N \rfloor` are kept, the rest hidden: :math:`m_{i,n} = 1`
    iff :math:`n \notin \{\operatorname{perm}_i(1), \dots, \operatorname{perm}_i(N_\text{vis})\}`.
    The numbers are drawn on the CPU from ``generator``, so a seed gives the same masks everywhere.

    Raises:
        ValueError: ``mask_ratio`` outside (0, 1), or one that keeps no patch.
    """
    N_vis = n_kept(n_patches, mask_ratio)
    noise = torch.rand(batch_size, n_patches, generator=generator)  # (B, N)
    shuffle = noise.argsort(dim=1)  # perm_i: patch index at each shuffled place, (B, N)
    restore = shuffle.argsort(dim=1)  # perm_i^{-1}: each patch's place (its number's rank)
    mask = restore >= N_vis  # hidden iff the patch's place is beyond the first N_vis, (B, N)
    return PatchMask(shuffle[:, :N_vis].to(device), mask.to(device), restore.to(device))


def patch_targets(images: Tensor, patch_size: int, normalize: bool = False) -> Tensor:
    r"""The pixels each patch must be reconstructed to, ``(B, N, C P^2)``; with ``normalize`` each
    patch is standardised by its own mean and variance, :math:`(\mathbf{p} - \mu) /
    \sqrt{\sigma^2 + 10^{-6}}` (He et al.'s variant; off in :data:`MAE_DIGITS_RECIPE`). As in their
    code, :math:`\sigma^2` is the unbiased variance, the squared deviations divided by
    :math:`C P^2 - 1`."""
    target = patchify(images, patch_size)  # (B, N, C P^2)
    if normalize:
        mean = target.mean(dim=-1, keepdim=True)
        var = target.var(dim=-1, keepdim=True)  # unbiased, as in He et al.'s code
        target = (target - mean) / (var + 1e-6).sqrt()
    return target


def mae_loss(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Mean squared error over the hidden patches only: each patch's squared error averaged over its
    ``C P^2`` pixels, then averaged over the patches where ``mask (B, N)`` is ``True``.

    Implements: eq-mae-loss

    Raises:
        ValueError: shapes that do not match, or a mask that hides no patch.
    """
    if pred.shape != target.shape or pred.dim() != 3 or mask.shape != pred.shape[:2]:
        raise ValueError(
            f"pred and target must be (B, N, C*P*P) and mask (B, N), got {tuple(pred.shape)}, "
            f"{tuple(target.shape)} and {tuple(mask.shape)}"
        )
    m = mask.to(pred.dtype)
    if not m.sum() > 0:
        raise ValueError("the mask hides no patch, so the loss over hidden patches is undefined")
    per_patch = (pred - target).pow(2).mean(dim=-1)  # (B, N): mean over the C P^2 pixels
    return (per_patch * m).sum() / m.sum()


DIGITS_ENCODER = ViTConfig(
    patch_size=2, d_model=64, H=4, n_layers=2, dropout=0.0, pool="mean", patch_init="lecun"
)
"""The MAE's encoder for the digits: non-overlapping 2x2 patches (16), otherwise the width, depth,
heads, pooling and patch-map scale of :data:`.vision.DIGITS_RECIPE`'s ViT."""


@dataclass(frozen=True)
class MAEConfig:
    """A masked auto-encoder: the encoder is a :class:`.vision.ViT` of ``encoder``'s sizes (its
    classification head is unused while pre-training); the decoder has ``decoder_layers`` pre-norm
    blocks of width ``decoder_d_model`` with ``decoder_H`` heads. ``norm_targets`` standardises each
    target patch (He et al.'s normalised-pixel loss)."""

    encoder: ViTConfig = DIGITS_ENCODER
    mask_ratio: float = 0.75
    decoder_d_model: int = 32
    decoder_H: int = 2
    decoder_layers: int = 1
    norm_targets: bool = False

    def __post_init__(self) -> None:
        e = self.encoder
        if e.patch_stride is not None and e.patch_stride != e.patch_size:
            raise ValueError(
                f"an MAE needs non-overlapping patches (patch_stride None), got patch_size="
                f"{e.patch_size}, patch_stride={e.patch_stride}: overlapping patches would show "
                "the encoder pixels of the patches it must reconstruct"
            )
        if e.pool != "mean":
            raise ValueError(
                f"the MAE encoder pools the mean of its patch tokens; got pool={e.pool!r}"
            )
        n_kept(e.n_patches, self.mask_ratio)  # ratio in (0, 1) that keeps at least one patch
        if self.decoder_d_model % self.decoder_H:
            raise ValueError(
                f"decoder_d_model={self.decoder_d_model} is not divisible by decoder_H={self.decoder_H}"
            )


class MAE(nn.Module):
    r"""Masked auto-encoder (He et al. 2022): a ViT encoder over the kept patches only, a light
    decoder over all positions with a learned mask token at the hidden ones, a linear map to pixels.

    ``forward(images, patch_mask) -> pred (B, N, C P^2)``: the predicted pixels of every patch (only
    the hidden ones are scored by :func:`mae_loss`).
    """

    def __init__(self, config: MAEConfig) -> None:
        super().__init__()
        c = self.config = config
        e = c.encoder
        self.encoder = ViT(e)  # its own initialisation (GPT-2's, the patch map at LeCun's scale)
        self.to_decoder = nn.Linear(e.d_model, c.decoder_d_model)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, c.decoder_d_model))
        self.decoder_pos = nn.Parameter(torch.zeros(1, e.n_patches, c.decoder_d_model))
        self.decoder = TransformerStack(
            PreNormBlock, c.decoder_layers, c.decoder_d_model, c.decoder_H, activation="gelu"
        )
        self.to_pixels = nn.Linear(c.decoder_d_model, e.channels * e.patch_size**2)
        for module in (self.to_decoder, self.decoder, self.to_pixels):
            module.apply(gpt2_init)
        nn.init.normal_(self.mask_token, std=0.02)
        nn.init.normal_(self.decoder_pos, std=0.02)

    def _check(self, images: Tensor) -> None:
        e = self.config.encoder
        if images.dim() != 4 or images.shape[1:] != (e.channels, e.image_size, e.image_size):
            raise ValueError(
                f"images must be (B, {e.channels}, {e.image_size}, {e.image_size}) for this MAE, got "
                f"{tuple(images.shape)}"
            )

    def mask(self, images: Tensor, generator: torch.Generator | None = None) -> PatchMask:
        """A fresh random mask for ``images`` at the configured ratio (:func:`random_patch_mask`)."""
        n = self.config.encoder.n_patches
        return random_patch_mask(len(images), n, self.config.mask_ratio, generator, images.device)

    def encode(self, images: Tensor, keep: Tensor) -> Tensor:
        r"""The encoder's output for the kept patches only, ``(B, N_vis, D)``: :math:`Z = \mathrm{LN}(
        \text{blocks}(P_{\mathcal{S}} W_p^\top + \mathbf{b}_p + R_{\mathcal{S}}))`, the kept patches
        gathered **before** the patch map, so hidden pixels never enter the encoder.
        Implements: eq-mae-enc
        """
        self._check(images)
        vit = self.encoder
        patches = patchify(images, self.config.encoder.patch_size)  # (B, N, C P^2)
        index = keep[..., None]  # (B, N_vis, 1)
        kept = patches.gather(1, index.expand(-1, -1, patches.shape[-1]))  # (B, N_vis, C P^2)
        R = vit.pos.table.weight[keep]  # the kept patches' learned positions, (B, N_vis, D)
        X = vit.drop(vit.patch.proj(kept) + R)  # (B, N_vis, D)
        return vit.stack(X)  # LN(X^(L)) of the N_vis visible tokens

    def decode(self, Z: Tensor, restore: Tensor) -> Tensor:
        """Pixels of every patch ``(B, N, C P^2)`` from the kept tokens ``Z (B, N_vis, D)``: mask
        tokens at the hidden places, every token back at its patch (``restore``), R_dec, blocks, W_pix.
        Implements: eq-mae-dec-in, eq-mae-dec
        """
        B, N_vis, _ = Z.shape
        N, Dd = restore.shape[1], self.config.decoder_d_model
        Y = self.to_decoder(Z)  # (B, N_vis, D_dec)
        # the shuffled order: the kept tokens first, then a mask token for each hidden patch
        Y = torch.cat([Y, self.mask_token.expand(B, N - N_vis, Dd)], dim=1)  # (B, N, D_dec)
        Y = Y.gather(1, restore[..., None].expand(-1, -1, Dd))  # back to patch order
        return self.to_pixels(self.decoder(Y + self.decoder_pos))  # (B, N, C P^2)

    def forward(self, images: Tensor, patch_mask: PatchMask) -> Tensor:
        return self.decode(self.encode(images, patch_mask.keep), patch_mask.restore)

    def loss(self, images: Tensor, patch_mask: PatchMask) -> Tensor:
        """:func:`mae_loss` of this model's reconstruction of ``images`` under ``patch_mask``."""
        e = self.config.encoder
        target = patch_targets(images, e.patch_size, self.config.norm_targets)
        return mae_loss(self(images, patch_mask), target, patch_mask.mask)

    def reconstruct(
        self, images: Tensor, patch_mask: PatchMask, fill: float = 0.0
    ) -> tuple[Tensor, Tensor]:
        """``(masked input, reconstruction)`` as images: the hidden patches set to ``fill`` (``nan``
        lets a figure colour them apart), and the visible patches kept with the predicted pixels
        pasted into the hidden ones (for figures; with ``norm_targets`` the prediction is in
        normalised units)."""
        e = self.config.encoder
        patches = patchify(images, e.patch_size)
        hidden = patch_mask.mask[..., None]  # (B, N, 1)
        with eval_mode(self):
            pred = self(images, patch_mask)
        shown = patches.masked_fill(hidden, fill)
        mixed = torch.where(hidden, pred, patches)
        size = (e.image_size, e.image_size)
        return (
            unpatchify(shown, e.patch_size, size, e.channels),
            unpatchify(mixed, e.patch_size, size, e.channels),
        )


# ---------------------------------------------------------------------------------------------------
# Pre-training on the digits, then a linear probe


@dataclass(frozen=True)
class MAERecipe(Recipe):
    """How to pre-train an :class:`MAE` on the training half of the digits (no labels used);
    ``augment`` is ``(degrees, zoom, shift)`` of :func:`.data.random_affine` or ``None``."""

    model: MAEConfig = MAEConfig()
    augment: tuple[float, float, float] | None = None


MAE_DIGITS_RECIPE = MAERecipe(
    model=MAEConfig(),
    train=TrainConfig(
        max_steps=1800, lr=3e-3, warmup_steps=60, weight_decay=0.05, eval_interval=600,
        betas=(0.9, 0.95), time_budget_s=None,
    ),
    batch_size=128,
)  # fmt: skip
"""The digits MAE: 2x2 patches (16 per image), 75% of them hidden (4 kept), an encoder of the same
width and depth as :data:`.vision.DIGITS_RECIPE`'s ViT (two blocks of width 64), a decoder of one block
of width 32, plain pixel targets; no augmentation (the random masks are the only noise: with the
supervised recipe's rotations and zooms the reconstruction of the unaugmented test digits was worse
than the mean training image in a trial run); AdamW with He et al.'s betas and the supervised recipe's
schedule: 1,800 steps of 128 images, the same budget as the ViT's (``bench/mae_digits.py`` shortens
both to the same number of steps)."""


@dataclass
class MAERun:
    """A pre-trained MAE and its history (``test_loss``: the masked loss on the test images)."""

    model: MAE
    history: History


@reusable_run  # a page that repeats the chapter's run with the same arguments trains it once
def train_mae_digits(
    recipe: MAERecipe = MAE_DIGITS_RECIPE,
    device: torch.device | str = "cpu",
    seed: int = 0,
    steps: int | None = None,
    progress: bool = False,
) -> MAERun:
    """Pre-train an :class:`MAE` on the digits' training images with ``recipe`` through the course's
    one loop (:func:`.train.train`); ``steps`` shortens it. ``seed`` sets the initialisation, the
    batches, the augmentations and the masks. Every evaluation scores the test images under one fixed
    mask (seed 0), so the figures are comparable across steps and seeds."""
    recipe = recipe.with_steps(steps)
    torch.manual_seed(seed)
    X_train, _, X_test, _ = digits_split()
    X_train, X_test = X_train.to(device), X_test.to(device)
    model = MAE(recipe.model).to(device)
    B = recipe.batch_size
    test_mask = model.mask(X_test, torch.Generator().manual_seed(0))

    def next_batch(g: torch.Generator) -> tuple[Tensor, PatchMask]:
        i = torch.randint(0, len(X_train), (B,), generator=g).to(device)
        images = X_train[i]
        if recipe.augment is not None:
            images = random_affine(images, *recipe.augment, generator=g)
        return images, model.mask(images, g)

    def loss_fn(m: MAE, batch: tuple[Tensor, PatchMask]) -> Tensor:
        return m.loss(*batch)

    def evaluate(m: MAE) -> dict[str, float]:
        return {"test_loss": m.loss(X_test, test_mask).item()}

    cfg = dataclasses.replace(recipe.train, seed=seed)
    history = train(model, next_batch, loss_fn, cfg, evaluate, progress=progress)
    return MAERun(model, history)


def encoder_features(encoder: ViT, images: Tensor) -> Tensor:
    r"""The frozen encoder's feature of each image, ``(B, D)``: the mean over **all** ``N`` patch
    tokens of :math:`\mathrm{LN}(X^{(L)})` (no mask at probe time), without the ViT's head. The same
    feature for an MAE's encoder and for a supervised mean-pooled ViT."""
    if encoder.cls is not None:
        raise ValueError(
            "encoder_features pools the patch tokens' mean; pass a ViT with pool='mean'"
        )
    with eval_mode(encoder):
        return encoder.stack(encoder.tokens(images)).mean(dim=1)


@dataclass
class ProbeResult:
    """A linear probe: its test and training accuracies and the fitted map ``(W (n_classes, D), b)``."""

    test_accuracy: float
    train_accuracy: float
    W: Tensor
    b: Tensor


def linear_probe(
    encoder: ViT | None,
    data: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
    l2: float = 1e-3,
    max_iter: int = 500,
) -> ProbeResult:
    """Freeze ``encoder`` and fit a linear classifier on its :func:`encoder_features` of the digits'
    training half (``data``: ``digits_split()`` by default); report the test half's accuracy.
    ``encoder=None`` probes the raw flattened pixels instead (the baseline without any encoder).
    See :func:`fit_linear_probe` for the classifier."""
    X_train, y_train, X_test, y_test = digits_split() if data is None else data
    if encoder is None:
        f_train, f_test = X_train.flatten(1), X_test.flatten(1)
    else:
        device = next(encoder.parameters()).device
        f_train = encoder_features(encoder, X_train.to(device))
        f_test = encoder_features(encoder, X_test.to(device))
    return fit_linear_probe(f_train, y_train, f_test, y_test, l2, max_iter)


def fit_linear_probe(
    features_train: Tensor,
    y_train: Tensor,
    features_test: Tensor,
    y_test: Tensor,
    l2: float = 1e-3,
    max_iter: int = 500,
) -> ProbeResult:
    r"""Fit a multinomial logistic regression on frozen features and report its accuracies.

    The features are standardised with the training set's mean and standard deviation (He et al.
    put a BatchNorm without affine parameters before the probe for the same reason), then
    :math:`\min_{W, \mathbf{b}}\ \frac1n\sum_i \mathrm{CE}(W\mathbf{f}_i + \mathbf{b}, y_i) +
    \frac{\lambda}{2}\lVert W\rVert^2` is solved in float64 by L-BFGS from zero (a convex problem:
    no seed matters). ``l2`` is :math:`\lambda`, fixed in advance and not tuned on the test set.
    :func:`linear_probe` passes an encoder's features, or flattened pixels for the raw baseline.

    Raises:
        ValueError: features and labels of different lengths or feature widths that differ.
    """
    if features_train.dim() != 2 or features_test.dim() != 2:
        raise ValueError("features must be (n, D) matrices; flatten images with .flatten(1)")
    if len(features_train) != len(y_train) or len(features_test) != len(y_test):
        raise ValueError("each feature row needs one label: lengths of features and labels differ")
    if features_train.shape[1] != features_test.shape[1]:
        raise ValueError(
            f"train and test features differ in width: {features_train.shape[1]} and "
            f"{features_test.shape[1]}"
        )
    F_tr = features_train.detach().double().cpu()
    F_te = features_test.detach().double().cpu()
    y_tr, y_te = y_train.cpu(), y_test.cpu()
    mu, sd = F_tr.mean(dim=0), F_tr.std(dim=0).clamp_min(1e-8)
    F_tr, F_te = (F_tr - mu) / sd, (F_te - mu) / sd
    n_classes = int(max(y_tr.max(), y_te.max())) + 1
    W = torch.zeros(n_classes, F_tr.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([W, b], max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(F_tr @ W.T + b, y_tr) + 0.5 * l2 * W.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        acc_tr = ((F_tr @ W.T + b).argmax(-1) == y_tr).double().mean().item()
        acc_te = ((F_te @ W.T + b).argmax(-1) == y_te).double().mean().item()
    return ProbeResult(acc_te, acc_tr, W.detach(), b.detach())
