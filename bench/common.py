"""Shared helpers of the bench/ scripts: timing, machine description, the final JSON line."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable

import torch


def machine(device: torch.device) -> str:
    """A one-line description of where the figures were measured."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (torch {torch.__version__})"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return f"{cpu}, {torch.get_num_threads()} torch threads (torch {torch.__version__})"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_medians(
    fns: dict[str, Callable[[], object]], device: torch.device, repeats: int, warmup: int = 3
) -> dict[str, float]:
    """Median seconds per call of each function, timed in alternation so drift hits all equally."""
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
    return {name: statistics.median(ts) for name, ts in times.items()}


def _commit() -> str:
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
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def report(results: dict) -> None:
    """Print the results as the last line: one JSON object (with the commit and the date added)."""
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    results = {
        **results,
        "commit": _commit(),
        "date": datetime.date.today().isoformat(),
        "load_average_1_5_15min": load,  # other work on the machine slows every timing
    }
    print(json.dumps(results, sort_keys=True))
