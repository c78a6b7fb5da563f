"""One training loop for the course: AdamW, warm-up and cosine decay, clipping, periodic evaluation,
gradient accumulation, bfloat16 autocast, and checkpoints to resume from.

Shared infrastructure: chapter *Autoregressive language models* uses it first, then every chapter that
trains a model. The loop is model-agnostic: it takes a function that draws a batch and a function that
turns a batch into a loss. It never picks a device (the caller does); by default it autocasts to
bfloat16 on CUDA only (``TrainConfig.autocast`` asks for it on any device, or never). A batch can be
split into micro-batches whose gradients add up (``TrainConfig.accumulate``,
:func:`accumulate_backward`), and a run can be saved and resumed bit for bit (``checkpoint_path=``,
``resume_from=``; the file's contents are in :mod:`.checkpoint`). A :class:`Recipe` holds every
setting of one model's training run; each model's module defines its recipes and the function that
runs one, which the benchmarks and the book pages both call.

The same loop runs data-parallel under ``torchrun`` (chapter *Training*): when ``torch.distributed`` is
initialised, :func:`train` wraps the model in ``DistributedDataParallel`` (or accepts one already
wrapped), every rank draws the same **global** batch from the seeded generator and keeps its own
contiguous share (:func:`shard`), each rank's loss is weighted by the share of the scored positions it
holds (:func:`share_weight`: padding makes shares unequal), DDP averages the gradients, and the loss it
logs is the global batch's mean. Single-process runs are untouched by this.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm  # plain text bar: no ipywidgets needed in notebooks

from .checkpoint import resume, save_checkpoint
from .runtime import eval_mode

__all__ = [
    "History",
    "Recipe",
    "TrainConfig",
    "accumulate_backward",
    "autocast_context",
    "global_grad_norm",
    "lr_at",
    "make_optimizer",
    "shard",
    "share_weight",
    "train",
]


AUTOCAST = ("auto", "bfloat16", None)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings. ``min_lr`` defaults to ``lr / 10``; ``time_budget_s`` stops early.

    ``accumulate`` splits every batch into that many micro-batches whose gradients add up before the
    step (:func:`accumulate_backward`, book eq. ``eq-train-accum``): the same update with a
    ``1/accumulate`` of the activations in memory. ``autocast`` says where the forward pass runs under
    ``torch.autocast`` in bfloat16 (:func:`autocast_context`): ``"auto"`` on CUDA only (the default),
    ``"bfloat16"`` on any device, the CPU included, ``None`` never.
    """

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
    accumulate: int = 1
    autocast: str | None = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.accumulate, bool) or not isinstance(self.accumulate, int):
            raise ValueError(
                f"accumulate must be a whole number of micro-batches, got {self.accumulate!r}"
            )
        if self.accumulate < 1:
            raise ValueError(f"accumulate must be >= 1 (1: no accumulation), got {self.accumulate}")
        if self.autocast not in AUTOCAST:
            raise ValueError(
                f"autocast must be one of {AUTOCAST} (bfloat16 on CUDA only, on any device, "
                f"never), got {self.autocast!r}"
            )


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

    With ``u = step + 1`` the update's number, ``u_w`` = ``warmup_steps`` and ``u_max`` = ``max_steps``:

    .. math:: \eta_u = \eta\,\frac{u}{u_\text{w}}\ (u \le u_\text{w}),\qquad
              \eta_u = \eta_\min + \tfrac12(\eta - \eta_\min)
              \Big(1 + \cos\frac{\pi (u - 1 - u_\text{w})}{u_\text{max} - u_\text{w}}\Big)

    The peak ``lr`` is used twice (updates ``u_w`` and ``u_w + 1``) and the last update stops one
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


def _scored_total(n: list[int], ranks: tuple[int, int] | None, device) -> int:
    """The positions scored by the whole (global) batch, checking that every micro-batch scores one;
    under DDP every rank learns every count, so all of them reach the same verdict."""
    counts = [n]
    if ranks is not None:
        mine = torch.tensor([float(c) for c in n], device=device)
        every = [torch.zeros_like(mine) for _ in range(ranks[1])]
        dist.all_gather(every, mine)
        counts = [[int(c) for c in t.tolist()] for t in every]
    if min(min(c) for c in counts) <= 0:
        raise ValueError(
            f"scored positions per micro-batch {counts} (per rank): every micro-batch must score at "
            "least one position; use fewer micro-batches (accumulate), fewer ranks or a larger batch"
        )
    return sum(sum(c) for c in counts)


def accumulate_backward(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, tuple[Tensor, ...]], Tensor],
    batch: tuple[Tensor, ...],
    n_micro: int = 1,
    scored: Callable[[tuple[Tensor, ...]], int | Tensor] | None = None,
    ranks: tuple[int, int] | None = None,
    cast: contextlib.AbstractContextManager | None = None,
) -> Tensor:
    r"""Backpropagate the mean loss of ``batch`` in ``n_micro`` micro-batches, whose gradients add up in
    ``.grad``; return the batch's mean loss (detached). Only one micro-batch's activations are in
    memory at a time.

    .. math:: \nabla_\theta \mathcal{L} = \sum_{i=1}^{n_\text{micro}} \frac{|\mathcal{P}_i|}{|\mathcal{P}|}
              \nabla_\theta \mathcal{L}_i

    Micro-batch ``i``, the ``i``-th contiguous ``1/n_micro`` of the batch (:func:`shard`), scores
    ``scored(micro_batch)`` positions :math:`\mathcal{P}_i` (without ``scored``, all count as equal:
    right for full windows) with mean loss :math:`\mathcal{L}_i` = ``loss_fn`` (its forward pass in
    ``cast``). Under DDP (``ranks``) all ranks' micro-batches are weighted together (eq.
    ``eq-train-ddp``) and the gradients are averaged once, after the last one.

    Implements: eq-train-accum

    Raises:
        ValueError: the batch does not split into ``n_micro`` micro-batches, or one scores no position.
    """
    B = next(t.shape[0] for t in batch if isinstance(t, Tensor) and t.dim() > 0)
    if B % n_micro:
        raise ValueError(
            f"a batch of {B} does not split into {n_micro} equal micro-batches; choose accumulate among "
            f"the divisors of the batch size {[d for d in range(1, B + 1) if B % d == 0]}"
        )
    micro = [shard(batch, i, n_micro) for i in range(n_micro)] if n_micro > 1 else [batch]
    n = [1] * n_micro if scored is None else [int(scored(mb)) for mb in micro]  # |P_i|
    world = 1 if ranks is None else ranks[1]
    n_total = _scored_total(n, ranks, next(model.parameters()).device)  # |P|, every rank's
    logged = None
    for i, mb in enumerate(micro):
        last = i == n_micro - 1  # DDP averages the gradients over the ranks only after the last one
        quiet = model.no_sync() if isinstance(model, DistributedDataParallel) and not last else None
        with quiet or contextlib.nullcontext():
            with cast or contextlib.nullcontext():
                loss = loss_fn(model, mb)  # L_i: mean over P_i, eq. (eq-train-ce)
            w = share_weight(n[i], n_total, world)  # |P_i|/|P|, x n_ranks under DDP (eq-train-ddp)
            (loss if w == 1.0 else loss * w).backward()  # adds to .grad
        part = loss.detach().to(torch.promote_types(loss.dtype, torch.float32), copy=True)
        part *= n[i] / n_total
        logged = part if logged is None else logged + part
    if ranks is not None:
        dist.all_reduce(logged)  # the sum over the ranks: the global batch's mean loss
    return logged


def autocast_context(cfg: TrainConfig, device: torch.device) -> torch.autocast:
    """``torch.autocast`` to bfloat16 on ``device`` where ``cfg.autocast`` asks for it: ``"auto"``
    on CUDA only, ``"bfloat16"`` on any device, ``None`` nowhere (a context that does nothing).

    Inside it PyTorch runs the matrix products (``nn.Linear``, ``matmul``, attention) in bfloat16 and
    keeps the operations that need the range or precision of float32 (LayerNorm, softmax and the loss
    on CUDA; the lists differ by device, book sec. *Mixed precision*) in float32; the weights, their
    gradients and the optimiser's state stay float32."""
    enabled = cfg.autocast == "bfloat16" or (cfg.autocast == "auto" and device.type == "cuda")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def _distributed() -> tuple[int, int] | None:
    """``(rank, world_size)`` when ``torch.distributed`` is initialised, else ``None``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _flush_norms(hist: History, norms: list[Tensor]) -> None:
    """Move the gradient norms kept as tensors into the history (one host synchronisation)."""
    hist.grad_norm += torch.stack(norms).tolist() if norms else []
    norms.clear()


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
    checkpoint_path: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    resume_from: str | os.PathLike | None = None,
    run_config: dict | None = None,
) -> History:
    """Train ``model`` in place with AdamW, the learning rate of :func:`lr_at` and clipping by the
    global norm; return its :class:`History`.

    ``next_batch(generator)`` draws a batch on the model's device from the seeded generator;
    ``loss_fn(model, batch)`` returns the mean loss over the batch's scored positions, ``scored(batch)``
    their number; ``evaluate(model)`` (eval mode, no gradients, every ``cfg.eval_interval`` steps and
    at the end) returns named figures such as ``{"val_loss": 1.62}``. ``cfg.accumulate`` splits each
    batch into micro-batches (:func:`accumulate_backward`), ``cfg.autocast`` picks bfloat16.
    ``checkpoint_path`` saves the run every ``checkpoint_every`` steps and at its end;
    ``resume_from`` continues a saved run exactly, refusing other settings (``cfg``, ``run_config``).

    Under ``torch.distributed`` the model is wrapped in ``DistributedDataParallel``, every rank trains
    on its :func:`shard` of the same global batch, weighted by :func:`share_weight` (book eq.
    ``eq-train-ddp``); rank 0 shows the progress bar and writes the checkpoints.

    Raises:
        FloatingPointError: the loss became NaN or infinite; its ``history`` holds the run so far.
        ValueError: no ``scored`` under ``torch.distributed``; a share or micro-batch without a scored
            position; a checkpoint of another run or model shape, or no checkpoint at all.
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
    cast = autocast_context(cfg, device)  # bfloat16 on CUDA unless cfg.autocast says otherwise
    start, hist, norms = 0, History(), []  # norms are read back in groups: no host sync per step
    if resume_from is not None:  # weights, AdamW's moments, the step, batches and RNGs as saved
        start, saved = resume(resume_from, model=module, optimizer=opt, generator=gen, config=cfg,
                              run=run_config)  # fmt: skip
        hist = History(**saved)
    show = progress and (ranks is None or ranks[0] == 0)
    bar = tqdm(range(start, cfg.max_steps), desc="training", disable=not show, leave=False)
    t0 = time.perf_counter()
    for step in bar:
        lr = lr_at(step, cfg)  # eq. (eq-train-schedule)
        for group in opt.param_groups:
            group["lr"] = lr
        model.train()
        batch = next_batch(gen) if ranks is None else shard(next_batch(gen), *ranks)
        opt.zero_grad(set_to_none=True)
        logged = accumulate_backward(model, loss_fn, batch, cfg.accumulate, scored, ranks, cast)
        if not torch.isfinite(logged):  # the same verdict on every rank, so all of them stop
            hist.seconds += time.perf_counter() - t0
            _flush_norms(hist, norms)
            raise _diverged(step, lr, logged, hist)
        clip = cfg.grad_clip if cfg.grad_clip is not None else math.inf  # eq. (eq-train-clip)
        norms.append(nn.utils.clip_grad_norm_(module.parameters(), clip).detach())
        opt.step()
        hist.step.append(step)
        hist.train_loss.append(logged.item())
        hist.lr.append(lr)
        hist.steps_done = step + 1
        out_of_time = _out_of_time(cfg, hist.seconds + time.perf_counter() - t0, ranks, device)
        last = step == cfg.max_steps - 1 or out_of_time
        evaluating = evaluate is not None and ((step + 1) % cfg.eval_interval == 0 or last)
        saving = checkpoint_path is not None and (
            last or (checkpoint_every is not None and (step + 1) % checkpoint_every == 0)
        )
        if evaluating or saving:
            hist.seconds += time.perf_counter() - t0  # evaluating and saving are not training
            _flush_norms(hist, norms)
        if evaluating:
            hist.eval_step.append(step + 1)
            with eval_mode(module):
                figures = evaluate(module)
            for name, value in figures.items():
                hist.evals.setdefault(name, []).append(float(value))
            bar.set_postfix(loss=hist.train_loss[-1], **{k: float(v) for k, v in figures.items()})
        if saving and (ranks is None or ranks[0] == 0):  # after evaluating: its RNG use included
            save_checkpoint(checkpoint_path, model=module, optimizer=opt, step=step + 1,
                            generator=gen, history=hist, config=cfg, run=run_config)  # fmt: skip
        if evaluating or saving:
            t0 = time.perf_counter()
        if out_of_time:
            break
    hist.seconds += time.perf_counter() - t0
    _flush_norms(hist, norms)
    return hist
