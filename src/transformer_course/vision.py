"""Vision transformers: the ViT, its recipe for scikit-learn's digits, and the parts of that recipe.

Chapter: *Vision transformers* (Turner 2023 sec. 4.2 and fig. 2; Dosovitskiy et al. 2021; MIT 6.390 sec.
9.5.1). Images become tokens through :class:`.tokens.PatchEmbedding`; learned positions
(:mod:`.position`) and a pre-norm :class:`.block.TransformerStack` follow; a class token or the mean
of the patch tokens feeds a linear classifier.

The recipe that reaches the benchmark's target (``bench/vit_digits.py``) lives here, with each of its
parts (mixup, test-time shifts) and the ablations that leave one part out (:data:`ABLATIONS`), so the
benchmark, the book page and the tests all run the same code.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .block import PreNormBlock, TransformerStack
from .data import digits_split, random_affine
from .language_models import gpt2_init
from .position import LearnedPositionalEmbedding
from .runtime import eval_mode, reusable_run
from .tokens import PatchEmbedding
from .train import History, Recipe, TrainConfig, train

__all__ = [
    "ABLATIONS",
    "DIGITS_RECIPE",
    "DigitsRecipe",
    "DigitsRun",
    "ViT",
    "ViTConfig",
    "ablated",
    "class_token_attention",
    "mcnemar",
    "mixup",
    "position_similarity",
    "shifted_probabilities",
    "smoothed_cross_entropy",
    "train_digits",
]


@dataclass(frozen=True)
class ViTConfig:
    """Sizes of a vision transformer; ``pool`` is ``"cls"`` (a learned class token) or ``"mean"``.

    ``channels`` is ``C_in``, ``patch_size`` is ``P``, ``n_layers`` is ``L``, ``d_model`` is ``D``.

    ``patch_stride`` ``None`` cuts non-overlapping ``patch_size`` patches (the ViT's); a smaller stride
    gives overlapping patches (book eq. ``eq-vit-overlap``), e.g. ``patch_size=4, patch_stride=2``.
    ``patch_init`` is ``"gpt2"`` (the patch map drawn from N(0, 0.02^2) like every other weight) or
    ``"lecun"`` (N(0, 1 / (C P^2)), LeCun's variance; the ViT authors' code gets the same variance from
    Flax's default initialiser, which truncates the normal at two standard deviations; book eq.
    ``eq-vit-init``).
    """

    image_size: int = 8
    patch_size: int = 2
    channels: int = 1
    n_classes: int = 10
    d_model: int = 64
    H: int = 4
    n_layers: int = 4
    dropout: float = 0.1
    pool: Literal["cls", "mean"] = "cls"
    patch_stride: int | None = None
    patch_init: Literal["gpt2", "lecun"] = "gpt2"

    def __post_init__(self) -> None:
        stride = self.stride
        if self.image_size % stride:
            name = "patch_size" if self.patch_stride is None else "patch_stride"
            raise ValueError(f"image_size={self.image_size} is not divisible by {name}={stride}")
        if stride > self.patch_size or (self.patch_size - stride) % 2:
            raise ValueError(
                f"patch_stride={stride} must be at most patch_size={self.patch_size}, with an even "
                "difference (the image is padded by (patch_size - patch_stride) / 2 on each side)"
            )
        if self.pool not in ("cls", "mean"):
            raise ValueError(f"pool must be 'cls' or 'mean', got {self.pool!r}")
        if self.patch_init not in ("gpt2", "lecun"):
            raise ValueError(f"patch_init must be 'gpt2' or 'lecun', got {self.patch_init!r}")

    @property
    def stride(self) -> int:
        """Step between patches: ``patch_stride``, or ``patch_size`` when that is ``None``."""
        return self.patch_size if self.patch_stride is None else self.patch_stride

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.stride) ** 2


class ViT(nn.Module):
    r"""A vision transformer (Dosovitskiy et al. 2021; Turner 2023 sec. 4.2): patch tokens, learned
    positions, ``L`` pre-norm blocks with a final LayerNorm, a class token or the mean, a linear head.

    Implements: eq-vit, eq-vit-mean

    With ``pool="cls"`` the class token's row of :math:`\mathrm{LN}(X^{(L)})` is classified and the
    position table ``R`` has ``1 + N`` rows; with ``pool="mean"`` the mean of the patch rows, and ``R``
    has ``N`` rows. ``forward(images (B, C_in, H_px, W_px)) -> logits (B, n_classes)``.

    Initialisation: GPT-2's N(0, 0.02^2) for every linear and embedding weight, zero biases
    (:func:`.language_models.gpt2_init`), a zero class token; ``patch_init="lecun"`` redraws the
    patch map at LeCun's scale. Unlike :class:`.GPT`, the residual projections (``out_proj``,
    ``fc2``) are **not** scaled down by ``1/sqrt(2L)``.
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        c = self.config = config
        self.patch = PatchEmbedding(c.patch_size, c.channels, c.d_model, stride=c.patch_stride)
        self.cls = nn.Parameter(torch.zeros(1, 1, c.d_model)) if c.pool == "cls" else None
        self.pos = LearnedPositionalEmbedding(c.n_patches + (c.pool == "cls"), c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.stack = TransformerStack(
            PreNormBlock, c.n_layers, c.d_model, c.H, activation="gelu", dropout=c.dropout
        )
        self.head = nn.Linear(c.d_model, c.n_classes)
        self.apply(gpt2_init)
        if c.patch_init == "lecun":  # book eq. eq-vit-init: std 1/sqrt(C P^2), untruncated
            nn.init.normal_(self.patch.proj.weight, std=self.patch.proj.in_features**-0.5)

    def tokens(self, images: Tensor) -> Tensor:
        """``X^(0)``: the patch embeddings (the class token first, if any) plus the learned positions.

        Implements: eq-vit-pos

        Raises:
            ValueError: images of another shape than ``(B, C_in, image_size, image_size)``.
        """
        c = self.config
        if images.dim() != 4 or images.shape[1:] != (c.channels, c.image_size, c.image_size):
            raise ValueError(
                f"images must be (B, {c.channels}, {c.image_size}, {c.image_size}) for this ViT, got "
                f"{tuple(images.shape)}"
            )
        X = self.patch(images)  # (B, N, D)
        if self.cls is not None:
            X = torch.cat([self.cls.expand(X.shape[0], -1, -1), X], dim=1)  # (B, 1 + N, D)
        return self.drop(self.pos(X))

    def forward(self, images: Tensor) -> Tensor:
        X = self.stack(self.tokens(images))  # LN(X^(L)), eq. (eq-vit): (B, 1 + N | N, D)
        pooled = X[:, 0] if self.cls is not None else X.mean(dim=1)  # or eq. (eq-vit-mean), (B, D)
        return self.head(pooled)  # logits z, (B, n_classes)


def class_token_attention(model: ViT, images: Tensor) -> Tensor:
    r"""How much the class token attends to each patch in every block, averaged over the heads:
    :math:`\bar a^{(\ell)}_n = \frac{1}{H}\sum_h A^{(\ell,h)}_{0n}`, an ``(B, L, N)`` tensor.

    Implements: eq-vit-attn

    Forward hooks record each block's normalised input (the model is not changed) and the layer's
    :meth:`.multihead.SelfAttention.attention_map` recomputes its weights, which the fused attention
    kernel never forms. The weight the class token keeps on itself (column 0) is left out, so a row
    sums to less than one.

    Raises:
        ValueError: a model without a class token (``pool="mean"``).
    """
    if model.cls is None:
        raise ValueError("class_token_attention needs a model with a class token (pool='cls')")
    inputs: list[Tensor] = []
    hooks = [
        block.attn.register_forward_hook(lambda mod, args, out: inputs.append(args[0]))
        for block in model.stack.blocks
    ]
    try:
        with torch.no_grad():
            model(images)
    finally:
        for hook in hooks:
            hook.remove()
    rows = [
        block.attn.attention_map(X_norm)[:, :, 0, 1:].mean(dim=1)  # (B, N): query 0, patch keys
        for block, X_norm in zip(model.stack.blocks, inputs, strict=True)
    ]
    return torch.stack(rows, dim=1)  # (B, L, N)


# ---------------------------------------------------------------------------------------------------
# The recipe for scikit-learn's digits


def smoothed_cross_entropy(logits: Tensor, targets: Tensor, smoothing: float) -> Tensor:
    r"""Cross-entropy against label-smoothed targets, the loss of :data:`DIGITS_RECIPE` (Szegedy et
    al. 2016): the target puts :math:`1 - \varepsilon` on the true class and spreads
    :math:`\varepsilon` evenly over **all** :math:`|\mathcal{Y}|` classes, the true one included,

    .. math:: q_k = (1 - \varepsilon)\,[k = y] + \frac{\varepsilon}{|\mathcal{Y}|},\qquad
              \mathcal{L} = -\sum_{k \in \mathcal{Y}} q_k \log \operatorname{softmax}(\mathbf{z})_k,

    averaged over the batch. ``smoothing`` 0 is the plain cross-entropy. The same as PyTorch's
    ``F.cross_entropy(logits, targets, label_smoothing=smoothing)``.

    Implements: eq-vit-smooth

    Args:
        logits: ``(B, |Y|)``; targets: ``(B,)`` class ids; smoothing: :math:`\varepsilon`.

    Raises:
        ValueError: ``smoothing`` outside ``[0, 1)``, or shapes that do not match.
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing (epsilon) must lie in [0, 1), got {smoothing}")
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"logits must be (B, |Y|) and targets (B,), got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}"
        )
    n_classes = logits.shape[-1]
    q = torch.full_like(logits, smoothing / n_classes)  # eps / |Y| on every class, (B, |Y|)
    q.scatter_add_(-1, targets[:, None], torch.full_like(logits[:, :1], 1.0 - smoothing))
    return -(q * logits.log_softmax(dim=-1)).sum(dim=-1).mean()  # eq. (eq-vit-smooth)


def mixup(
    images: Tensor, labels: Tensor, alpha: float, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor, float]:
    r"""Mixup (Zhang et al. 2018): blend each image with a random partner of the batch,
    :math:`\tilde x = \lambda x_i + (1 - \lambda) x_j`, :math:`\lambda \sim \mathrm{Beta}(\alpha, \alpha)`.

    Returns the blended images, both label sets and ``lambda``; the loss is blended with the same
    weight. ``alpha = 0`` turns it off (``lambda = 1``). The partners come from ``generator``;
    ``lambda`` from torch's global generator (``torch.distributions`` takes no generator), which
    :func:`train_digits` seeds.
    """
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    if alpha == 0:
        return images, labels, labels, 1.0
    lam = torch.distributions.Beta(alpha, alpha).sample().item()
    partner = torch.randperm(len(images), generator=generator).to(images.device)
    return lam * images + (1 - lam) * images[partner], labels, labels[partner], lam


def shifted_probabilities(model: nn.Module, images: Tensor) -> Tensor:
    """Test-time shifts: the mean softmax over the nine copies of each image shifted by at most one
    pixel (zeros filled in); ``(B, n_classes)``."""
    H_px, W_px = images.shape[-2:]
    padded = F.pad(images, (1, 1, 1, 1))  # (B, C_in, H_px + 2, W_px + 2), zeros around
    copies = [padded[..., dy : dy + H_px, dx : dx + W_px] for dy in range(3) for dx in range(3)]
    return torch.stack([model(c).softmax(dim=-1) for c in copies]).mean(dim=0)


@dataclass(frozen=True)
class DigitsRecipe(Recipe):
    """How to train a :class:`ViT` on the digits (the training half of :func:`.data.digits_split`).

    ``augment`` is ``(degrees, zoom, shift)`` of :func:`.data.random_affine` or ``None``;
    ``mixup_alpha`` 0 turns mixup off; ``test_shifts`` averages the nine one-pixel shifts at test time.
    """

    model: ViTConfig = ViTConfig()
    smoothing: float = 0.1
    mixup_alpha: float = 0.4
    augment: tuple[float, float, float] | None = (10.0, 0.1, 1.0)
    test_shifts: bool = True


DIGITS_RECIPE = DigitsRecipe(
    model=ViTConfig(
        patch_size=4, patch_stride=2, patch_init="lecun", d_model=64, H=4, n_layers=2,
        dropout=0.0, pool="mean",
    ),
    train=TrainConfig(
        max_steps=1800, lr=3e-3, warmup_steps=60, weight_decay=0.05, eval_interval=600,
        time_budget_s=60.0,
    ),
    batch_size=128,
)  # fmt: skip
"""The CPU target: test accuracy >= 0.975 within 60 s of training (``bench/vit_digits.py``).

Overlapping 4x4 patches with stride 2 (16 tokens), the patch map at LeCun's scale, mean pooling, two
pre-norm blocks of width 64 without dropout; random rotations, zooms and shifts, mixup and label
smoothing; AdamW with warm-up and cosine decay over 1,800 steps of 128 images; test-time shifts."""


def _replace_model(**change) -> Callable[[DigitsRecipe], DigitsRecipe]:
    return lambda r: dataclasses.replace(r, model=dataclasses.replace(r.model, **change))


ABLATIONS: dict[str, tuple[str, Callable[[DigitsRecipe], DigitsRecipe]]] = {
    "overlap": (
        "non-overlapping 2x2 patches (16 tokens, as in the ViT paper)",
        _replace_model(patch_size=2, patch_stride=None),
    ),
    "init": (
        "GPT-2's N(0, 0.02) for the patch map instead of LeCun normal",
        _replace_model(patch_init="gpt2"),
    ),
    "mixup": ("no mixup", lambda r: dataclasses.replace(r, mixup_alpha=0.0)),
    "augment": (
        "no rotations, zooms or shifts (mixup kept)",
        lambda r: dataclasses.replace(r, augment=None),
    ),
}
"""Each part of :data:`DIGITS_RECIPE` that ``bench/vit_digits.py --ablate`` can leave out: name ->
(what is left out, how the recipe changes). ``make ablate`` runs them all; the chapter reads them."""


def ablated(recipe: DigitsRecipe, *names: str) -> DigitsRecipe:
    """``recipe`` with the parts in ``names`` (keys of :data:`ABLATIONS`) left out."""
    for name in names:
        if name not in ABLATIONS:
            raise ValueError(f"unknown ablation {name!r}; choose from {sorted(ABLATIONS)}")
        recipe = ABLATIONS[name][1](recipe)
    return recipe


@dataclass
class DigitsRun:
    """A trained ViT, its history and its test accuracy with and without the test-time shifts."""

    model: ViT
    history: History
    test_accuracy: float
    test_accuracy_no_shifts: float


@reusable_run  # the chapter and its lab make the same run: `make test` trains it once
def train_digits(
    recipe: DigitsRecipe = DIGITS_RECIPE,
    device: torch.device | str = "cpu",
    steps: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> DigitsRun:
    """Train a :class:`ViT` on the digits with ``recipe`` (``steps`` shortens it) and test it.

    The one training run of chapter 9, its lab and ``bench/vit_digits.py``. ``seed`` sets the
    initialisation, the order of the batches and the augmentations. The reported accuracy uses the
    test-time shifts when the recipe asks for them.
    """
    recipe = recipe.with_steps(steps)
    torch.manual_seed(seed)
    X_train, y_train, X_test, y_test = (t.to(device) for t in digits_split())
    model = ViT(recipe.model).to(device)
    B, smoothing = recipe.batch_size, recipe.smoothing

    def next_batch(g: torch.Generator):
        i = torch.randint(0, len(X_train), (B,), generator=g).to(device)
        images = X_train[i]
        if recipe.augment is not None:
            images = random_affine(images, *recipe.augment, generator=g)
        return mixup(images, y_train[i], recipe.mixup_alpha, g)

    def loss_fn(m: ViT, batch) -> Tensor:  # mixup: the loss is blended like the images
        images, y_a, y_b, lam = batch
        logits = m(images)
        loss = smoothed_cross_entropy(logits, y_a, smoothing)
        if lam == 1.0:
            return loss
        return lam * loss + (1 - lam) * smoothed_cross_entropy(logits, y_b, smoothing)

    def accuracy(m: ViT, shifts: bool) -> float:
        probs = shifted_probabilities(m, X_test) if shifts else m(X_test)
        return (probs.argmax(dim=-1) == y_test).float().mean().item()

    def evaluate(m: ViT) -> dict[str, float]:
        return {"test_accuracy": accuracy(m, recipe.test_shifts)}

    cfg = dataclasses.replace(recipe.train, seed=seed)
    history = train(model, next_batch, loss_fn, cfg, evaluate, progress=progress)
    with eval_mode(model):
        plain = accuracy(model, shifts=False)
    return DigitsRun(model, history, history.evals["test_accuracy"][-1], plain)


def position_similarity(R: Tensor) -> Tensor:
    r"""Cosine similarity of every pair of rows of ``R (N, D)``, an ``(N, N)`` matrix:
    :math:`\operatorname{sim}(n, m) = \mathbf{r}_n^\top \mathbf{r}_m /
    (\lVert \mathbf{r}_n \rVert \lVert \mathbf{r}_m \rVert)`.

    Implements: eq-vit-possim
    """
    if R.dim() != 2:
        raise ValueError(f"R must be (N, D), one position per row; got shape {tuple(R.shape)}")
    unit = R / R.norm(dim=-1, keepdim=True)  # (N, D)
    return unit @ unit.T  # (N, N)


def mcnemar(hits_a: Tensor, hits_b: Tensor) -> tuple[float, int, int]:
    """Exact two-sided McNemar test of two classifiers on the same test set: ``(p, n10, n01)``
    with ``n10`` the items only ``a`` got right (a right = 1, b wrong = 0, the usual table's cell)
    and ``n01`` those only ``b`` got right; ``hits_a`` and ``hits_b`` are bool tensors of one entry
    per test item.

    Implements: eq-vit-mcnemar
    """
    if hits_a.shape != hits_b.shape or hits_a.dtype != torch.bool or hits_b.dtype != torch.bool:
        raise ValueError(
            "hits_a and hits_b must be bool tensors of the same shape (one entry per test item), got "
            f"{hits_a.dtype} {tuple(hits_a.shape)} and {hits_b.dtype} {tuple(hits_b.shape)}"
        )
    n10, n01 = int((hits_a & ~hits_b).sum()), int((~hits_a & hits_b).sum())
    n = n10 + n01
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(min(n10, n01) + 1)) / 2**n)
    return p, n10, n01
