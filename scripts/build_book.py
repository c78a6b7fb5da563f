"""Build the book with its pages executed on several processes: ``jupyter-book build`` runs one page at a
time, and the pages' code is most of a build.

    python scripts/build_book.py [--jobs N] [--path-output DIR]

1. Every chapter page whose outputs are not in the execution cache yet is executed, ``N`` pages at a time
   (each in its own kernel, longest page first), and stored in the cache that the book build reads: the
   one ``book/_ext/course_book.py`` names after the package and the results, under ``DIR/_build``.
2. ``jupyter-book build . -W -n --keep-going --path-output DIR`` (the README's strict build) then finds
   every page executed. A page that failed in step 1 is not cached: the build executes it again and
   reports the page and the failing cell as it always does.

``make test`` builds the book this way beside the package tests. The result is the same as that of a
plain ``jupyter-book build``: the cache is the one it would fill, keyed by the same notebook contents.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pathlib
import subprocess
import sys
import time

import nbformat
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

from course_book import execution_cache_path  # noqa: E402

# tc.checks.VERDICT_LOG_ENV and tc.runtime.RUN_STORE_ENV, named here without importing torch
VERDICT_LOG_ENV = "TRANSFORMER_COURSE_VERDICTS"
RUN_STORE_ENV = "TRANSFORMER_COURSE_RUN_STORE"

# The pages that take longest start first, so that no long page starts last: the Going deeper pages that
# train their own models (training, extensions), then the chapters whose runs their labs and deeper pages
# reuse in ``make test`` (language_models, masked, encoder_decoder, vision). Other deeper pages reuse a
# chapter's run, so they start after every chapter.
SLOW_FIRST = [
    "training_deeper",
    "extensions_deeper",
    "language_models",
    "masked",
    "encoder_decoder",
    "vision",
    "claims_deeper",
]


def pages() -> list[pathlib.Path]:
    """The pages of the table of contents that are executed (MyST notebooks; labs are not)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())

    def walk(entries):
        for entry in entries:
            yield entry["file"]
            yield from walk(entry.get("sections", []))

    files = [toc["root"], *walk(c for part in toc["parts"] for c in part["chapters"])]
    found = [ROOT / f"{f}.md" for f in files if (ROOT / f"{f}.md").exists()]
    return [p for p in found if "kernelspec:" in p.read_text().split("\n---", 1)[0]]


def _read(path: pathlib.Path):
    """The notebook exactly as myst-nb reads the page (the cache matches on its code and kernel)."""
    from myst_nb.core.config import NbParserConfig
    from myst_nb.core.read import create_nb_reader
    from myst_parser.config.main import MdParserConfig

    text = path.read_text(encoding="utf-8")
    reader = create_nb_reader(str(path), MdParserConfig(), NbParserConfig(), text)
    return reader, reader.read(text)


def verdict_log(path_output: pathlib.Path, page: pathlib.Path) -> pathlib.Path:
    """Where a page's checks write their verdicts, one JSON line each (tc.checks.VERDICT_LOG_ENV)."""
    return path_output / "_build" / "verdicts" / f"{page.stem}.jsonl"


def _execute(path: str, notebook: str, timeout: int, log: str) -> tuple[str, float, str | None]:
    """Run one page in a kernel started in its folder (as the build does), its verdicts written to
    ``log``; returns the executed notebook, the seconds and the error (``None`` when every cell ran)."""
    from jupyter_cache.executors.utils import single_nb_execution

    pathlib.Path(log).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(log).unlink(missing_ok=True)
    os.environ[VERDICT_LOG_ENV] = log  # the page's kernel inherits it

    nb = nbformat.reads(notebook, as_version=4)
    result = single_nb_execution(
        nb, cwd=str(pathlib.Path(path).parent), timeout=timeout, allow_errors=False
    )
    error = None if result.err is None else f"{type(result.err).__name__}: {result.err}"
    return nbformat.writes(nb), result.time, error


def execute_pages(path_output: pathlib.Path, jobs: int, timeout: int = 600) -> int:
    """Execute the pages missing from the cache, ``jobs`` at a time; returns how many failed."""
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    inputs = config.get("sphinx", {}).get("config", {}).get("course_execution_inputs")
    cache = get_cache(str(execution_cache_path(ROOT, path_output / "_build", inputs)))
    todo, every = [], pages()
    order = {name: i for i, name in enumerate(SLOW_FIRST)}

    def rank(p: pathlib.Path) -> tuple:
        if p.stem in order:
            return (0, order[p.stem], "")
        return (2 if p.stem.endswith("_deeper") else 1, 0, p.name)

    for path in sorted(every, key=rank):
        reader, nb = _read(path)
        try:
            cache.match_cache_notebook(nb)
        except KeyError:
            todo.append((path, reader, nb))
    print(f"executing {len(todo)} pages, {jobs} at a time ({len(every) - len(todo)} cached)")
    failed, start = 0, time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        futures = {
            pool.submit(
                _execute,
                str(path),
                nbformat.writes(nb),
                timeout,
                str(verdict_log(path_output, path)),
            ): (path, reader)
            for path, reader, nb in todo
        }
        for future in concurrent.futures.as_completed(futures):
            path, reader = futures[future]
            executed, seconds, error = future.result()
            name = path.relative_to(ROOT)
            if error:
                failed += 1
                print(f"  {name}: failed after {seconds:.1f} s ({error.splitlines()[0][:200]})")
                continue
            record = cache.add_nb_to_project(str(path), read_data=reader.read_fmt)
            cache.cache_notebook_bundle(
                CacheBundleIn(
                    nbformat.reads(executed, as_version=4),
                    record.uri,
                    data={"execution_seconds": seconds},
                ),
                check_validity=False,
                overwrite=True,
            )
            print(f"  {name}: {seconds:.1f} s")
    print(f"executed in {time.perf_counter() - start:.0f} s")
    return failed


def corpus_missing() -> str | None:
    """Why the pages cannot get tiny-shakespeare (``tc.data.tinyshakespeare_path``: the copy that
    ``$TRANSFORMER_COURSE_DATA`` names, the cache, or a download), in one line; ``None`` when they can.
    Asked once, before any page runs: offline, five pages would otherwise each fail with a traceback."""
    code = "from transformer_course.data import tinyshakespeare_path; tinyshakespeare_path()"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    if result.returncode == 0:
        return None
    lines = result.stderr.strip().splitlines() or ["(no message)"]
    return lines[-1].split(": ", 1)[-1]  # the exception's message, without its type


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--path-output", type=pathlib.Path, default=ROOT)
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    path_output = args.path_output.resolve()
    # A chapter and its Going deeper page make the same seeded training runs (tc.runtime.reusable_run):
    # each trains once per state of the package, kept under _build (make test sets its own store).
    os.environ.setdefault(RUN_STORE_ENV, str(path_output / "_build" / "run-store"))
    missing = corpus_missing()
    if missing:
        print(f"the book cannot be built: {missing}", file=sys.stderr)
        return 1
    if execute_pages(path_output, args.jobs):
        print("some pages failed: the build runs them again and names the failing cell")
    build = [
        str(pathlib.Path(sys.executable).parent / "jupyter-book"),
        "build",
        str(ROOT),
        "-W",
        "-n",
        "--keep-going",
        "--path-output",
        str(path_output),
    ]
    return subprocess.run(build, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
