"""One training loop for the course: AdamW, warm-up and cosine decay, clipping, periodic evaluation.

Shared infrastructure: chapter *Autoregressive language models* uses it first, then every chapter that
trains a model. The loop is model-agnostic: it takes a function that draws a batch and a function that
turns a batch into a loss. It never picks a device (the caller does) and uses bf16 autocast only on
CUDA. A :class:`Recipe` holds every setting of one model's training run; each model's module defines
its recipes and the function that runs one, which the benchmarks and the book pages both call.

The same loop runs data-parallel under ``torchrun`` (chapter *Training*): when ``torch.distributed`` is
initialised, :func:`train` wraps the model in ``DistributedDataParallel`` (or accepts one already
wrapped), every rank draws the same **global** batch from the seeded generator and keeps its own
contiguous share (:func:`shard`), each rank's loss is weighted by the share of the scored positions it
holds (:func:`share_weight`: padding makes shares unequal), DDP averages the gradients, and the loss it
logs is the global batch's mean. Single-process runs are untouched by this.
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
    "share_weight",
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
    ``torch.distributed``, ``train_loss`` is the mean loss of the global batch, not of a rank's share.
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
    r"""Learning rate of the loop's ``step`` (counted from 0): linear warm-up to ``lr``, then cosine
    decay towards ``min_lr``.

    Implements: eq-train-schedule

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
    """PyTorch's AdamW (Loshchilov & Hutter 2019) with ``cfg.lr``, ``cfg.betas`` and weight decay
    ``cfg.weight_decay`` on every parameter tensor with two or more dimensions, none on the others.

    Decayed: the weight matrices, and also the token embedding table, a learned position table, a
    ViT's patch map and its class token ``(1, 1, D)``. Not decayed: biases and LayerNorm gains and
    shifts (1-D). The rule is by shape alone: rows of a table that no batch uses (a position beyond
    every window trained on, a character that never occurs) get no gradient, yet AdamW still shrinks
    them by the factor ``1 - lr * weight_decay`` at every step, so they do not keep their
    initialisation.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]  # matrices and tables
    no_decay = [p for p in params if p.dim() < 2]  # biases, LayerNorm gains and shifts
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
    first dimension is the batch; other entries (a float, a 0-d tensor) are kept whole.

    The shares hold equally many examples, which is not the same as equally many *scored positions*
    when targets are padded; :func:`train` therefore weights each rank's loss by
    :func:`share_weight` (book eq. ``eq-train-ddp``).

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


def share_weight(n_share: int, n_total: int, world_size: int) -> float:
    r"""The factor by which a rank multiplies the mean loss of its share of a global batch, so that
    DDP's mean of the ranks' gradients is the gradient of the global batch's mean loss:

    .. math:: w_r = n_\text{ranks}\,\frac{|\mathcal{P}_r|}{|\mathcal{P}|},\qquad
              \frac{1}{n_\text{ranks}}\sum_{r} w_r\,\nabla_\theta\mathcal{L}_r
              = \nabla_\theta\mathcal{L},

    with :math:`|\mathcal{P}_r|` = ``n_share`` the positions rank ``r`` scores, :math:`|\mathcal{P}|`
    = ``n_total`` those of every rank and :math:`n_\text{ranks}` = ``world_size``. Shares that score
    equally many positions (full windows of equal number) get 1; the padded targets of a
    sequence-to-sequence batch do not.

    Implements: eq-train-ddp

    Raises:
        ValueError: a share that scores no position (its mean loss is undefined), or counts that
            cannot be shares of ``n_total``.
    """
    if n_share <= 0 or n_total < n_share or world_size < 1:
        raise ValueError(
            f"a rank's share must score at least one position, and no more than the global batch: "
            f"got {n_share} of {n_total} over {world_size} ranks"
        )
    return world_size * n_share / n_total


def _distributed() -> tuple[int, int] | None:
    """``(rank, world_size)`` when ``torch.distributed`` is initialised, else ``None``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _global_mean(loss: Tensor, n_share: int, world_size: int) -> tuple[Tensor, Tensor]:
    """Under DDP: (the rank's loss weighted by :func:`share_weight`, the global batch's mean loss)."""
    count = torch.tensor([float(n_share)], device=loss.device)
    counts = [torch.zeros_like(count) for _ in range(world_size)]
    dist.all_gather(counts, count)  # every rank learns every share's number of scored positions
    n = [int(c.item()) for c in counts]
    if min(n) <= 0:  # the same verdict on every rank, so none waits for the others
        raise ValueError(
            f"scored positions per rank {n}: every share of the global batch must score at least "
            "one position; use a larger global batch"
        )
    logged = loss.detach().to(torch.promote_types(loss.dtype, torch.float32), copy=True)
    logged *= n_share / sum(n)
    dist.all_reduce(logged)  # sum over r of L_r |P_r| / |P|: the mean over the global batch
    return loss * share_weight(n_share, sum(n), world_size), logged


def _diverged(step: int, lr: float, loss: Tensor, hist: History) -> FloatingPointError:
    err = FloatingPointError(
        f"the loss became {loss.item()} at step {step} (lr {lr:.2e}); lower the learning rate, warm "
        "up for longer, or keep gradient clipping on"
    )
    err.history = hist  # type: ignore[attr-defined]  # the run up to here, for plots
    return err


def _out_of_time(cfg: TrainConfig, seconds: float, ranks: tuple[int, int] | None, device) -> bool:
    """Whether the time budget is spent; under DDP the ranks decide together (any rank's clock)."""
    out = cfg.time_budget_s is not None and seconds > cfg.time_budget_s
    if ranks is not None and cfg.time_budget_s is not None:
        flag = torch.tensor(float(out), device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        out = bool(flag.item())
    return out


def train(
    model: nn.Module,
    next_batch: Callable[[torch.Generator], tuple[Tensor, ...]],
    loss_fn: Callable[[nn.Module, tuple[Tensor, ...]], Tensor],
    cfg: TrainConfig,
    evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
    progress: bool = True,
    *,
    scored: Callable[[tuple[Tensor, ...]], int | Tensor] | None = None,
) -> History:
    """Train ``model`` in place with AdamW, the learning rate of :func:`lr_at` and clipping by the
    global norm; return its :class:`History`.

    ``next_batch(generator)`` draws a batch on the model's device from the seeded generator;
    ``loss_fn(model, batch)`` returns the mean loss over the batch's scored positions;
    ``evaluate(model)``, called in eval mode without gradients every ``cfg.eval_interval`` steps and
    at the end, returns named figures such as ``{"val_loss": 1.62}`` (``History.evals``).

    Under ``torch.distributed`` the model is wrapped in ``DistributedDataParallel`` (unless it
    already is), every rank draws the same global batch and trains on its :func:`shard`, and
    ``scored(batch)``, the number of positions a share scores, weights each rank's loss by
    :func:`share_weight` so that the averaged gradient is the global batch's (book eq.
    ``eq-train-ddp``); the logged loss is the global batch's mean. A progress bar shows on rank 0.

    Raises:
        FloatingPointError: the loss became NaN or infinite; its ``history`` holds the run so far.
        ValueError: under ``torch.distributed``, no ``scored``, a share without a scored position,
            or a global batch that does not split evenly.
    """
    ranks = _distributed()  # (rank, world size), or None in a single process
    if ranks is not None and scored is None:
        raise ValueError(
            "under torch.distributed, pass scored=lambda batch: <number of scored positions> so "
            "that shares with unequal numbers of scored positions (padding) are weighted right"
        )
    module = model.module if isinstance(model, DistributedDataParallel) else model
    device = next(module.parameters()).device
    if ranks is not None and not isinstance(model, DistributedDataParallel):
        model = DistributedDataParallel(
            module, device_ids=[device] if device.type == "cuda" else None
        )
    gen = torch.Generator().manual_seed(cfg.seed)  # the batches: the same on every rank
    opt = make_optimizer(module, cfg)  # AdamW, eq. (eq-train-adamw)
    bf16 = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    hist, norms = History(), []  # gradient norms are read back in groups: no host sync per step
    show = progress and (ranks is None or ranks[0] == 0)
    bar = tqdm(range(cfg.max_steps), desc="training", disable=not show, leave=False)
    t0 = time.perf_counter()
    for step in bar:
        lr = lr_at(step, cfg)  # eq. (eq-train-schedule)
        for group in opt.param_groups:
            group["lr"] = lr
        model.train()
        batch = next_batch(gen) if ranks is None else shard(next_batch(gen), *ranks)
        with bf16:
            loss = loss_fn(model, batch)  # mean over the scored positions, eq. (eq-train-ce)
        logged = loss.detach()
        if ranks is not None:  # unequal shares weighted, eq. (eq-train-ddp)
            loss, logged = _global_mean(loss, int(scored(batch)), ranks[1])
        if not torch.isfinite(logged):  # the same verdict on every rank, so all of them stop
            hist.seconds += time.perf_counter() - t0
            hist.grad_norm += torch.stack(norms).tolist() if norms else []
            raise _diverged(step, lr, logged, hist)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # under DDP: gradients averaged over the ranks
        clip = cfg.grad_clip if cfg.grad_clip is not None else math.inf  # eq. (eq-train-clip)
        norms.append(nn.utils.clip_grad_norm_(module.parameters(), clip).detach())
        opt.step()
        hist.step.append(step)
        hist.train_loss.append(logged.item())
        hist.lr.append(lr)
        hist.steps_done = step + 1
        out_of_time = _out_of_time(cfg, hist.seconds + time.perf_counter() - t0, ranks, device)
        last = step == cfg.max_steps - 1 or out_of_time
        if evaluate is not None and ((step + 1) % cfg.eval_interval == 0 or last):
            hist.seconds += time.perf_counter() - t0  # evaluation time is not training time
            hist.grad_norm += torch.stack(norms).tolist()
            norms.clear()
            hist.eval_step.append(step + 1)
            with eval_mode(module):
                figures = evaluate(module)
            for name, value in figures.items():
                hist.evals.setdefault(name, []).append(float(value))
            bar.set_postfix(loss=hist.train_loss[-1], **{k: float(v) for k, v in figures.items()})
            t0 = time.perf_counter()
        if out_of_time:
            break
    hist.seconds += time.perf_counter() - t0
    hist.grad_norm += torch.stack(norms).tolist() if norms else []
    return hist
