"""The learning rate: the recipe of the chapter's instability runs (book sec. *Instabilities*; Wortsman
et al. 2024), and a sweep of the learning rate at several widths with the best rate of each read off a
parabola in the log learning rate (book eq. ``eq-train-vertex``; ``bench/lr_sweep.py``). Part of
chapter *Training* (:mod:`transformer_course.training`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from ..language_models import GPTConfig, LMRecipe, train_char_lm
from ..train import TrainConfig
from .scaling import LogParabola, log_parabola_minimum, scaled_recipe

INSTABILITY_RECIPE = LMRecipe(
    model=GPTConfig(vocab_size=65, block_size=32, n_layers=4, H=4, d_model=64, dropout=0.0),
    train=TrainConfig(max_steps=200, lr=3e-3, warmup_steps=0, eval_interval=200),
    batch_size=16,
    eval_batches=8,
)
"""A 4-block character GPT (about 210 thousand parameters) trained for 200 steps of 16 windows of 32
characters, without warm-up: the base of the chapter's learning-rate experiments (book sec.
*Instabilities*), which change one setting at a time with :meth:`.train.Recipe.with_train`."""

LR_GRID = tuple(1e-3 * 2**k for k in range(8))
"""The sweep's learning rates: 1e-3 to 0.128, a factor of 2 apart (the CPU recipe's 8e-3 among them)."""
LR_SWEEP_WIDTHS = (32, 64, 128)
"""The widths ``D`` of the swept GPTs (two blocks each, heads of width 16)."""
LR_SWEEP_STEPS = 400
"""The fixed short budget of every run of the sweep: 400 steps of 64 windows of 64 characters."""


def lr_sweep_recipe(
    d_model: int,
    lr: float,
    steps: int = LR_SWEEP_STEPS,
    n_layers: int = 2,
    eval_batches: int = 10,
) -> LMRecipe:
    """One run of the sweep: the CPU language-model recipe (:func:`.scaling.scaled_recipe`) with a GPT
    of width ``d_model`` and ``n_layers`` blocks, ``steps`` steps of which the first tenth warm up, and
    the peak learning rate ``lr``; every other setting (batch, context, decay, clipping) is the
    recipe's."""
    recipe = scaled_recipe(
        d_model, n_layers, steps, warmup_steps=max(1, steps // 10), eval_batches=eval_batches
    )
    return recipe.with_train(lr=lr)


def lr_sweep(
    widths: Sequence[int] = LR_SWEEP_WIDTHS,
    lrs: Sequence[float] = LR_GRID,
    steps: int = LR_SWEEP_STEPS,
    n_layers: int = 2,
    eval_batches: int = 10,
    device: torch.device | str = "cpu",
    seed: int = 0,
    report: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Train one GPT per width and learning rate (:func:`lr_sweep_recipe`, the same seed, so the same
    batches) and return one dict per run: ``d_model``, ``params``, ``lr``, ``val_loss`` (``None``
    when the loss became NaN or infinite: ``diverged``), ``seconds``. ``report`` sees each run as it
    ends."""
    runs = []
    for d_model in widths:
        for lr in lrs:
            recipe = lr_sweep_recipe(d_model, lr, steps, n_layers, eval_batches)
            try:
                run = train_char_lm(recipe, device, seed=seed)
                loss, seconds, diverged = run.val_loss, run.history.seconds, False
                params = run.model.num_params()
            except FloatingPointError as err:
                loss, seconds, diverged = None, err.history.seconds, True
                params = None
            runs.append({
                "d_model": d_model, "n_layers": n_layers, "params": params, "lr": lr,
                "steps": steps, "val_loss": loss, "diverged": diverged,
                "seconds": round(seconds, 2),
            })  # fmt: skip
            if report is not None:
                report(runs[-1])
    return runs


def best_learning_rate(lrs: Sequence[float], losses: Sequence[float | None]) -> dict:
    r"""The best learning rate of a sweep on a log grid: the grid's lowest loss and, when it has a
    neighbour on each side, the vertex of the parabola in :math:`\ln\eta` through the three points
    (:func:`.scaling.log_parabola_minimum`, book eq. ``eq-train-vertex``).

    A run that diverged (loss ``None``, NaN or infinite) counts as worse than every other.

    Returns:
        ``{"grid_lr", "grid_loss", "lr", "loss", "bracketed"}``: ``lr`` and ``loss`` are the
        vertex's when ``bracketed`` (the best point is inside the grid and the three points curve
        upwards), else the grid's best point again.
    """
    order = sorted(range(len(lrs)), key=lambda i: lrs[i])
    x = [float(lrs[i]) for i in order]
    y = [math.inf if losses[i] is None or not math.isfinite(losses[i]) else float(losses[i])
         for i in order]  # fmt: skip
    i = min(range(len(y)), key=y.__getitem__)
    out = {"grid_lr": x[i], "grid_loss": y[i], "lr": x[i], "loss": y[i], "bracketed": False}
    if 0 < i < len(x) - 1 and math.isfinite(y[i - 1]) and math.isfinite(y[i + 1]):
        try:
            fit: LogParabola = log_parabola_minimum(x[i - 1 : i + 2], y[i - 1 : i + 2])
        except ValueError:
            return out
        out.update(lr=fit.x_opt, loss=fit.y_opt, bracketed=True)
    return out
