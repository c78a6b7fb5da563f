"""Build benchmark: a cold build of the book, then warm rebuilds after a prose edit to one page.

    python bench/build.py                      # cold build, then warm rebuilds of three pages
    python bench/build.py --edit language_models vision

The repository's files (those git tracks, and new ones it does not ignore) are copied to a temporary
folder, so the working tree is never touched. The cold build starts without ``_build`` (every page
executes); each warm rebuild follows a one-word edit to the prose of one page, whose code cells are
unchanged, so jupyter-cache supplies its outputs and nothing is executed again (the training pages
included). Targets on a 2-core CPU: ``cold_seconds <= 600`` and ``warm_seconds <= 30`` (the slowest warm
rebuild). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

from common import report

from transformer_course.runtime import machine

ROOT = pathlib.Path(__file__).resolve().parents[1]
JUPYTER_BOOK = str(pathlib.Path(sys.executable).parent / "jupyter-book")


def copy_repository(dest: pathlib.Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.splitlines()
    for name in files:
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def build(book: pathlib.Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(
        [JUPYTER_BOOK, "build", str(book), "-W", "-n", "--keep-going"],
        capture_output=True,
        text=True,
        cwd=book,
    )
    seconds = time.perf_counter() - t0
    log = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"the build failed:\n{log[-3000:]}")
    return seconds, log


def edit_prose(page: pathlib.Path) -> None:
    """Change one word of the first prose paragraph after the title (no code cell changes)."""
    text = page.read_text()
    title = re.search(r"^# .+$", text, flags=re.M)
    start = text.index("\n\n", title.end()) + 2
    page.write_text(text[:start] + "Indeed, " + text[start:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edit", nargs="*", default=["language_models", "vision", "notation"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        book = pathlib.Path(tmp) / "book-copy"
        copy_repository(book)
        cold, log = build(book)
        executed = log.count("Executing notebook")
        pages = len(list((book / "_build" / "html").rglob("*.html")))
        print(f"machine: {machine()}")
        print(f"cold build: {cold:.1f} s ({executed} pages executed, {pages} HTML files)")
        warm = {}
        for stem in args.edit:
            edit_prose(book / "book" / f"{stem}.md")
            seconds, log = build(book)
            if "Executing notebook" in log:
                raise SystemExit(f"a prose edit to {stem} re-executed a page:\n{log[-2000:]}")
            warm[stem] = round(seconds, 2)
            print(
                f"warm rebuild after a prose edit to book/{stem}.md: {seconds:.1f} s (nothing executed)"
            )
    report(
        {
            "targets": {"cold_seconds": ["<=", 600], "warm_seconds": ["<=", 30]},
            "device": "cpu",
            "machine": machine(),
            "cold_seconds": round(cold, 2),
            "warm_seconds": max(warm.values()) if warm else None,
            "warm_by_page": warm,
            "pages": pages,
            "pages_executed_cold": executed,
        }
    )


if __name__ == "__main__":
    main()
