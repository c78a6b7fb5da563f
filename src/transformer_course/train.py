"""One training loop for the course: AdamW, warm-up and cosine decay, clipping, periodic evaluation.

Shared infrastructure: chapter *Autoregressive language models* uses it first, then every chapter that
trains a model. The loop is model-agnostic: it takes a function that draws a batch and a function that
turns a batch into a loss. It never picks a device (the caller does) and uses bf16 autocast only on
CUDA. A :class:`Recipe` holds every setting of one model's training run; each model's module defines
its recipes and the function that runs one, which the benchmarks and the book pages both call.

The same loop runs data-parallel under ``torchrun`` (chapter *Training*): when ``torch.distributed`` is
initialised, :func:`train` wraps the model in ``DistributedDataParallel`` (or accepts one already
wrapped), every rank draws the same **global** batch from the seeded generator and keeps its own
contiguous share (:func:`shard`), DDP averages the gradients, and the loss it logs is the mean over all
ranks. Single-process runs are untouched by this.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm  # plain text bar: no ipywidgets needed in notebooks

from .runtime import eval_mode

__all__ = [
    "History",
    "Recipe",
    "TrainConfig",
    "global_grad_norm",
    "lr_at",
    "make_optimizer",
    "shard",
    "train",
]


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

    def with_train(self, **changes) -> Recipe:
        """The same recipe with some optimisation settings changed, e.g. ``with_train(lr=3e-2,
        warmup_steps=0)`` (chapter *Training* compares runs that differ in one setting)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(TrainConfig)}
        if unknown:
            raise ValueError(
                f"TrainConfig has no setting {sorted(unknown)}; choose from "
                f"{[f.name for f in dataclasses.fields(TrainConfig)]}"
            )
        return dataclasses.replace(self, train=dataclasses.replace(self.train, **changes))


@dataclass
class History:
    """What happened during training, for plots and reports.

    ``evals`` maps each quantity the ``evaluate`` function returns (``"val_loss"``,
    ``"test_accuracy"``, ...) to its values at the steps in ``eval_step``. ``grad_norm`` is the global
    gradient norm of every step *before* clipping (book eq. ``eq-train-clip``). Under
    ``torch.distributed``, ``train_loss`` is the mean over the ranks, the loss of the global batch.
    """

    step: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    evals: dict[str, list[float]] = field(default_factory=dict)
    seconds: float = 0.0
    steps_done: int = 0


def lr_at(step: int, cfg: TrainConfig) -> float:
    r"""Learning rate of the loop's ``step`` (counted from 0), book eq. ``eq-train-schedule``: linear
    warm-up to ``lr``, then cosine decay towards ``min_lr``.

    With ``s = step + 1`` the update's number, ``s_w`` = ``warmup_steps`` and ``s_max`` = ``max_steps``:

    .. math:: \eta_s = \eta\,\frac{s}{s_\text{w}}\ (s \le s_\text{w}),\qquad
              \eta_s = \eta_\min + \tfrac12(\eta - \eta_\min)
              \Big(1 + \cos\frac{\pi (s - 1 - s_\text{w})}{s_\text{max} - s_\text{w}}\Big)

    The peak ``lr`` is used twice (updates ``s_w`` and ``s_w + 1``) and the last update stops one
    step short of ``min_lr``; ``torch.optim.lr_scheduler.SequentialLR`` over ``LinearLR`` and
    ``CosineAnnealingLR`` gives the same sequence (``tests/test_training.py``).
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


def global_grad_norm(parameters) -> Tensor:
    r"""The global gradient norm
    :math:`\lVert\mathbf{g}\rVert = \big(\sum_\vartheta \lVert\mathbf{g}_\vartheta\rVert^2\big)^{1/2}`
    over every parameter tensor :math:`\vartheta` that has a gradient (book eq. ``eq-train-clip``), as a
    0-d tensor; nothing is changed."""
    norms = [torch.linalg.vector_norm(p.grad.detach()) for p in parameters if p.grad is not None]
    if not norms:
        return torch.tensor(0.0)
    return torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]))


def shard(batch: tuple, rank: int, world_size: int) -> tuple:
    """Rank ``rank``'s share of a global batch: its contiguous ``1 / world_size`` of every tensor whose
    first dimension is the batch; other entries (a float, a 0-d tensor) are kept whole. Equal shares
    make the mean of the ranks' gradients the gradient of the whole batch, book eq. ``eq-train-ddp``.

    Raises:
        ValueError: the global batch does not split evenly over the ranks, or two tensors of the batch
            disagree on its size.
    """
    sizes = {t.shape[0] for t in batch if isinstance(t, Tensor) and t.dim() > 0}
    if len(sizes) != 1:
        raise ValueError(
            f"every tensor of a batch must have the global batch size as its first dimension; got "
            f"first dimensions {sorted(sizes)}"
        )
    (B,) = sizes
    if B % world_size:
        raise ValueError(
            f"a global batch of {B} does not split evenly over {world_size} ranks; choose a batch "
            f"size that is a multiple of {world_size} (otherwise averaging the ranks' gradients "
            "would weight their examples unequally)"
        )
    b = B // world_size
    return tuple(
        t[rank * b : (rank + 1) * b] if isinstance(t, Tensor) and t.dim() > 0 else t for t in batch
    )


def _distributed() -> tuple[int, int] | None:
    """``(rank, world_size)`` when ``torch.distributed`` is initialised, else ``None``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


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
        model: the model (or a ``DistributedDataParallel`` wrapping it).
        next_batch: draws a batch (already on the model's device) using the given seeded generator.
            Under ``torch.distributed`` this is the **global** batch: every rank draws the same one
            (the generator is seeded alike) and trains on its own share (:func:`shard`).
        loss_fn: ``loss_fn(model, batch)`` returns a scalar loss (the mean over the batch).
        cfg: the :class:`TrainConfig`.
        evaluate: called (in eval mode, without gradients) every ``cfg.eval_interval`` steps and at
            the end; returns named figures, e.g. ``{"val_loss": 1.62}`` (kept in ``History.evals``).
            Under ``torch.distributed`` every rank evaluates its (identical) replica.
        progress: show a tqdm progress bar (on rank 0 only).

    Raises:
        FloatingPointError: the loss became NaN or infinite; the exception's ``history`` attribute
            holds what was recorded up to that step.
        ValueError: under ``torch.distributed``, a global batch that does not split evenly.
    """
    ranks = _distributed()
    module = model.module if isinstance(model, DistributedDataParallel) else model
    device = next(module.parameters()).device
    if ranks is not None and not isinstance(model, DistributedDataParallel):
        model = DistributedDataParallel(
            module, device_ids=[device] if device.type == "cuda" else None
        )
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = make_optimizer(module, cfg)
    hist = History()
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    norms: list[Tensor] = []  # gradient norms not yet read back: no extra host sync per step

    def flush_norms() -> None:
        if norms:
            hist.grad_norm.extend(torch.stack(norms).tolist())
            norms.clear()

    show = progress and (ranks is None or ranks[0] == 0)
    bar = tqdm(range(cfg.max_steps), disable=not show, desc="training", leave=False)
    t0 = time.perf_counter()
    for step in bar:
        lr = lr_at(step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        model.train()
        batch = next_batch(gen)
        if ranks is not None:
            batch = shard(batch, *ranks)
        with autocast:
            loss = loss_fn(model, batch)
        logged = loss.detach()
        if ranks is not None:  # the global batch's loss: the mean of the ranks' equal shares
            logged = logged.to(torch.promote_types(logged.dtype, torch.float32), copy=True)
            dist.all_reduce(logged)
            logged /= ranks[1]
        if not torch.isfinite(logged):  # the same verdict on every rank, so all of them stop
            hist.seconds += time.perf_counter() - t0
            flush_norms()
            err = FloatingPointError(
                f"the loss became {logged.item()} at step {step} (lr {lr:.2e}); lower the learning "
                "rate, warm up for longer, or keep gradient clipping on"
            )
            err.history = hist  # type: ignore[attr-defined]  # the run up to here, for plots
            raise err
        opt.zero_grad(set_to_none=True)
        loss.backward()  # under DDP: gradients averaged over the ranks
        if cfg.grad_clip is not None:
            norm = nn.utils.clip_grad_norm_(module.parameters(), cfg.grad_clip)
        else:
            norm = global_grad_norm(module.parameters())
        opt.step()
        hist.step.append(step)
        hist.train_loss.append(logged.item())
        hist.lr.append(lr)
        norms.append(norm.detach())
        hist.steps_done = step + 1
        trained_s = hist.seconds + time.perf_counter() - t0  # evaluation time excluded
        out_of_time = cfg.time_budget_s is not None and trained_s > cfg.time_budget_s
        if ranks is not None and cfg.time_budget_s is not None:  # stop together: any rank's clock
            flag = torch.tensor(float(out_of_time), device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            out_of_time = bool(flag.item())
        last = step == cfg.max_steps - 1 or out_of_time
        if evaluate is not None and ((step + 1) % cfg.eval_interval == 0 or last):
            hist.seconds += time.perf_counter() - t0  # evaluation time is not training time
            flush_norms()
            hist.eval_step.append(step + 1)
            with eval_mode(module):
                figures = evaluate(module)
            for name, value in figures.items():
                hist.evals.setdefault(name, []).append(float(value))
            bar.set_postfix(
                loss=f"{hist.train_loss[-1]:.3f}", **{k: f"{v:.3f}" for k, v in figures.items()}
            )
            t0 = time.perf_counter()
        if out_of_time:
            break
    hist.seconds += time.perf_counter() - t0
    flush_norms()
    return hist
