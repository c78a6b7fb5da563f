"""Claims: runs and results."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..data import get_batch
from ..runtime import machine
from ..train import train
from .model import ClaimsConfig
from .recipes import ClaimsRecipe, _corpus, _held_out, _recipe, _schedule, _setting_name
from .stats import paired_t_interval, sign_test


@dataclass
class Run:
    """One training run: the variant, the seed, the final held-out loss (``None`` if the run
    diverged, at step ``diverged_at``), the parameter count, the training seconds, the training loss
    averaged over twenty equal stretches of the steps (``curve``) and the claim's own figures
    (``extra``)."""

    variant: str
    seed: int
    val_loss: float | None
    diverged_at: int | None = None
    params: int = 0
    seconds: float = 0.0
    curve: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str) -> Any:
        """``val_loss``, ``params``, ``seconds``, ``train_loss_final`` (the training loss of the last
        stretch of ``curve``; ``None`` for a diverged run) or a key of ``extra``."""
        if key in ("val_loss", "params", "seconds"):
            return getattr(self, key)
        if key == "train_loss_final":
            return self.curve[-1] if self.val_loss is not None and self.curve else None
        if key not in self.extra:
            raise KeyError(f"run has no figure {key!r}; it has val_loss, params, seconds, "
                           f"train_loss_final, {', '.join(sorted(self.extra))}")  # fmt: skip
        return self.extra[key]


@dataclass(frozen=True)
class PairedComparison:
    """A variant against the baseline, seed by seed (:meth:`ClaimResult.compare`): the per-seed
    differences ``variant - baseline``, their mean, standard deviation, ``confidence`` t-interval,
    the exact sign test's ``p``, and how many seeds came out lower / higher. Seeds where either run
    diverged are left out and listed in ``dropped``."""

    variant: str
    baseline: str
    key: str
    seeds: tuple[int, ...]
    diffs: tuple[float, ...]
    mean: float
    sd: float
    low: float
    high: float
    confidence: float
    p_sign: float
    lower: int
    higher: int
    dropped: tuple[int, ...] = ()

    def describe(self) -> str:
        d = ", ".join(f"{x:+.3f}" for x in self.diffs)
        text = (
            f"{self.variant} - {self.baseline} ({self.key}), per seed: {d}\n"
            f"  mean {self.mean:+.4f}, sd {self.sd:.4f}, {self.confidence:.0%} t-interval "
            f"[{self.low:+.4f}, {self.high:+.4f}]; lower in {self.lower} of {len(self.diffs)} seeds, "
            f"sign test p = {self.p_sign:.3f}"
        )
        if self.dropped:
            text += f"; seeds {list(self.dropped)} left out (a run diverged)"
        return text


SELECTION = {"loss_beyond": "loss_in_range"}
"""The figure a learning rate is chosen on, for a claim judged by another (:attr:`ClaimResult.selection`):
the length claim, judged beyond the training length, chooses its rates on the loss inside it."""


@dataclass
class ClaimResult:
    """Every run of one claim, with what it was run on. ``metric`` is the figure the claim is judged
    by (lower is better), ``baseline`` the variant the others are compared with."""

    claim: str
    setting: str
    metric: str
    baseline: str
    variants: list[str]
    runs: list[Run]
    machine: str = ""
    device: str = "cpu"
    seconds: float = 0.0
    recipe: dict[str, Any] = field(default_factory=dict)
    commit: str = ""
    date: str = ""

    @property
    def selection(self) -> str:
        """The figure each arm's learning rate is chosen on (:func:`.recorded.best_rates`): the loss
        inside the training length for the length claim (:data:`SELECTION`), whose compared figure,
        the loss beyond it, is lowest for the models that learned least; otherwise the training loss
        of the last twentieth of the steps, measured on training batches, not on the held-out ones.
        This avoids that systematic trap, not the luck of the runs: both figures come from the same
        runs, so choosing on one still flatters the other (:func:`.recorded.at_best_rates` with
        ``leave_one_out=True`` avoids that too)."""
        return SELECTION.get(self.metric, "train_loss_final")

    def values(self, variant: str, key: str | None = None) -> dict[int, Any]:
        """``{seed: figure}`` of one variant (``None`` for a diverged run's losses)."""
        if variant not in self.variants:
            raise KeyError(f"no variant {variant!r}; this claim has {self.variants}")
        return {r.seed: r.get(key or self.metric) for r in self.runs if r.variant == variant}

    def compare(
        self, variant: str, baseline: str | None = None, key: str | None = None,
        confidence: float = 0.95,
    ) -> PairedComparison:  # fmt: skip
        """``variant`` against ``baseline`` (default: the claim's), seed by seed, on ``key``."""
        baseline, key = baseline or self.baseline, key or self.metric
        x, y = self.values(baseline, key), self.values(variant, key)
        seeds = sorted(set(x) & set(y))
        kept = [s for s in seeds if x[s] is not None and y[s] is not None]
        dropped = tuple(s for s in seeds if s not in kept)
        xs, ys = [x[s] for s in kept], [y[s] for s in kept]
        mean, low, high = paired_t_interval(xs, ys, confidence)
        diffs = [b - a for a, b in zip(xs, ys, strict=True)]
        sd = torch.tensor(diffs, dtype=torch.float64).std().item()
        return PairedComparison(
            variant, baseline, key, tuple(kept), tuple(diffs), mean, sd, low, high, confidence,
            sign_test(xs, ys), sum(d < 0 for d in diffs), sum(d > 0 for d in diffs), dropped,
        )  # fmt: skip

    def table(self, key: str | None = None) -> str:
        """Every seed of every variant, then mean and standard deviation over the seeds."""
        key = key or self.metric
        seeds = sorted({r.seed for r in self.runs})
        width = max(len(key), *(len(v) for v in self.variants)) + 2
        lines = [f"{key:<{width}}" + "".join(f"seed {s:<5}" for s in seeds) + "  mean     sd"]
        for v in self.variants:
            vals = self.values(v, key)
            cells = "".join(
                f"{'diverged':<10}" if vals.get(s) is None else f"{vals[s]:<10.4f}" for s in seeds
            )
            ok = [x for x in vals.values() if x is not None]
            t = torch.tensor(ok, dtype=torch.float64)
            sd = t.std().item() if len(ok) > 1 else float("nan")
            mean = t.mean().item() if ok else float("nan")
            lines.append(f"{v:<{width}}{cells}  {mean:<8.4f} {sd:.4f}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClaimResult:
        data = dict(data)
        data["runs"] = [Run(**r) for r in data["runs"]]
        return cls(**data)


@dataclass(frozen=True)
class Variant:
    """One arm of a claim: its ``name``, a function building the model from the (possibly changed)
    :class:`ClaimsConfig`, changes to that config (``config``, e.g. ``{"n_layers": 6}``), whether
    training warms the learning rate up, and the training batch size (``None``: the recipe's; the
    held-out batches are the same for every arm)."""

    name: str
    build: Callable[[ClaimsConfig], nn.Module]
    config: Mapping[str, Any] = field(default_factory=dict)
    warmup: bool = True
    batch_size: int | None = None


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 5)
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def _curve(losses: list[float], bins: int = 20) -> list[float]:
    if not losses:
        return []
    k = max(1, math.ceil(len(losses) / bins))
    return [
        round(sum(losses[i : i + k]) / len(losses[i : i + k]), 4) for i in range(0, len(losses), k)
    ]


def run_variants(
    claim: str,
    variants: Sequence[Variant],
    setting: str | ClaimsRecipe = "small",
    seeds: Sequence[int] | None = None,
    device: torch.device | str = "cpu",
    steps: int | None = None,
    measure: Callable[[nn.Module, str, ClaimsConfig], dict[str, Any]] | None = None,
    metric: str = "val_loss",
    log: Callable[[str], None] | None = None,
) -> ClaimResult:
    """Train every variant once per seed and collect the runs: the engine of every claim.

    For each seed ``s``: ``torch.manual_seed(s)``, build the variant's model, train it with
    :func:`.train.train` (the training batches drawn from a generator seeded with ``s``, so all
    variants see the same batches), and evaluate the mean loss on the fixed held-out batches.
    ``measure(model, when, config)``, if given, returns figures at ``when = "init"`` (before training)
    and ``"final"``; they go into :attr:`Run.extra`. A run whose loss becomes NaN or inf is recorded
    as diverged, not raised. ``log`` receives one line per run.
    """
    recipe = _recipe(setting)
    seeds = tuple(recipe.seeds if seeds is None else seeds)
    if not seeds or not variants:
        raise ValueError("need at least one seed and one variant")
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"variant names must differ, got {names}")
    train_ids, _, vocab = _corpus()
    device = torch.device(device)
    t_start = time.perf_counter()
    runs = []
    for seed in seeds:
        for v in variants:
            cfg = dataclasses.replace(recipe.model, vocab_size=vocab, **dict(v.config))
            C, B = cfg.block_size, v.batch_size or recipe.batch_size
            held_out = _held_out(C, recipe, device)
            torch.manual_seed(seed)
            model = v.build(cfg).to(device)
            extra: dict[str, Any] = {}
            if measure is not None:
                extra.update(measure(model, "init", cfg))

            def loss_fn(m: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
                return m(*batch)[1]

            def evaluate(m: nn.Module, held_out=held_out) -> dict[str, float]:
                return {"val_loss": sum(loss_fn(m, b).item() for b in held_out) / len(held_out)}

            tcfg = _schedule(recipe, steps, v.warmup, seed)
            diverged_at = None
            try:
                hist = train(model, lambda g, C=C, B=B: get_batch(train_ids, C, B, g, device),
                             loss_fn, tcfg, evaluate, progress=False)  # fmt: skip
                val_loss, losses, seconds = (
                    hist.evals["val_loss"][-1],
                    hist.train_loss,
                    hist.seconds,
                )
            except FloatingPointError as err:
                diverged_at = int(str(err).split(" at step ")[1].split()[0])
                val_loss, losses, seconds = None, [], 0.0
            if diverged_at is None and measure is not None:
                extra.update(measure(model, "final", cfg))
            params = sum(p.numel() for p in model.parameters())
            runs.append(Run(v.name, seed, None if val_loss is None else round(val_loss, 5),
                            diverged_at, params, round(seconds, 3), _curve(losses),
                            {k: _rounded(x) for k, x in extra.items()}))  # fmt: skip
            if log is not None:
                figure = val_loss if metric == "val_loss" else extra.get(metric)
                shown = "diverged" if figure is None else f"{figure:.4f}"
                log(f"{claim} | {v.name} | seed {seed}: {metric}={shown} ({seconds:.1f} s)")
    return ClaimResult(
        claim=claim, setting=_setting_name(recipe),
        metric=metric, baseline=names[0], variants=names, runs=runs, machine=machine(device),
        device=str(device), seconds=round(time.perf_counter() - t_start, 2),
        recipe=json.loads(json.dumps(dataclasses.asdict(recipe) | {"steps": tcfg.max_steps})),
    )  # fmt: skip
