"""Shared helpers of the bench/ scripts: timing with warm-up and repeats, and the final JSON line.

The machine a figure was measured on is named by ``transformer_course.runtime.machine`` (the one
description the book pages use too).
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_times(
    fns: dict[str, Callable[[], object]], device: torch.device, repeats: int, warmup: int = 3
) -> dict[str, list[float]]:
    """Seconds per call of each function over ``repeats`` rounds, after ``warmup`` untimed rounds;
    the functions alternate within a round so that drift on the machine hits all of them equally."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - t0)
    return times


def interleaved_medians(
    fns: dict[str, Callable[[], object]], device: torch.device, repeats: int, warmup: int = 3
) -> dict[str, float]:
    """Median seconds per call of each function (see :func:`interleaved_times`)."""
    times = interleaved_times(fns, device, repeats, warmup)
    return {name: statistics.median(ts) for name, ts in times.items()}


# Dense bfloat16 tensor-core peaks from the vendors' data sheets (without structured sparsity), in FLOP/s,
# matched against ``torch.cuda.get_device_name`` in this order: the denominator of the model FLOPs
# utilisation that ``bench/lm.py`` reports on a GPU.
BF16_DENSE_PEAK = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H200 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("H200", 989e12),  # SXM
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
)


def bf16_dense_peak(device: torch.device) -> float | None:
    """The data-sheet bfloat16 peak of ``device`` in FLOP/s, or ``None`` (a CPU, or a GPU not listed)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in BF16_DENSE_PEAK if key in name), None)


def commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src", "bench", ":!bench/results"],
            capture_output=True,
            text=True,
        )  # code changes only: the results being written by this run do not count
        return done.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):  # no git, or a copy of the tree without .git
        return os.environ.get("BENCH_COMMIT", "unknown")  # scripts/gpu_checks.sh passes it


def report(results: dict) -> None:
    """Print the results as the last line: one JSON object (with the commit and the date added)."""
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    results = {
        **results,
        "commit": commit(),
        "date": datetime.date.today().isoformat(),
        "load_average_1_5_15min": load,  # other work on the machine slows every timing
    }
    print(json.dumps(results, sort_keys=True))
