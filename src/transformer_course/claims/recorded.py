"""Claims: recorded results and a figure."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..results import load as load_results
from .runs import ClaimResult, PairedComparison


def load_recorded(root: str | pathlib.Path, device: str = "cpu") -> dict[str, ClaimResult]:
    """The recorded runs of ``bench/claims.py``: ``bench/results/<device>/claims.json`` (every claim,
    one run of the script, read by :func:`.results.load`) and any
    ``bench/results/<device>/claims/<name>.json`` (one claim rerun alone, which wins). Each result
    carries the commit and date of its run. Returns ``{}`` when nothing has been recorded."""
    datas = []
    whole = load_results(root, device).get("claims")
    if whole is not None:
        datas.append(whole.data)
    for path in sorted(
        (pathlib.Path(root) / "bench" / "results" / device / "claims").glob("*.json")
    ):
        datas.append(json.loads(path.read_text()))
    found: dict[str, ClaimResult] = {}
    for data in datas:
        for name, result in data["claims"].items():
            found[name] = dataclasses.replace(
                ClaimResult.from_json(result),
                commit=str(data.get("commit", "")), date=str(data.get("date", "")),
            )  # fmt: skip
    return found


def load_lr_grid(
    root: str | pathlib.Path, device: str = "cpu"
) -> dict[str, dict[float, ClaimResult]]:
    """Every recorded learning rate of every claim: ``{claim: {lr: ClaimResult}}``, from the recorded
    runs (:func:`load_recorded`, the recipe's rate) and ``bench/results/<device>/claims-lr/*.json``
    (``bench/claims.py --lr``, one file per rate). The rate is read from each result's recipe."""
    grid: dict[str, dict[float, ClaimResult]] = {}
    for name, result in load_recorded(root, device).items():
        grid.setdefault(name, {})[float(result.recipe["train"]["lr"])] = result
    for path in sorted(
        (pathlib.Path(root) / "bench" / "results" / device / "claims-lr").glob("*.json")
    ):
        data = json.loads(path.read_text())
        for name, raw in data["claims"].items():
            result = dataclasses.replace(
                ClaimResult.from_json(raw), commit=str(data.get("commit", "")),
                date=str(data.get("date", "")),
            )  # fmt: skip
            grid.setdefault(name, {})[float(result.recipe["train"]["lr"])] = result
    return grid


def _mean_or_inf(values: Mapping[int, Any]) -> float:
    """The mean over the seeds, or ``inf`` if any run diverged (a rate that diverges is not best)."""
    if not values or any(v is None for v in values.values()):
        return math.inf
    return sum(values.values()) / len(values)


def best_rates(
    grid: Mapping[float, ClaimResult], select: str | None = None, leave_out: int | None = None
) -> dict[str, float]:
    """Each variant's best learning rate in ``grid`` (``{lr: ClaimResult}`` of one claim): the rate
    with the lowest mean over the seeds of the figure ``select`` (default: the claim's
    :attr:`ClaimResult.selection`), a rate where a run diverged never being chosen. ``leave_out``: a
    seed whose runs are ignored (the leave-one-seed-out choice of :func:`at_best_rates`). Only
    variants recorded at every rate are ranked; ties go to the smaller rate."""
    results = [grid[lr] for lr in sorted(grid)]
    if not results:
        raise ValueError("the grid is empty: record the claim at some rate first")
    select = select or results[0].selection
    variants = [v for v in results[0].variants if all(v in r.variants for r in results)]
    best = {}
    for v in variants:
        means = {}
        for lr in sorted(grid):
            values = {s: x for s, x in grid[lr].values(v, select).items() if s != leave_out}
            means[lr] = _mean_or_inf(values)
        best[v] = min(means, key=lambda lr: (means[lr], lr))
    return best


def at_best_rates(
    grid: Mapping[float, ClaimResult], variant: str, baseline: str, key: str | None = None,
    select: str | None = None, leave_one_out: bool = False,
) -> PairedComparison:  # fmt: skip
    """``variant`` at its own best rate against ``baseline`` at its own, seed by seed, compared on
    ``key`` (default: the claim's figure). The rates are chosen by :func:`best_rates` on ``select``
    (default: the claim's :attr:`ClaimResult.selection`).

    With ``leave_one_out=False`` both rates are chosen on every seed's runs, so each seed's figure is
    compared at a rate its own runs helped to choose: the rate that looked best by the luck of those
    runs flatters them, on the compared figure and, more weakly, on any other figure of the same runs
    (the training loss and the held-out loss of one run share its initial weights and batches). With
    ``leave_one_out=True`` seed ``s`` is compared at the rates chosen on the other seeds' runs alone
    (``best_rates(grid, select, leave_out=s)``), so no seed's figure helped to choose its own rate;
    the rates may then differ from seed to seed. Either way the t-interval treats the per-seed
    differences as independent, which a choice shared by the seeds makes only approximately true.
    """
    ranked = best_rates(grid, select)  # raises on an empty grid
    for v in (variant, baseline):
        if v not in ranked:
            raise KeyError(
                f"{v!r} is not recorded at every rate of {sorted(grid)}; ranked: {sorted(ranked)}"
            )
    seeds = sorted(
        {r.seed for lr in grid for r in grid[lr].runs if r.variant in (variant, baseline)}
    )
    choices = {s: best_rates(grid, select, s) if leave_one_out else ranked for s in seeds}
    runs = []
    for s in seeds:
        for v in (baseline, variant):
            runs += [r for r in grid[choices[s][v]].runs if r.variant == v and r.seed == s]
    first = grid[choices[seeds[0]][baseline]]
    merged = dataclasses.replace(first, variants=[baseline, variant], baseline=baseline, runs=runs)
    return merged.compare(variant, baseline, key)


def plot_seeds(
    result: ClaimResult, key: str | None = None, variants: Sequence[str] | None = None,
    ax=None, labels: Mapping[str, str] | None = None,
):  # fmt: skip
    """Every seed of every variant as a dot, the runs of one seed joined by a grey line (the paired
    design), and each variant's mean with a bar of one standard deviation. Diverged runs are marked
    with an ``x`` at the top of the axes. Returns the axes."""
    import matplotlib.pyplot as plt

    key = key or result.metric
    variants = list(variants or result.variants)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.6 + 1.3 * len(variants), 3.2))
    per = [result.values(v, key) for v in variants]
    seeds = sorted({s for p in per for s in p})
    finite = [x for p in per for x in p.values() if x is not None]
    top = max(finite) if finite else 1.0
    for s in seeds:
        ys = [p.get(s) for p in per]
        xs = [i for i, y in enumerate(ys) if y is not None]
        ax.plot(xs, [ys[i] for i in xs], color="0.75", lw=0.8, zorder=1)
    for i, p in enumerate(per):
        ok = [x for x in p.values() if x is not None]
        ax.scatter([i] * len(ok), ok, s=18, color=f"C{i}", zorder=2)
        if len(ok) < len(p):
            ax.scatter([i] * (len(p) - len(ok)), [top] * (len(p) - len(ok)), marker="x",
                       color="red", zorder=3)  # fmt: skip
        if ok:
            t = torch.tensor(ok, dtype=torch.float64)
            sd = t.std().item() if len(ok) > 1 else 0.0
            ax.errorbar(i + 0.18, t.mean().item(), yerr=sd, fmt="s", color=f"C{i}", ms=5, capsize=3)
    names = [(labels or {}).get(v, v) for v in variants]
    ax.set_xticks(range(len(variants)), names, rotation=20 if len(variants) > 3 else 0)
    ax.set_xlim(-0.5, len(variants) - 0.3)
    ax.set_ylabel(key.replace("_", " "))
    return ax
