"""Run one chapter's code cells in order, in this process, and say how long each took.

A quick way to try a page while writing it, without building the book (the strict build in
``make book`` / ``make test`` is still the authority):

    .venv/bin/python scripts/run_page.py book/self_attention.md [--verbose] [--minutes]

Cells tagged ``raises-exception`` may raise. Exits non-zero at the first failing cell and names it.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from pages import code_cells, core_path_estimate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=pathlib.Path)
    parser.add_argument("--minutes", action="store_true", help="only estimate the reading time")
    parser.add_argument("--verbose", action="store_true", help="show each cell's output")
    args = parser.parse_args()
    page = args.page.resolve()
    minutes, words, code = core_path_estimate(page)
    print(f"core path (estimate): {minutes:.1f} min = {words} words / 200 + {code} code lines / 20")
    minutes, words, code = core_path_estimate(page, whole=True)
    print(
        f"whole page (estimate): {minutes:.1f} min = {words} words / 200 + {code} code lines / 20"
    )
    if args.minutes:
        return 0
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.chdir(page.parent)  # pages run from book/, as in the build
    from IPython.display import display  # a name every kernel has, as the pages' cells assume

    namespace: dict = {"__name__": "__main__", "display": display}
    total = time.perf_counter()
    for i, cell in enumerate(code_cells(page.read_text()), start=1):
        t0 = time.perf_counter()
        try:
            code = compile(cell.source, f"{args.page.name}:cell {i} (line {cell.line})", "exec")
            if not args.verbose:
                import contextlib
                import io

                buf = io.StringIO()
                with contextlib.redirect_stdout(buf):
                    exec(code, namespace)
            else:
                exec(code, namespace)
        except Exception:
            if "raises-exception" in cell.tags:
                continue
            if not args.verbose:
                print(buf.getvalue())
            traceback.print_exc()
            print(f"FAILED: cell {i} at line {cell.line} of {args.page}")
            return 1
        print(f"cell {i:3d} (line {cell.line:5d}) {time.perf_counter() - t0:6.2f} s")
    print(f"all cells ran in {time.perf_counter() - total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
