"""Sphinx glue for the course book (loaded from ``_config.yml`` as a local extension).

* ``{lab}`` directive: the box at the top of a chapter that links to its lab page and opens the lab
  in Colab. The Colab URL comes from :mod:`transformer_course.project`, the one place that knows the
  repository, so no chapter writes a URL by hand.
* Chapters are MyST text files, which Colab cannot open. The theme's "launch in Colab" button on a
  chapter therefore opens the chapter's lab (front matter ``lab: notebooks/NN_name.ipynb``); on pages
  with no lab and no notebook the button is removed instead of pointing at a file Colab cannot read.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

from transformer_course import project


class LabDirective(SphinxDirective):
    """``{lab} notebooks/NN_name.ipynb``: link to the lab page and open it in Colab."""

    required_arguments = 1
    option_spec = {"class": directives.class_option}

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
        para += nodes.Text(", or run it locally after `make venv`.")
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
            if "colab" in str(button.get("label", "")).lower() or "colab" in str(button.get("url", "")):
                if not lab:
                    continue
                button = {**button, "url": project.colab_url(lab), "tooltip": "Open this chapter's lab in Colab"}
            kept.append(button)
        group["buttons"] = kept
    context["header_buttons"] = [b for b in buttons if b.get("label") != "launch-buttons" or b["buttons"]]


def setup(app: Sphinx) -> dict:
    app.add_directive("lab", LabDirective)
    app.connect("html-page-context", _retarget_launch_buttons, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
