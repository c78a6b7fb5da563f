"""Claims: recipes: every setting, fixed before any result is seen."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..data import get_batch, tinyshakespeare_text, train_val_split
from ..tokens import CharTokenizer
from ..train import Recipe, TrainConfig
from .model import ClaimsConfig


@dataclass(frozen=True)
class ClaimsRecipe(Recipe):
    """A claim's setting: the model's sizes, the optimisation (``train``: the course's CPU language
    model recipe, AdamW with warm-up over the first tenth of the steps and cosine decay), the batch
    size, the held-out batches, the seeds, the depths of the norm-position claim and the length factor
    of the length claim."""

    model: ClaimsConfig = ClaimsConfig()  # noqa: RUF009 (frozen, so a shared default is safe)
    eval_batches: int = 16
    seeds: tuple[int, ...] = (0, 1, 2)
    depths: tuple[int, ...] = (2, 6)
    depth_seeds: tuple[int, ...] = (0, 1, 2)
    length_factor: int = 4


SMALL = ClaimsRecipe(
    model=ClaimsConfig(block_size=32, n_layers=2, H=2, d_model=32, d_pos=8),
    train=TrainConfig(max_steps=60, lr=8e-3, warmup_steps=6, weight_decay=0.1, grad_clip=1.0,
                      eval_interval=30),
    batch_size=16, eval_batches=4, seeds=(0, 1, 2), depths=(2, 4), depth_seeds=(0, 1, 2),
    length_factor=4,
)  # fmt: skip
"""The book's live runs and the tests: a few seconds per claim on two cores."""
LARGE = ClaimsRecipe(
    model=ClaimsConfig(block_size=64, n_layers=2, H=4, d_model=64, d_pos=16),
    train=TrainConfig(max_steps=400, lr=8e-3, warmup_steps=40, weight_decay=0.1, grad_clip=1.0,
                      eval_interval=100),
    batch_size=32, eval_batches=16, seeds=(0, 1, 2, 3, 4), depths=(2, 6), depth_seeds=(0, 1, 2),
    length_factor=4,
)  # fmt: skip
"""``bench/claims.py --setting large``: the recorded runs the chapter concludes from."""
SETTINGS = {"small": SMALL, "large": LARGE}
LR_GRID = (4e-3, 8e-3, 1.6e-2)
"""The learning rates every arm of the large setting is also trained at (``bench/claims.py --lr``):
the recipe's rate and a factor of two either side, a log grid as in a learning-rate sweep. The chapter
compares arms at their own best rate of the three (:func:`at_best_rates`)."""


def at_rate(setting: str | ClaimsRecipe, lr: float) -> ClaimsRecipe:
    """The setting with its peak learning rate replaced by ``lr`` (the schedule's shape unchanged)."""
    if not lr > 0 or not math.isfinite(lr):
        raise ValueError(f"the learning rate must be a positive number, got {lr}")
    recipe = _recipe(setting)
    return dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, lr=lr))


def _setting_name(recipe: ClaimsRecipe) -> str:
    """``large``, or ``large, lr 0.004`` for a named setting at another rate, or ``custom``."""
    for name, named in SETTINGS.items():
        if recipe == named:
            return name
        if recipe == at_rate(named, recipe.train.lr):
            return f"{name}, lr {recipe.train.lr:g}"
    return "custom"


def _recipe(setting: str | ClaimsRecipe) -> ClaimsRecipe:
    if isinstance(setting, ClaimsRecipe):
        return setting
    try:
        return SETTINGS[setting]
    except KeyError:
        raise ValueError(f"unknown setting {setting!r}; choose one of {sorted(SETTINGS)}") from None


def _schedule(recipe: ClaimsRecipe, steps: int | None, warmup: bool, seed: int) -> TrainConfig:
    """The recipe's optimisation for ``steps`` steps; warm-up keeps its share of the steps (or is
    switched off); the held-out loss is evaluated once, at the end."""
    t = recipe.train
    S = t.max_steps if steps is None else steps
    if S < 1:
        raise ValueError(f"steps must be >= 1, got {S}")
    W = max(1, round(t.warmup_steps * S / t.max_steps)) if warmup else 0
    return dataclasses.replace(t, max_steps=S, warmup_steps=W, eval_interval=S, seed=seed)


@functools.lru_cache(maxsize=1)
def _corpus() -> tuple[Tensor, Tensor, int]:
    """Tiny-shakespeare as character ids: the first 90 % for training, the rest held out."""
    text = tinyshakespeare_text()
    tok = CharTokenizer.from_text(text)
    train_ids, val_ids = train_val_split(tok.encode_tensor(text))
    return train_ids, val_ids, tok.vocab_size


def _held_out(length: int, recipe: ClaimsRecipe, device) -> list[tuple[Tensor, Tensor]]:
    """The same ``eval_batches`` held-out windows of ``length`` tokens for every run."""
    _, val_ids, _ = _corpus()
    gen = torch.Generator().manual_seed(1234)
    return [
        get_batch(val_ids, length, recipe.batch_size, gen, device)
        for _ in range(recipe.eval_batches)
    ]
