"""Keep every lab's Colab badge and setup cell generated from the one repository URL.

The first two cells of each ``notebooks/*.ipynb`` belong to this script: a markdown cell with the title
and the Open-in-Colab badge (tag ``course-badge``), and the setup cell that installs the package when it
is missing (tag ``course-setup``). Everything else in a lab is written by hand.

    python scripts/sync_labs.py             # rewrite badge and setup cells from transformer_course.project
    python scripts/sync_labs.py --check     # exit 1 and list the labs that are out of date
    python scripts/sync_labs.py --execute   # also run each lab top to bottom and store its outputs

``tests/test_project.py`` runs the ``--check`` logic, so a stale badge fails the test suite.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import nbformat

from transformer_course import project

ROOT = pathlib.Path(__file__).resolve().parents[1]
LABS = ROOT / "notebooks"

SETUP_TEMPLATE = """\
# Setup: install the course package only when it is missing (e.g. on Colab). Torch is never touched.
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("transformer_course") is None:
    SPEC = "{spec}"
    cmd = [sys.executable, "-m", "pip", "install", "-q", SPEC]
    if importlib.util.find_spec("torch") is not None:
        import torch

        cmd.append(f"torch=={{torch.__version__}}")  # keep the runtime's own torch
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            "Could not install the course package from {url}.\\n"
            + done.stderr[-1500:]
            + "\\nOffline? Download the repository as a zip on a connected machine, upload it "
            "(Colab: Files pane), then run  !pip install ./transformer-course-{branch}  and re-run."
        )"""


def badge_source(path: str, title: str) -> str:
    return f"{project.colab_badge(path)}\n\n# {title}"


def setup_source() -> str:
    return SETUP_TEMPLATE.format(
        spec=project.install_spec(), url=project.repository_url(), branch=project.BRANCH
    )


def lab_title(nb: nbformat.NotebookNode) -> str:
    first = nb.cells[0].source if nb.cells and nb.cells[0].cell_type == "markdown" else ""
    for line in first.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    raise ValueError("a lab's first cell must be markdown with a '# Title' line")


def expected_head(path: pathlib.Path, nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    rel = path.relative_to(ROOT).as_posix()
    badge = nbformat.v4.new_markdown_cell(badge_source(rel, lab_title(nb)))
    badge.metadata["tags"] = ["course-badge"]
    setup = nbformat.v4.new_code_cell(setup_source())
    setup.metadata["tags"] = ["course-setup"]
    return [badge, setup]


def has_head(nb: nbformat.NotebookNode) -> bool:
    tags = [c.metadata.get("tags", []) for c in nb.cells[:2]]
    return len(tags) == 2 and "course-badge" in tags[0] and "course-setup" in tags[1]


def stale_labs() -> list[str]:
    """Labs whose badge or setup cell differs from what :mod:`transformer_course.project` gives."""
    stale = []
    for path in sorted(LABS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        head = expected_head(path, nb)
        if not has_head(nb) or any(
            a.source != b.source for a, b in zip(nb.cells[:2], head, strict=True)
        ):
            stale.append(path.relative_to(ROOT).as_posix())
    return stale


def sync(path: pathlib.Path) -> None:
    nb = nbformat.read(path, as_version=4)
    head = expected_head(path, nb)
    if has_head(nb):
        for old, new in zip(nb.cells[:2], head, strict=True):
            old.source = new.source
    else:
        nb.cells[:1] = head  # a new lab: its first cell held only the title
    nb.metadata.setdefault("colab", {})["provenance"] = []
    nb.metadata["kernelspec"] = {
        "display_name": "Python 3",
        "language": "python",
        "name": "python3",
    }
    nbformat.write(nb, path)


def execute(path: pathlib.Path) -> None:
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(LABS)}}
    ).execute()
    strip_timestamps(nb)
    nbformat.write(nb, path)


def strip_timestamps(nb: nbformat.NotebookNode) -> None:
    """Drop the execution timestamps nbclient records, so that re-running a lab changes only outputs."""
    for cell in nb.cells:
        cell.metadata.pop("execution", None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("labs", nargs="*", help="lab files (default: every notebooks/*.ipynb)")
    parser.add_argument("--check", action="store_true", help="only report stale labs")
    parser.add_argument("--execute", action="store_true", help="run each lab and store outputs")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_labs()
        for name in stale:
            print(f"stale badge/setup cell: {name} (run `make sync`)")
        return 1 if stale else 0
    paths = [pathlib.Path(p).resolve() for p in args.labs] or sorted(LABS.glob("*.ipynb"))
    for path in paths:
        sync(path)
        if args.execute:
            print(f"executing {path.name} ...", flush=True)
            execute(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
