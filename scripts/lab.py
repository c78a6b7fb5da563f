"""``make lab``: JupyterLab on the course, in its venv, with the labs folder open.

    python scripts/lab.py [--port 8888] [--no-browser] [--root DIR] [-- extra `jupyter lab` options]

The labs (``notebooks/*.ipynb``) open as they are. The chapter pages (``book/*.md``) are MyST text
notebooks: jupytext, installed beside JupyterLab, reads their header and this script makes "Jupytext
Notebook" the default viewer of Markdown files, so a double click opens a chapter as a notebook whose
cells run. Every Markdown file opens that way, the README too: right-click, *Open With*, *Markdown
Preview* renders one, *Editor* shows its text. That default is written to this venv's own JupyterLab
settings (``<venv>/share/jupyter/lab/settings/overrides.json``), never to your user settings; your
own settings still win where they set the same key.

The server listens on 127.0.0.1 only, behind a token that this script makes and prints in the URL.
A chapter opened this way runs as it does in the book: its first cell imports ``transformer_course``
from the venv. JupyterLab saves open notebooks every two minutes; a chapter page saved from JupyterLab
is written back as MyST by jupytext (``git diff`` shows what changed).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import secrets
import socket
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
# the document manager's setting: which viewer opens a file type on a double click or a /lab/tree URL
VIEWERS = {
    "@jupyterlab/docmanager-extension:plugin": {
        "defaultViewers": {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}
    }
}


def write_overrides(prefix: pathlib.Path = pathlib.Path(sys.prefix)) -> pathlib.Path:
    """Merge :data:`VIEWERS` into the venv's ``overrides.json`` (JupyterLab's app-level defaults):
    the viewers it names are set, every other setting in the file is kept.

    Raises:
        SystemExit: naming the file, if it is not valid JSON or cannot be written.
    """
    path = prefix / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    try:
        settings = json.loads(path.read_text()) if path.exists() else {}
        for plugin, values in VIEWERS.items():
            for key, value in values.items():  # one level down: other file types keep their viewers
                settings.setdefault(plugin, {}).setdefault(key, {}).update(value)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings, indent=2) + "\n")
    except (OSError, ValueError) as err:
        raise SystemExit(
            f"could not set JupyterLab's default viewer in {path} ({err}); fix or delete that file"
        ) from None
    return path


def free_port(preferred: int) -> int:
    """``preferred`` if nothing listens on it, else a port the system picks."""
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port on 127.0.0.1")


def command(
    root: pathlib.Path, port: int, token: str, browser: bool, extra: list[str]
) -> list[str]:
    """The ``jupyter lab`` command line: the repository as its root, the labs folder as its start page."""
    return [
        sys.executable,
        "-m",
        "jupyterlab",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        "--LabApp.default_url=/lab/tree/notebooks",
        *([] if browser else ["--no-browser"]),
        # as root (a container, a CI runner) JupyterLab refuses to start without this; it only listens
        # on the loopback interface here, behind the token
        *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
        *extra,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--port", type=int, default=8888, help="tried first; another if it is taken"
    )
    parser.add_argument(
        "--root", type=pathlib.Path, default=ROOT, help="the folder JupyterLab shows"
    )
    parser.add_argument("--token", default=None, help="default: a fresh random token")
    parser.add_argument("--no-browser", action="store_true", help="only print the URL")
    parser.add_argument("extra", nargs="*", help="more `jupyter lab` options, after --")
    args = parser.parse_args(argv)
    try:
        import jupyterlab  # noqa: F401
        import jupytext  # noqa: F401
    except ImportError as err:
        print(
            f"JupyterLab is not installed in {sys.prefix} ({err}): run `make venv`", file=sys.stderr
        )
        return 1
    root = args.root.resolve()
    if not (root / "notebooks").is_dir():
        print(f"{root} has no notebooks/ folder: pass --root <the repository>", file=sys.stderr)
        return 1
    write_overrides()
    port, token = free_port(args.port), args.token or secrets.token_hex(24)
    print(
        f"JupyterLab on {root}: open http://127.0.0.1:{port}/lab/tree/notebooks?token={token}\n"
        "  labs in notebooks/, chapter pages in book/ (they open as notebooks); Ctrl+C stops it",
        flush=True,
    )
    cmd = command(root, port, token, not args.no_browser, args.extra)
    os.execv(cmd[0], cmd)  # JupyterLab replaces this process: Ctrl+C and signals reach it directly
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
