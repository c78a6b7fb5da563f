"""Shared fixtures. Tests mirror modules: tests/test_<module>.py."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
# the jupyter-book of the interpreter running the tests (the .venv one under `make test`)
JUPYTER_BOOK = str(pathlib.Path(sys.executable).parent / "jupyter-book")
# Debian's chromium, driven by Playwright (the site tests and the JupyterLab test); never downloaded
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    # every request but those to the loopback interface (which Chromium never sends to a proxy) goes
    # to a proxy that does not exist, and fails inside Chromium (``_watch`` records it), a numeric
    # address as well as a name; no request is routed through Playwright and Python one by one
    "--proxy-server=http://127.0.0.1:9",
]


@pytest.fixture
def gen() -> torch.Generator:
    """A fresh seeded generator for each test."""
    return torch.Generator().manual_seed(0)


@pytest.fixture(scope="session")
def _book_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, str]:
    """Build the real book once per session, strictly, into a temporary folder; or, when
    ``$COURSE_BOOK_BUILD`` names the ``--path-output`` folder of a build already made (``make test``
    builds the book beside the package tests), read that build and its log (``build.log`` there)."""
    given = os.environ.get("COURSE_BOOK_BUILD")
    if given:
        out = pathlib.Path(given).resolve()  # relative to where pytest was started
        log = out / "build.log"
        return out / "_build" / "html", log.read_text() if log.exists() else f"no log at {log}"
    out = tmp_path_factory.mktemp("book")
    done = subprocess.run(
        [JUPYTER_BOOK, "build", str(ROOT), "-W", "-n", "--keep-going", "--path-output", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYDEVD_DISABLE_FILE_VALIDATION": "1"},
    )
    return out / "_build" / "html", done.stdout + done.stderr


@pytest.fixture(scope="session")
def built_book(_book_build: tuple[pathlib.Path, str]) -> pathlib.Path:
    html, log = _book_build
    if not (html / "index.html").exists():
        pytest.fail("the book did not build:\n" + log[-4000:])
    return html


@pytest.fixture(scope="session")
def built_book_log(_book_build: tuple[pathlib.Path, str]) -> str:
    return _book_build[1]


@pytest.fixture(scope="module")
def browser():
    if not (pathlib.Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        message = f"no chromium at {CHROMIUM}: `apt-get install chromium` (or set $CHROMIUM)"
        if os.environ.get("COURSE_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()
