"""Benchmark results as the book reads them: the JSON files ``bench/`` writes, their targets, and
whether they still describe the code.

Shared infrastructure of the *Performance* page and of the chapters that quote a benchmark (language
models, vision). Each ``bench/*.py`` script ends with one JSON line holding its figures, its
``targets`` (``{"name": [op, value]}``), the ``machine``, the ``commit`` it ran at and the ``date``;
``make bench`` stores it as ``bench/results/<device>/<name>.json``.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
from dataclasses import dataclass

__all__ = ["Result", "load", "met", "staleness"]

OPS = {"<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b, "==": lambda a, b: a == b}


@dataclass(frozen=True)
class Result:
    """One benchmark run: ``name`` (the script), ``device`` and its JSON ``data``."""

    name: str
    device: str
    data: dict

    def __getitem__(self, key: str):
        return self.data[key]


def load(root: str | pathlib.Path, device: str = "cpu") -> dict[str, Result]:
    """Every ``bench/results/<device>/*.json`` under the repository ``root``, by script name."""
    folder = pathlib.Path(root) / "bench" / "results" / device
    return {
        p.stem: Result(p.stem, device, json.loads(p.read_text()))
        for p in sorted(folder.glob("*.json"))
    }


def met(result: Result, key: str) -> bool:
    """Whether the figure ``key`` meets its target (a ``KeyError`` when it has none)."""
    op, target = result["targets"][key]
    if op not in OPS:
        raise ValueError(f"unknown comparison {op!r} in the targets of {result.name}")
    return OPS[op](result[key], target)


def staleness(result: Result, root: str | pathlib.Path) -> str | None:
    """``None`` when the result was measured at a commit that contains the latest change to ``src/``
    and ``bench/`` (results excluded); otherwise a sentence saying why it may not describe the code.

    Uses ``git``; without it, or in a shallow clone that lacks the commits, the sentence says that
    the age cannot be checked.
    """
    commit = str(result["commit"])
    if commit.endswith("+changes"):
        return f"measured with uncommitted changes on top of {commit.removesuffix('+changes')}"

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
        )

    try:
        last = git("log", "-1", "--format=%h", "--", "src", "bench", ":!bench/results")
    except OSError:
        return "git is not available, so the age of the result cannot be checked"
    last_change = last.stdout.strip()
    if last.returncode != 0 or not last_change:
        return "the repository's history is not available, so the age cannot be checked"
    if git("merge-base", "--is-ancestor", last_change, commit).returncode == 0:
        return None
    if git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        return f"commit {commit} is not in this clone's history, so the age cannot be checked"
    return f"measured at {commit}, older than the latest change to the code ({last_change})"
