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
* **A 404 page that works from any prefix.** sphinx-notfound-page writes the 404 page's links from the
  absolute prefix the site is published under (``notfound_urls_prefix``), because a server shows that
  page at any missing URL, at any depth; a copy of the site served from another prefix (a local folder,
  a mirror) would lose its styles and logo. After the build (``relocatable_404``) the links become
  relative to the site's root, and the page is written by a first script that finds the root and
  writes a ``<base>`` for it: the folder of ``404.html`` itself, the part of the path before ``book/``,
  ``notebooks/`` or ``_static/``, the configured prefix when the path starts with it, and otherwise the
  path's own folder (a missing page deeper than the top level of an unknown prefix cannot be placed).
* **Interactive figures.** ``_static/course-figures.js`` and ``.css`` draw the figures of
  :mod:`transformer_course.interactive` (the site's own files: no library, no network); Jupyter Book
  adds every script and style sheet of ``_static/`` to each page.
* **Accessibility.** A cell's figure gets as alt text the description that ``tc.plots`` wrote into the
  PNG (what the figure shows, read from its titles, axes and curves) instead of its file name
  (``_alt_text_from_figures``); citation entries are list items (``_citation_list_roles``); the
  sidebar's toggle beside a chapter with a child page (its *Going deeper*) is named, where the theme
  gives it only an icon (``_named_sidebar_toggles``); colour and reflow fixes to the theme are in
  ``_static/course-a11y.css``.
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
import json
import re
import shutil
from pathlib import Path, PurePosixPath
from typing import ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


def _project():
    """:mod:`transformer_course.project` (the course's URLs), loaded from the installed package without
    importing the package itself: ``import transformer_course`` brings torch and matplotlib (about
    1.7 s of CPU in every Sphinx process), and ``project`` needs neither."""
    import importlib.util
    import sys

    name = "transformer_course.project"
    if name in sys.modules:
        return sys.modules[name]
    package = importlib.util.find_spec("transformer_course")
    if package is None or not package.submodule_search_locations:
        raise RuntimeError(
            "transformer_course is not installed: run `make venv` (or `pip install -e .`)"
        )
    path = Path(package.submodule_search_locations[0]) / "project.py"
    spec = importlib.util.spec_from_file_location("_course_book_project", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


project = _project()


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
        para += nodes.Text(", or on your machine: ")
        para += nodes.literal(text="make lab")
        para += nodes.Text(
            " starts JupyterLab on the labs (this page opens there as a notebook too)."
        )
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


def png_description(path: Path) -> str | None:
    """The ``Description`` text field of a PNG file (``tc.plots`` writes one into every figure)."""
    try:
        from PIL import Image

        with Image.open(path) as image:
            return image.text.get("Description") if hasattr(image, "text") else None
    except (OSError, ValueError):
        return None


def _alt_text_from_figures(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """A cell's figure gets its description (see ``tc.plots.describe``) as alt text, in place of the
    file name that myst-nb would use."""
    for image in doctree.findall(nodes.image):
        uri = image.get("uri", "")
        if not uri.endswith(".png") or image.get("alt") not in (None, "", uri):
            continue
        path = Path(app.srcdir) / uri  # Sphinx has made the uri relative to the source folder
        text = png_description(path) if path.is_file() else None
        if text:
            image["alt"] = text


def _citation_list_roles(app: Sphinx, pagename: str, templatename, context, doctree) -> None:
    """Sphinx marks a list of citations ``role="list"`` and each entry ``role="doc-biblioentry"``, a
    role that ARIA 1.2 deprecates and that a list may not hold (axe-core: aria-required-children); the
    entries become list items."""
    if "body" in context and 'class="citation-list"' in context["body"]:
        context["body"] = context["body"].replace('role="doc-biblioentry"', 'role="listitem"')


def name_sidebar_toggles(soup) -> None:
    """Give each sidebar ``<summary>`` that holds only the theme's chevron an accessible name taken from
    the link beside it ("Pages under Training"): axe-core requires a summary to have discernible text."""
    for summary in soup.select("li.has-children > details > summary"):
        if summary.get_text(strip=True) or summary.get("aria-label"):
            continue
        link = summary.find_parent("li").find("a", recursive=False)
        title = link.get_text(" ", strip=True) if link else "this page"
        summary["aria-label"] = f"Pages under {title}"


def _named_sidebar_toggles(app: Sphinx, pagename: str, templatename, context, doctree) -> None:
    generate = context.get("generate_toctree_html")
    if generate is None or getattr(generate, "names_toggles", False):
        return

    def generate_named(kind: str, *args, **kwargs):
        soup = generate(kind, *args, **kwargs)
        if kind == "sidebar" and hasattr(soup, "select"):
            name_sidebar_toggles(soup)
        return soup

    generate_named.names_toggles = True
    context["generate_toctree_html"] = generate_named


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
            if path.suffix == ".pyc" or any(
                part == "__pycache__" or part.endswith(".egg-info") for part in path.parts
            ):
                continue  # build products (pip rewrites src/*.egg-info when it installs)
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


DEFAULT_INPUTS = ["src", "bench/results"]


def execution_cache_path(root: Path, build_dir: Path, inputs: list[str] | None = None) -> Path:
    """The jupyter-cache of the current state of the inputs: ``build_dir/.jupyter_cache/<hash>``
    (``build_dir`` is the ``_build`` folder; ``scripts/build_book.py`` fills the same cache)."""
    return build_dir / ".jupyter_cache" / inputs_hash(root, list(inputs or DEFAULT_INPUTS))


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
    if config.nb_execution_cache_path:
        base = Path(config.nb_execution_cache_path)
        current = base / inputs_hash(root, list(config.course_execution_inputs))
    else:
        current = execution_cache_path(
            root, Path(app.outdir).parent, config.course_execution_inputs
        )
        base = current.parent
    config.nb_execution_cache_path = str(current)
    if base.is_dir():  # keep this state's cache and the most recent other one
        others = sorted(
            (p for p in base.iterdir() if p.is_dir() and p != current),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        for stale in others[1:]:
            shutil.rmtree(stale, ignore_errors=True)


# The 404 page's one script: it finds the site's root, then writes the page (a <base> for the root, then
# the head and the body that Sphinx rendered, with links relative to the root).
_ROOT_SCRIPT = """var path = location.pathname, prefix = %s, root;
var inside = path.match(/^(.*?\\/)(?:book|notebooks|_static|_images|_sources)\\//);
if (/\\/404\\.html$/.test(path)) root = path.replace(/404\\.html$/, "");
else if (inside) root = inside[1];
else if (path.indexOf(prefix) === 0) root = prefix;
else root = path.replace(/[^\\/]*$/, "");"""
_ANCHORS = """document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll('a[href^="#"]').forEach(function (a) {  // in-page links stay in the page
    a.href = location.href.split("#")[0] + a.getAttribute("href");
  });
});"""


def _js_string(html: str) -> str:
    """``html`` as a JavaScript string literal that is safe inside a <script> element."""
    return json.dumps(html).replace("<", "\\u003c")


def relocatable_404(html: str, prefix: str) -> str:
    """The 404 page made to work from any folder: sphinx-notfound-page writes its links from the prefix
    the site is published under. The links become relative to the site's root, and the page's head and
    body are written by a script that first finds the root and writes a <base> for it, so that no
    address is in the markup, where the browser would fetch it (relative to the missing page's folder)
    before any script could run. Without JavaScript, a short message links to the published root."""
    if not prefix.startswith("/") or not prefix.endswith("/"):
        raise ValueError(f"notfound_urls_prefix must start and end with '/', got {prefix!r}")
    html = re.sub(r'((?:src|href|action)=")' + re.escape(prefix), r"\1", html)
    charset = re.search(r"<meta charset=[^>]*>", html)
    head_end, body = html.index("</head>"), re.search(r"<body[^>]*>", html)
    body_end = html.rindex("</body>")
    head = html[charset.end() : head_end]
    title = re.search(
        r"<title>.*?</title>", head, flags=re.S
    )  # stays in the markup, for every reader
    head = head.replace(title.group(0), "") if title else head
    content = html[body.end() : body_end]
    root = _ROOT_SCRIPT % json.dumps(prefix)
    return (
        html[: charset.end()]
        + f"<script>{root}\ndocument.write('<base href=\"' + encodeURI(decodeURI(root)) + '\">' "
        + f"+ {_js_string(head)});\n{_ANCHORS}</script>\n"
        + (title.group(0) if title else "<title>Page not found</title>")
        + "</head>\n"
        + body.group(0)
        + f"<script>document.write({_js_string(content)});</script>\n"
        + f'<noscript><main><h1>Page not found</h1><p><a href="{prefix}">The course\'s first page'
        + "</a></p></main></noscript>\n</body>"
        + html[body_end + len("</body>") :]
    )


def _relocate_404(app: Sphinx, exception) -> None:
    page = Path(app.outdir) / "404.html"
    prefix = getattr(app.config, "notfound_urls_prefix", None)
    if exception is None and app.builder.format == "html" and page.exists() and prefix:
        page.write_text(relocatable_404(page.read_text(encoding="utf-8"), prefix), encoding="utf-8")


def setup(app: Sphinx) -> dict:
    app.add_directive("lab", LabDirective)
    app.add_config_value("course_execution_inputs", DEFAULT_INPUTS, "env")
    app.connect("config-inited", _cache_per_inputs, priority=900)
    app.connect("doctree-resolved", _local_colab_badge)
    app.connect("doctree-resolved", _alt_text_from_figures)
    app.connect("html-page-context", _retarget_launch_buttons, priority=900)
    app.connect("html-page-context", _drop_thebe, priority=900)
    app.connect("html-page-context", _citation_list_roles)
    app.connect("html-page-context", _named_sidebar_toggles, priority=900)
    app.connect("build-finished", _relocate_404)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
