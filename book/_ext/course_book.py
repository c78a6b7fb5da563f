"""Sphinx glue for the course book (loaded from ``_config.yml`` as a local extension).

* ``{lab}`` directive: the box at the top of a chapter that links to its lab page and opens the lab
  in Colab. The Colab URL comes from :mod:`transformer_course.project`, the one place that knows the
  repository, so no chapter writes a URL by hand.
* Chapters are MyST text files, which Colab cannot open. The theme's "launch in Colab" button on a
  chapter therefore opens the chapter's lab (front matter ``lab: notebooks/NN_name.ipynb``); on pages
  with no lab and no notebook the button is removed instead of pointing at a file Colab cannot read.
* Live code through thebe needs a remote Jupyter server and a script from a CDN, and sphinx-thebe 0.3
  declares its configuration twice per page (a JavaScript error). The course runs code in Colab or
  locally instead, so thebe's scripts are dropped and the site stays self-contained.
* The theme logs "Got invalid theme mode" on a first visit when no default mode is configured; the
  extension sets ``html_context["default_mode"] = "auto"``.
* The labs' Open-in-Colab badge is an image on colab.research.google.com (right in Colab and on
  GitHub); on the site it is replaced by the course's own copy in ``_static/``, so the site reads
  offline.
* **Execution that is never stale.** Pages execute through jupyter-cache, which re-executes a page when
  its code cells change. It cannot see the package the pages import, nor the result files they read,
  so the cache lives in a folder named after a hash of those inputs (``course_execution_inputs``,
  default ``src`` and ``bench/results``): change any of them and the cache path changes, which Sphinx
  sees as a changed configuration, so it re-reads every page and each one executes again. The two most
  recent caches are kept (switching back to the previous state of the code costs nothing).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path, PurePosixPath
from typing import ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

from transformer_course import project


class LabDirective(SphinxDirective):
    """``{lab} notebooks/NN_name.ipynb``: link to the lab page and open it in Colab."""

    required_arguments = 1
    option_spec: ClassVar[dict] = {"class": directives.class_option}

    def run(self) -> list[nodes.Node]:
        path = self.arguments[0]
        if not (self.env.srcdir / path).exists():
            raise self.error(f"lab notebook {path!r} does not exist (paths are from the book root)")
        box = nodes.admonition(classes=["tip", "course-lab"])
        box += nodes.title(text="Lab")
        para = nodes.paragraph()
        para += nodes.Text("Work through this chapter's exercises in ")
        ref = addnodes.pending_xref(
            "",
            nodes.inline(text="its lab"),
            refdomain="std",
            reftype="doc",
            reftarget="/" + str(PurePosixPath(path).with_suffix("")),
            refexplicit=True,
            refwarn=True,
        )
        para += ref
        para += nodes.Text(" (each exercise has a checker that explains what is wrong): ")
        para += nodes.reference("", "open it in Colab", refuri=project.colab_url(path))
        para += nodes.Text(", or run it locally after ")
        para += nodes.literal(text="make venv")
        para += nodes.Text(".")
        box += para
        return [box]


def _retarget_launch_buttons(app: Sphinx, pagename: str, templatename, context, doctree) -> None:
    sourcename = context.get("sourcename", "")
    if not sourcename.endswith((".md", ".md.txt")):
        return  # .ipynb pages (the labs) keep the theme's own, correct, Colab link
    lab = app.env.metadata.get(pagename, {}).get("lab")
    buttons = context.get("header_buttons", [])
    for group in buttons:
        if group.get("label") != "launch-buttons":
            continue
        kept = []
        for button in group.get("buttons", []):
            if "colab" in str(button.get("label", "")).lower() or "colab" in str(
                button.get("url", "")
            ):
                if not lab:
                    continue
                button = {
                    **button,
                    "url": project.colab_url(lab),
                    "tooltip": "Open this chapter's lab in Colab",
                }
            kept.append(button)
        group["buttons"] = kept
    context["header_buttons"] = [
        b for b in buttons if b.get("label") != "launch-buttons" or b["buttons"]
    ]


def _drop_thebe(app: Sphinx, pagename: str, templatename, context, doctree) -> None:
    def is_thebe(script) -> bool:
        name = str(getattr(script, "filename", "") or "")
        body = str(getattr(script, "attributes", {}).get("body", ""))
        return (
            name.endswith("sphinx-thebe.js") or "THEBE_JS_URL" in body or "unpkg.com/thebe" in name
        )

    if "script_files" in context:
        context["script_files"] = [s for s in context["script_files"] if not is_thebe(s)]


COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"


def _local_colab_badge(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Point every Open-in-Colab badge image at the site's own copy (``_static/colab-badge.svg``)."""
    depth = docname.count("/")
    for image in doctree.findall(nodes.image):
        if image.get("uri") == COLAB_BADGE:
            image["uri"] = "../" * depth + "_static/colab-badge.svg"
            image["candidates"] = {"*": image["uri"]}


def inputs_hash(root: Path, inputs: list[str]) -> str:
    """A hash of every file under the ``inputs`` folders of ``root`` (names and contents), so that any
    change to the package or to the results the pages read gives another hash."""
    digest = hashlib.sha256()
    for folder in inputs:
        base = root / folder
        files = sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []
        for path in files:
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _cache_per_inputs(app: Sphinx, config) -> None:
    """Keep one jupyter-cache per state of the inputs the pages import or read."""
    context = dict(config.html_context or {})
    context.setdefault(
        "default_mode", "auto"
    )  # the theme reads it from the context: no console error
    config.html_context = context
    if config.nb_execution_mode != "cache":
        return
    root = Path(app.srcdir)
    base = Path(config.nb_execution_cache_path or Path(app.outdir).parent / ".jupyter_cache")
    current = base / inputs_hash(root, list(config.course_execution_inputs))
    config.nb_execution_cache_path = str(current)
    if base.is_dir():  # keep this state's cache and the most recent other one
        others = sorted(
            (p for p in base.iterdir() if p.is_dir() and p != current),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        for stale in others[1:]:
            shutil.rmtree(stale, ignore_errors=True)


def setup(app: Sphinx) -> dict:
    app.add_directive("lab", LabDirective)
    app.add_config_value("course_execution_inputs", ["src", "bench/results"], "env")
    app.connect("config-inited", _cache_per_inputs, priority=900)
    app.connect("doctree-resolved", _local_colab_badge)
    app.connect("html-page-context", _retarget_launch_buttons, priority=900)
    app.connect("html-page-context", _drop_thebe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
