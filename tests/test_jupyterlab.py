"""``make lab`` (``scripts/lab.py``) as a learner uses it: JupyterLab in Debian's chromium, a lab and a
chapter page opened from the file tree's URLs, their first code cells run, their output on the page.

The server runs on a copy of the two files (nothing in the repository is opened, so nothing can be
saved back into it), on 127.0.0.1 behind a token, with JupyterLab's user settings, workspaces and
runtime files in a temporary folder (the default viewer that ``scripts/lab.py`` writes into the venv's
own ``overrides.json`` is what the test relies on); it and its kernels are stopped at the end whatever
happens.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import lab as lab_script  # noqa: E402

SCREENSHOTS = pathlib.Path(os.environ.get("COURSE_SCREENSHOTS", ROOT / "_build" / "screenshots"))
LAB = "notebooks/00_notation.ipynb"
CHAPTER = "book/notation.md"


@dataclass
class Server:
    url: str
    token: str
    root: pathlib.Path

    def api(self, path: str, method: str = "GET") -> object:
        request = urllib.request.Request(f"{self.url}/api/{path}?token={self.token}", method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    pytest.importorskip("jupyterlab", reason="JupyterLab is not installed: run `make venv`")
    root = tmp_path_factory.mktemp("lab-root")
    for name in (LAB, CHAPTER):
        (root / name).parent.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    home = tmp_path_factory.mktemp("lab-home")
    env = {
        **os.environ,
        "TRANSFORMER_COURSE_DEVICE": "cpu",  # the outputs the test reads, on a machine with a GPU too
        "JUPYTERLAB_SETTINGS_DIR": str(
            home / "settings"
        ),  # no user setting of this machine applies
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
    }
    token, port = secrets.token_hex(16), lab_script.free_port(0)
    log = open(home / "server.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "scripts" / "lab.py"),
            *("--no-browser", "--port", str(port), "--root", str(root), "--token", token, "--"),
            # no request leaves the machine: no news feed, no check for a newer JupyterLab
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own process group: stopped as a whole below
    )
    lab = Server(f"http://127.0.0.1:{port}", token, root)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"scripts/lab.py exited ({proc.returncode}):\n{_tail(home)}")
            try:
                lab.api("status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer within 120 s:\n{_tail(home)}")
                time.sleep(0.5)
        yield lab
    finally:
        try:  # kernels run in sessions of their own: shut each down through the server first
            for kernel in lab.api("kernels"):
                lab.api(f"kernels/{kernel['id']}", method="DELETE")
        except OSError:
            pass
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        log.close()


def _tail(home: pathlib.Path) -> str:
    return (home / "server.log").read_text(errors="replace")[-3000:]


def _cells_to_run(path: pathlib.Path, marker: str) -> int:
    """How many cells, from the first, JupyterLab must run to reach the code cell containing
    ``marker`` (jupytext reads a chapter page into the same cells as the server does)."""
    import jupytext

    cells = jupytext.read(path).cells
    return 1 + next(i for i, c in enumerate(cells) if c.cell_type == "code" and marker in c.source)


def _wait_for_idle_kernel(lab: Server, name: str, timeout: float = 120) -> None:
    """Until the server's session for ``name`` has a started kernel that is idle (keys pressed
    before then may run nothing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for session in lab.api("sessions"):
            if session["path"] == name and session["kernel"]["execution_state"] == "idle":
                return
        time.sleep(0.5)
    pytest.fail(f"no idle kernel for {name} within {timeout:.0f} s: {lab.api('sessions')}")


def _run_first_cells(page, lab: Server, name: str, marker: str, expected: str) -> None:
    # ``reset``: a fresh workspace, so that the only tab is this file's (JupyterLab reopens the tabs
    # of the last visit otherwise)
    page.goto(f"{lab.url}/lab/tree/{name}?reset&token={lab.token}")
    page.locator(".jp-NotebookPanel .jp-Cell, .jp-FileEditor").first.wait_for(timeout=120_000)
    if page.locator(".jp-FileEditor").count():
        pytest.fail(
            f"{name} opened in the text editor, not as a notebook: JupyterLab did not take "
            "jupytext's viewer as the default for Markdown (scripts/lab.py, VIEWERS)"
        )
    panel = page.locator(".jp-NotebookPanel")
    _wait_for_idle_kernel(lab, name)
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=120_000)
    panel.locator(".jp-Cell").first.locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")  # command mode: Shift+Enter runs a cell and selects the next
    for _ in range(_cells_to_run(lab.root / name, marker)):
        page.keyboard.press("Shift+Enter")
    # the expected output, or an error (which stops the queued cells): whichever comes first
    output = panel.locator(".jp-OutputArea-output", has_text=expected)
    error = panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    output.or_(error.filter(has_text="Traceback")).first.wait_for(timeout=180_000)
    if not output.count():
        pytest.fail(
            f"{name} raised before its output {expected!r}:\n" + "\n".join(error.all_inner_texts())
        )


def test_lab_script_opens_a_lab_and_a_chapter_page_as_notebooks_that_run(browser, server):
    """What ``make lab`` runs (``scripts/lab.py``), driven as a learner would."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    try:
        _run_first_cells(page, server, LAB, 'print("torch"', "| device: cpu")
        # the chapter page is MyST text: it opens as a notebook only through jupytext's default viewer
        _run_first_cells(
            page, server, CHAPTER, 'print("rows of A sum to"', "rows of A sum to [1.0, 1.0]"
        )
    except Exception:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "jupyterlab-failure.png"))
        raise
    finally:
        context.close()


def test_lab_script_merges_the_viewer_default_into_the_prefixs_overrides(tmp_path):
    """The default viewer goes to the given prefix's ``overrides.json``, merged with what is there
    (another plugin's setting, another file type's viewer); a broken file gets a clear error."""
    path = tmp_path / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    path.parent.mkdir(parents=True)
    docmanager = "@jupyterlab/docmanager-extension:plugin"
    theirs = {
        "@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"},
        docmanager: {"defaultViewers": {"python": "Editor"}, "autosave": False},
    }
    path.write_text(json.dumps(theirs))
    assert lab_script.write_overrides(tmp_path) == path
    settings = json.loads(path.read_text())
    assert settings["@jupyterlab/apputils-extension:themes"] == {"theme": "JupyterLab Dark"}
    assert settings[docmanager]["autosave"] is False
    viewers = settings[docmanager]["defaultViewers"]
    assert viewers == {
        "python": "Editor",
        "markdown": "Jupytext Notebook",
        "myst": "Jupytext Notebook",
    }
    path.write_text("{not json")
    with pytest.raises(SystemExit, match=r"overrides\.json .*fix or delete that file"):
        lab_script.write_overrides(tmp_path)
