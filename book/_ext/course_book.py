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
"""

from __future__ import annotations

from pathlib import PurePosixPath
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


def setup(app: Sphinx) -> dict:
    app.add_directive("lab", LabDirective)
    app.connect("html-page-context", _retarget_launch_buttons, priority=900)
    app.connect("html-page-context", _drop_thebe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
