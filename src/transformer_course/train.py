"""One training loop for the course: AdamW, warm-up and cosine decay, clipping, periodic evaluation.

Shared infrastructure: chapter *Autoregressive language models* uses it first, then every chapter that
trains a model. The loop is model-agnostic: it takes a function that draws a batch and a function that
turns a batch into a loss. It never picks a device (the caller does) and uses bf16 autocast only on
CUDA. A :class:`Recipe` holds every setting of one model's training run; each model's module defines
its recipes and the function that runs one, which the benchmarks and the book pages both call.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from tqdm import tqdm  # plain text bar: no ipywidgets needed in notebooks

from .runtime import eval_mode

__all__ = ["History", "Recipe", "TrainConfig", "lr_at", "make_optimizer", "train"]


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings. ``min_lr`` defaults to ``lr / 10``; ``time_budget_s`` stops early."""

    max_steps: int = 1000
    lr: float = 1e-3
    min_lr: float | None = None
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float | None = 1.0
    eval_interval: int = 250
    time_budget_s: float | None = None
    seed: int = 0


@dataclass(frozen=True)
class Recipe:
    """The settings of one training run: optimisation (``train``) and the batch size. Each model's
    module subclasses it with the model's configuration and what else its data needs.

    A page or a test that must run quicker shrinks only the step count, :meth:`with_steps`; every
    other setting stays the recipe's.
    """

    train: TrainConfig
    batch_size: int

    def with_steps(self, steps: int | None) -> Recipe:
        """The same recipe trained for ``steps`` steps (the schedule is stretched to fit); ``None``
        keeps the recipe's own count."""
        if steps is None:
            return self
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        return dataclasses.replace(self, train=dataclasses.replace(self.train, max_steps=steps))


@dataclass
class History:
    """What happened during training, for plots and reports.

    ``evals`` maps each quantity the ``evaluate`` function returns (``"val_loss"``,
    ``"test_accuracy"``, ...) to its values at the steps in ``eval_step``.
    """

    step: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    evals: dict[str, list[float]] = field(default_factory=dict)
    seconds: float = 0.0
    steps_done: int = 0


def lr_at(step: int, cfg: TrainConfig) -> float:
    r"""Learning rate at ``step``: linear warm-up to ``lr``, then cosine decay to ``min_lr``.

    .. math:: \eta_t = \eta\,\frac{t+1}{T_w}\ (t < T_w),\qquad
              \eta_t = \eta_\min + \tfrac12(\eta - \eta_\min)\Big(1 + \cos\frac{\pi (t - T_w)}{T - T_w}\Big)
    """
    min_lr = cfg.lr / 10 if cfg.min_lr is None else cfg.min_lr
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return min_lr + 0.5 * (cfg.lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019) with weight decay on matrices only, not on biases or norms."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


def train(
    model: nn.Module,
    next_batch: Callable[[torch.Generator], tuple[Tensor, ...]],
    loss_fn: Callable[[nn.Module, tuple[Tensor, ...]], Tensor],
    cfg: TrainConfig,
    evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
    progress: bool = True,
) -> History:
    """Train ``model`` in place and return its :class:`History`.

    Args:
        next_batch: draws a batch (already on the model's device) using the given seeded generator.
        loss_fn: ``loss_fn(model, batch)`` returns a scalar loss.
        cfg: the :class:`TrainConfig`.
        evaluate: called (in eval mode, without gradients) every ``cfg.eval_interval`` steps and at
            the end; returns named figures, e.g. ``{"val_loss": 1.62}`` (kept in ``History.evals``).
        progress: show a tqdm progress bar.
    """
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = make_optimizer(model, cfg)
    hist = History()
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    bar = tqdm(range(cfg.max_steps), disable=not progress, desc="training", leave=False)
    t0 = time.perf_counter()
    for step in bar:
        lr = lr_at(step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        model.train()
        batch = next_batch(gen)
        with autocast:
            loss = loss_fn(model, batch)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"the loss became {loss.item()} at step {step} (lr {lr:.2e}); lower the learning rate "
                "or keep gradient clipping on"
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        hist.step.append(step)
        hist.train_loss.append(loss.item())
        hist.lr.append(lr)
        hist.steps_done = step + 1
        trained_s = hist.seconds + time.perf_counter() - t0  # evaluation time excluded
        out_of_time = cfg.time_budget_s is not None and trained_s > cfg.time_budget_s
        last = step == cfg.max_steps - 1 or out_of_time
        if evaluate is not None and ((step + 1) % cfg.eval_interval == 0 or last):
            hist.seconds += time.perf_counter() - t0  # evaluation time is not training time
            hist.eval_step.append(step + 1)
            with eval_mode(model):
                figures = evaluate(model)
            for name, value in figures.items():
                hist.evals.setdefault(name, []).append(float(value))
            bar.set_postfix(
                loss=f"{hist.train_loss[-1]:.3f}", **{k: f"{v:.3f}" for k, v in figures.items()}
            )
            t0 = time.perf_counter()
        if out_of_time:
            break
    hist.seconds += time.perf_counter() - t0
    return hist
