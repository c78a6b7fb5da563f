"""Every test of the course on all the machine's cores, with one readable report: ``make test`` runs this
after the linters.

    python scripts/run_tests.py [--jobs N]

Four jobs, run side by side as their inputs allow:

* ``book``: the strict book build (``scripts/build_book.py``: the pages execute ``N`` at a time);
* ``package``: the package's tests (``pytest -n N``, everything but the book and site tests);
* ``labs``: every lab under nbval (``--dist loadfile``: a lab's cells run in order in one kernel), after
  ``package``, so that at most about ``N`` processes compute at once;
* ``site``: the built book's tests and the site in Chromium (``pytest -n N``), after ``book``.

The book and the labs share a store of finished training runs (``_build/run-store``, emptied at the
start; ``tc.runtime.reusable_run``): a run that a chapter and its lab both make with the same arguments
(the masked model, the date translator, the two ViTs of the vision lab) trains once, in whichever job
gets there first; a job that asks for a run the other is training waits for it. The package's tests
never reuse a run.

Each job writes its output to ``_build/test-logs/<job>.log``; this prints a line when a job starts and
when it ends, with its wall time, the CPU time of the processes it ran and waited for (Chromium's
processes in the site job are not waited for, so that figure leaves them out) and pytest's summary;
then the log of any job that failed. Every process computes with one thread (``OMP_NUM_THREADS=1``,
unless set): with the cores shared by several processes, more threads only wait for each other.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent
LOGS = ROOT / "_build" / "test-logs"
BOOK = ROOT / "_build" / "test-book"
RUNS = ROOT / "_build" / "run-store"
# tc.runtime.RUN_STORE_ENV, named here so that this script need not import torch
RUN_STORE_ENV = "TRANSFORMER_COURSE_RUN_STORE"


def jobs(n: int) -> dict[str, dict]:
    py = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--color=no"]
    return {
        "book": {
            "cmd": [
                sys.executable,
                "scripts/build_book.py",
                "--jobs",
                str(n),
                "--path-output",
                str(BOOK),
            ],
            "after": None,
            "env": {RUN_STORE_ENV: str(RUNS)},
        },
        "package": {
            "cmd": [*py, "tests", "-m", "not book and not site", "-n", str(n)],
            "after": None,
        },
        "labs": {
            "cmd": [
                *py,
                "--nbval-lax",
                "--nbval-sanitize-with",
                "tests/nbval_sanitize.cfg",
                "notebooks",
                "-n",
                str(n),
                "--dist",
                "loadfile",
            ],
            "after": "package",
            "env": {RUN_STORE_ENV: str(RUNS)},
        },
        "site": {
            "cmd": [*py, "tests", "-m", "book or site", "-n", str(n)],
            "after": "book",
            "needs": True,  # it tests that job's output
            "env": {"COURSE_BOOK_BUILD": str(BOOK)},
        },
    }


def _summary(log: str) -> str:
    """pytest's last line (``N passed in ...``) or the build's verdict."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip("= ") for line in log.splitlines()]
    for line in reversed(lines):
        if re.search(r"\b(passed|failed|error|errors|no tests ran)\b.* in [\d.]+s", line):
            return line
        if "build succeeded" in line or "build finished with problems" in line:
            return line
    return lines[-1] if lines else "(no output)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    n = parser.parse_args(argv).jobs
    sys.path.insert(0, str(ROOT / "scripts"))
    from build_book import corpus_missing

    missing = corpus_missing()  # the book, the labs and many tests read tiny-shakespeare
    if missing:
        print(f"the tests cannot run: {missing}", file=sys.stderr)
        return 1
    LOGS.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop(RUN_STORE_ENV, None)  # only the book and the labs share runs, from an empty store
    shutil.rmtree(RUNS, ignore_errors=True)
    todo, running, done = jobs(n), {}, {}
    start = time.perf_counter()
    print(f"running {', '.join(todo)} on {n} cores; logs in {LOGS.relative_to(ROOT)}/", flush=True)
    while todo or running:
        for name in [k for k, job in todo.items() if job["after"] in (None, *done)]:
            job = todo.pop(name)
            if job.get("needs") and done[job["after"]] != 0:
                done[name] = 1
                print(f"{name:>8}  not run: {job['after']} failed", flush=True)
                continue
            log = open(LOGS / f"{name}.log", "w")
            proc = subprocess.Popen(
                job["cmd"],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**env, **job.get("env", {})},
            )
            running[name] = (proc, log, time.perf_counter())
            print(f"{name:>8}  started at {time.perf_counter() - start:5.0f} s", flush=True)
        time.sleep(0.5)
        for name, (proc, log, t0) in list(running.items()):
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == 0:
                continue
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, with its CPU time
            log.close()
            del running[name]
            done[name] = proc.returncode
            text = (LOGS / f"{name}.log").read_text(errors="replace")
            if name == "book":  # the site job's strict-build test reads the log beside the build
                (BOOK / "build.log").write_text(text)
            verdict = "passed" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
            cpu = usage.ru_utime + usage.ru_stime  # the job and every process it waited for
            print(
                f"{name:>8}  {verdict} in {time.perf_counter() - t0:.0f} s ({cpu:.0f} CPU-s): "
                f"{_summary(text)}",
                flush=True,
            )
    for name, code in done.items():
        if code != 0 and (LOGS / f"{name}.log").exists():
            print(f"\n{'=' * 30} {name}: {LOGS / f'{name}.log'} {'=' * 30}")
            print((LOGS / f"{name}.log").read_text(errors="replace")[-30_000:])
    for name in ("labs",):  # the lab time budget table, always worth seeing
        text = (LOGS / f"{name}.log").read_text(errors="replace") if name in done else ""
        table = re.search(r"=+ lab run times.*?(?=\n=+ )", text, flags=re.S)
        if table and done[name] == 0:
            print("\n" + table.group(0))
    failed = [k for k, c in done.items() if c != 0]
    print(
        f"\n{'FAILED: ' + ', '.join(failed) if failed else 'all passed'} "
        f"in {time.perf_counter() - start:.0f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
