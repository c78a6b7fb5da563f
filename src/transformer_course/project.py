"""Where the course lives: the repository URL, and the links and install command built from it.

The repository URL is written once, in ``pyproject.toml`` (``[project.urls] Repository``), and read here
from the installed package's metadata. Every Colab badge, every lab's setup cell, ``_config.yml`` and
the README are generated from these functions by ``scripts/sync_labs.py`` and checked against them by
``tests/test_project.py``; change the URL in ``pyproject.toml`` and run ``make sync``.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, metadata

DISTRIBUTION = "transformer-course"
BRANCH = "main"


@cache
def repository_url() -> str:
    """The course repository, e.g. ``https://github.com/OWNER/NAME`` (from ``pyproject.toml``)."""
    try:
        meta = metadata(DISTRIBUTION)
    except PackageNotFoundError as err:
        raise RuntimeError(
            "transformer_course is imported but not installed, so its repository URL is unknown; "
            "install it with `pip install -e .` from the repository root (or `make venv`)."
        ) from err
    for entry in meta.get_all("Project-URL") or []:
        label, _, url = entry.partition(",")
        if label.strip().lower() == "repository":
            return url.strip().rstrip("/")
    raise RuntimeError("pyproject.toml has no [project.urls] Repository entry; add one.")


def github_slug() -> str:
    """``OWNER/NAME`` of the GitHub repository."""
    url = repository_url()
    prefix = "https://github.com/"
    if not url.startswith(prefix):
        raise RuntimeError(f"the repository URL {url!r} is not a GitHub URL; Colab links need one")
    return url[len(prefix) :]


def colab_url(path: str, ref: str = BRANCH) -> str:
    """The Open-in-Colab URL of a notebook at ``path`` (relative to the repository root)."""
    return f"https://colab.research.google.com/github/{github_slug()}/blob/{ref}/{path}"


def colab_badge(path: str, ref: str = BRANCH) -> str:
    """Markdown for the Open-in-Colab badge of the notebook at ``path``."""
    return (
        f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        f"({colab_url(path, ref)})"
    )


def install_spec(ref: str = BRANCH) -> str:
    """The pip requirement that installs this package from the repository at ``ref``."""
    return f"{DISTRIBUTION} @ git+{repository_url()}@{ref}"


def bibtex(citation: dict) -> str:
    """A BibTeX ``@software`` entry from the fields of ``CITATION.cff`` (parsed YAML), for the citation
    page of the book."""
    authors = " and ".join(
        a.get("name") or f"{a.get('family-names', '')}, {a.get('given-names', '')}".strip(", ")
        for a in citation["authors"]
    )
    year = str(citation.get("date-released", ""))[:4]
    key = "transformer_course" + year
    fields = {
        "author": "{" + authors + "}",
        "title": "{" + citation["title"] + "}",
        "year": year,
        "version": citation.get("version", ""),
        "url": citation.get("url") or citation.get("repository-code", ""),
        "note": f"Code: {citation['repository-code']}" if citation.get("repository-code") else "",
    }
    body = ",\n".join(f"  {k} = {{{v}}}" if k in ("version", "url", "note", "year") else f"  {k} = {v}"
                       for k, v in fields.items() if v)  # fmt: skip
    return f"@software{{{key},\n{body}\n}}"
