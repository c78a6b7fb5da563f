"""Check the device log of a GPU run: every lab asked for a device, and every answer was CUDA.

    python scripts/check_device_log.py devices.log notebooks

``tc.default_device()`` appends the device it chose to ``$TRANSFORMER_COURSE_DEVICE_LOG``; the GPU
workflow runs the labs under nbval with that variable set and then runs this script, so a lab that
silently fell back to the CPU fails the run. Exit status 0 when the log proves a CUDA run, 1 otherwise,
with the reason printed.
"""

from __future__ import annotations

import collections
import pathlib
import sys


def check(log: pathlib.Path, labs: pathlib.Path) -> list[str]:
    """The problems with ``log`` (empty when it proves a CUDA run of every lab in ``labs``)."""
    if not log.exists() or not log.read_text().strip():
        return [f"{log} is empty: no lab asked tc.default_device() for a device"]
    entries = log.read_text().split()
    counts = collections.Counter(entries)
    problems = [
        f"{n} device choice(s) were {kind!r}, not 'cuda'"
        for kind, n in counts.items()
        if kind != "cuda"
    ]
    n_labs = len(list(labs.glob("*.ipynb")))
    if len(entries) < n_labs:
        problems.append(f"only {len(entries)} device choices for {n_labs} labs")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    problems = check(pathlib.Path(argv[0]), pathlib.Path(argv[1]))
    for problem in problems:
        print(f"error: {problem}")
    if not problems:
        print("every lab ran on CUDA")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
