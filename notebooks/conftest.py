"""The labs' time budget, enforced where nbval runs them: each lab, from kernel start to its last cell,
must take under a minute on a 2-core CPU (CONTRIBUTING.md). The run ends with the slowest labs listed,
and fails when one is over budget. ``LAB_BUDGET_S`` changes the budget (e.g. on a slower machine)."""

from __future__ import annotations

import collections
import os
import pathlib

BUDGET_S = float(os.environ.get("LAB_BUDGET_S", "60"))
_seconds: dict[str, float] = collections.defaultdict(float)


def pytest_runtest_logreport(report) -> None:
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        _seconds[pathlib.Path(path).name] += (
            report.duration
        )  # setup, call and teardown of each cell


def _over_budget() -> list[str]:
    return [lab for lab, s in _seconds.items() if s > BUDGET_S]


def pytest_terminal_summary(terminalreporter) -> None:
    if not _seconds:
        return
    terminalreporter.section(f"lab run times (budget {BUDGET_S:.0f} s each)")
    for lab, s in sorted(_seconds.items(), key=lambda kv: -kv[1]):
        flag = "   OVER BUDGET" if s > BUDGET_S else ""
        terminalreporter.write_line(f"{s:7.1f} s  {lab}{flag}")


def pytest_sessionfinish(session, exitstatus) -> None:
    if _over_budget() and exitstatus == 0:
        session.exitstatus = 1  # an over-budget lab fails the run even when every cell passed
