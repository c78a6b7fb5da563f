"""Write constraints.txt: the exact versions the book and the tests were last green with.

    .venv/bin/python scripts/lock.py        # after `make test` passed: freeze .venv into constraints.txt

The Makefile installs with ``-c constraints.txt`` when its Python is the one recorded in the file's
header, so a fresh machine next year builds with the same versions. torch is left out (the Makefile's
``TORCH`` variable chooses the build, and the package never pins it), as are uv (the installer that
the Makefile brings), the package itself and the CUDA libraries of a GPU build. The scheduled
workflow ``.github/workflows/newest.yml`` tries the newest versions instead and reports what changed.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SKIP = re.compile(r"^(torch|triton|nvidia-|cuda-|transformer-course|uv==)", re.I)


def main() -> int:
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    pins = sorted((line for line in frozen if "==" in line and not SKIP.match(line)), key=str.lower)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    header = [
        "# The versions `make test` last passed with (scripts/lock.py writes this file; do not edit).",
        f"# python: {version}",
        "# torch is chosen by the Makefile's TORCH variable and is not pinned here.",
    ]
    (ROOT / "constraints.txt").write_text("\n".join(header + pins) + "\n")
    print(f"constraints.txt: {len(pins)} packages for Python {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
