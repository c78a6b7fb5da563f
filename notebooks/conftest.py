"""The labs' time budget, enforced where nbval runs them: each lab, from kernel start to its last cell,
must take about a minute at most on a 2-core CPU (CONTRIBUTING.md). The run ends with the slowest labs
listed, and fails when one is over budget. ``LAB_BUDGET_S`` changes the budget (e.g. on a slower
machine).

What is measured is the CPU time of the lab's kernel (user and system, read from ``/proc``), not the
wall time, so the budget means the same when the labs run beside other tests (``make test`` runs them
on both cores with other jobs, each process on one thread, ``OMP_NUM_THREADS=1``). One thread's CPU time
is what the lab costs on one core; on two cores a lab runs faster by the speed-up of its second thread,
which the course's heavy labs measured at 1.0 to 1.6 (CPU time on one thread against wall time on two
idle cores: lab 14 58 s and 37 s, lab 7 38 s and 24 s, lab 9 30 s and 21 s, lab 10 30 s and 30 s). The
budget, 75 CPU-seconds, is a minute on two cores at a speed-up of 1.25. Where ``/proc`` is missing
(macOS) the wall time is measured instead, against the same number.
"""

from __future__ import annotations

import collections
import os
import pathlib

import pytest

BUDGET_S = float(os.environ.get("LAB_BUDGET_S", "75"))
_cpu: dict[str, float] = {}  # the kernel's CPU seconds at its latest cell
_wall: dict[str, float] = collections.defaultdict(float)  # the summed durations of the cells
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# The labs that compute longest (the kernel CPU times above), collected first: on several workers
# (``--dist loadfile``) a long lab started last would leave the other cores idle at the end. Labs 8,
# 14 and 9 come after the others: in ``make test`` they reuse their chapters' runs (``reusable_run``;
# a lab that gets there while the book trains the run waits for it), and the later they start, the
# likelier the run is ready.
SLOW_FIRST = ["07_language_models", "10_training", "08_encoder_decoder", "14_masked", "09_vision"]


def pytest_collection_modifyitems(items) -> None:
    order = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: order.get(pathlib.Path(str(item.fspath)).stem, len(order)))


def _kernel_cpu_seconds(item) -> float | None:
    """User + system CPU seconds of the kernel running ``item``'s notebook, or ``None``."""
    try:
        pid = item.parent.kernel.km.provisioner.process.pid
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (AttributeError, OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "call" and str(item.fspath).endswith(".ipynb"):
        cpu = _kernel_cpu_seconds(item)
        if cpu is not None:  # travels to the controller under pytest-xdist
            outcome.get_result().user_properties.append(("kernel_cpu_s", cpu))


def pytest_runtest_logreport(report) -> None:
    path = report.nodeid.split("::", 1)[0]
    if not path.endswith(".ipynb"):
        return
    name = pathlib.Path(path).name
    _wall[name] += report.duration  # setup, call and teardown of each cell
    cpu = dict(report.user_properties).get("kernel_cpu_s")
    if cpu is not None:
        _cpu[name] = max(_cpu.get(name, 0.0), cpu)


def _times() -> dict[str, tuple[float, str]]:
    return {lab: (_cpu[lab], "CPU") if lab in _cpu else (s, "wall") for lab, s in _wall.items()}


def _over_budget() -> list[str]:
    return [lab for lab, (s, _) in _times().items() if s > BUDGET_S]


def pytest_terminal_summary(terminalreporter) -> None:
    if not _wall:
        return
    terminalreporter.section(f"lab run times (budget {BUDGET_S:.0f} s each)")
    for lab, (s, kind) in sorted(_times().items(), key=lambda kv: -kv[1][0]):
        flag = "   OVER BUDGET" if s > BUDGET_S else ""
        terminalreporter.write_line(f"{s:7.1f} s  {lab} ({kind} time of its kernel){flag}")


def pytest_sessionfinish(session, exitstatus) -> None:
    if _over_budget() and exitstatus == 0:
        session.exitstatus = 1  # an over-budget lab fails the run even when every cell passed
