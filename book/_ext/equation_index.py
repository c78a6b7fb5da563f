"""The equation index: every labelled equation of the book, the package code that implements it, and
the tests that check that code, found by reading the sources (nothing is typed by hand).

* A function or class implements an equation when its docstring has a line ``Implements: eq-a, eq-b``
  (an explicit marker: a docstring that merely *mentions* a label, e.g. a loop oracle or a helper
  that cites the equation it is compared with, implements nothing).
* A test checks that code when the test function *calls* it: a call of the imported name or of an
  attribute of that name (``tc.mod.f(...)``, ``block.forward(...)``); for a class, constructing it;
  for a method, constructing its class and calling the method (``forward``: calling the instance).
* An equation that the package does not implement because it is a step of a derivation carries the
  class ``derivation-only`` on its ``{math}`` block (``:class: derivation-only``).

:func:`analyse` does the reading (the tests use it too); the ``{equation-index}`` directive places the
table, filled in when every page has been read; and every labelled equation's code cell on its page gets
a link to its entry in the index.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

MATH_BLOCK = re.compile(r"```\{math\}\n((?::[a-z]+:.*\n)+)", re.M)
LABEL = re.compile(r"\beq-[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*\b")
IMPLEMENTS = re.compile(r"^\s*Implements:\s*(.+)$", re.M)
LABEL_IN_CODE = re.compile(r"\(?\b(eq-[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*)\b\)?")
INDEX_PAGE = "book/equations"


@dataclass
class Equation:
    label: str
    page: str  # docname, e.g. "book/multihead"
    derivation_only: bool
    implementers: list[str] = field(default_factory=list)  # "module.Qualname"
    tests: list[str] = field(default_factory=list)  # "tests/test_x.py::test_name"


def book_equations(root: Path) -> dict[str, Equation]:
    """Every ``{math}`` block with a ``:label:`` in ``book/*.md``."""
    found = {}
    for page in sorted((root / "book").glob("*.md")):
        for options in MATH_BLOCK.findall(page.read_text(encoding="utf-8")):
            label = re.search(r"^:label: *(\S+)", options, flags=re.M)
            if label:
                only = re.search(r"^:class:.*\bderivation-only\b", options, flags=re.M) is not None
                found[label.group(1)] = Equation(label.group(1), f"book/{page.stem}", only)
    return found


def _documented(tree: ast.Module, module: str) -> dict[str, str]:
    """Qualified name -> docstring, for the module's functions, classes and methods."""
    out = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                out[f"{module}.{name}"] = ast.get_docstring(child) or ""
                if isinstance(child, ast.ClassDef):
                    visit(child, f"{name}.")

    visit(tree, "")
    return out


def implementers(root: Path) -> dict[str, list[str]]:
    """Label -> the package's functions and classes whose docstrings say ``Implements: <label>``."""
    package = root / "src" / "transformer_course"
    out: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        for name, doc in _documented(ast.parse(path.read_text(encoding="utf-8")), module).items():
            marked = " ".join(IMPLEMENTS.findall(doc))
            for label in sorted(set(LABEL.findall(marked))):
                out.setdefault(label, []).append(name)
    return out


def _called(node: ast.AST) -> set[str]:
    """Names a test calls: ``f(...)`` gives ``f``; ``a.b.f(...)`` gives ``f``."""
    out = set()
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            if isinstance(call.func, ast.Name):
                out.add(call.func.id)
            elif isinstance(call.func, ast.Attribute):
                out.add(call.func.attr)
    return out


def _test_calls(root: Path) -> list[tuple[str, set[str]]]:
    """Every test function of ``root/tests`` with the names it calls (each file parsed once)."""
    out = []
    for path in sorted((root / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                out.append((f"{path.relative_to(root).as_posix()}::{node.name}", _called(node)))
    return out


def tests_using(
    root: Path, qualified: str, calls: list[tuple[str, set[str]]] | None = None
) -> list[str]:
    """Test functions that call the object ``qualified`` names: a function is called; a class is
    constructed; a method's class is constructed and the method called (``forward`` by calling an
    instance, which a constructed module in a test always is). ``calls`` is :func:`_test_calls`'s
    answer, when the caller already has it."""
    parts = qualified.split(".")
    is_method = parts[-2][:1].isupper()
    found = []
    for test, called in _test_calls(root) if calls is None else calls:
        if is_method:
            ok = parts[-2] in called and (
                parts[-1] in called or parts[-1] in ("forward", "__call__", "__init__")
            )
        else:
            ok = parts[-1] in called
        if ok:
            found.append(test)
    return found


def analyse(root: Path) -> dict[str, Equation]:
    """Every labelled equation with its implementers and the tests that use them."""
    equations = book_equations(root)
    calls = _test_calls(root)
    for label, names in implementers(root).items():
        if label in equations:
            equations[label].implementers = names
            equations[label].tests = sorted(
                {t for name in names for t in tests_using(root, name, calls)}
            )
    return equations


class equation_index(nodes.General, nodes.Element):
    """Placeholder for the table, filled in once every page has been read."""


class EquationIndexDirective(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        return [equation_index("")]


def _number(env, docname: str, label: str) -> str:
    numbers = env.toc_fignumbers.get(docname, {}).get("displaymath", {})
    number = numbers.get(f"equation-{label}")
    return ".".join(str(n) for n in number) if number else "?"


def _fill_index(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    root = Path(app.srcdir)
    for placeholder in list(doctree.findall(equation_index)):
        equations = analyse(root)
        titles = {d: app.env.titles[d].astext() for d in app.env.titles}
        table = nodes.table(classes=["equation-index"])
        group = nodes.tgroup(cols=4)
        table += group
        for width in (10, 22, 34, 34):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        group += head
        head += _row(["equation", "page", "implemented by", "checked by"])
        body = nodes.tbody()
        group += body
        for eq in sorted(equations.values(), key=lambda e: (_toc_position(app, e.page), e.label)):
            target = (
                app.builder.get_relative_uri(docname, eq.page) + f"#equation-{eq.label.lower()}"
            )
            number = nodes.reference("", f"({_number(app.env, eq.page, eq.label)})", refuri=target)
            page = nodes.reference("", titles.get(eq.page, eq.page), refuri=target)
            code = (
                [
                    nodes.literal(text=name.removeprefix("transformer_course."))
                    for name in eq.implementers
                ]
                if eq.implementers
                else [nodes.emphasis(text="derivation only" if eq.derivation_only else "none")]
            )
            tests = [nodes.literal(text=t.split("::", 1)[1]) for t in eq.tests] or [nodes.Text("")]
            row = _row([number, page, code, tests], ids=[f"eqindex-{eq.label.lower()}"])
            body += row
        placeholder.replace_self(table)


def _toc_position(app: Sphinx, docname: str) -> int:
    order = getattr(app.env, "course_toc_order", None)
    if order is None:
        order = list(app.env.toctree_includes.get(app.config.root_doc, []))
        for doc in list(order):
            order.extend(app.env.toctree_includes.get(doc, []))
        app.env.course_toc_order = order
    return order.index(docname) if docname in order else len(order)


def _row(cells: list, ids: list[str] | None = None) -> nodes.row:
    row = nodes.row(ids=ids or [])
    for cell in cells:
        entry = nodes.entry()
        para = nodes.paragraph()
        items = cell if isinstance(cell, list) else [cell]
        for i, item in enumerate(items):
            if i:
                para += nodes.Text(", ")
            para += item if isinstance(item, nodes.Node) else nodes.Text(str(item))
        entry += para
        row += entry
    return row


def _link_code_cells_to_the_index(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """After the code cell that follows labelled equations, a link to each one's index entry."""
    if docname == INDEX_PAGE or INDEX_PAGE not in app.env.found_docs:
        return
    index_uri = app.builder.get_relative_uri(docname, INDEX_PAGE)
    pending: list[str] = []
    for node in doctree.findall(lambda n: isinstance(n, (nodes.math_block, nodes.container))):
        if isinstance(node, nodes.math_block) and node.get("label"):
            pending.append(node["label"])
        elif pending and "cell" in node.get("classes", []):
            at = node.parent.index(node) + 1
            for label in reversed(pending):
                link = nodes.paragraph(classes=["equation-index-link"])
                number = _number(app.env, docname, label)
                text = (
                    "this equation in the index"
                    if len(pending) == 1
                    else f"({number}) in the index"
                )
                link += nodes.reference("", text, refuri=f"{index_uri}#eqindex-{label.lower()}")
                node.parent.insert(at, link)
            pending = []


def _label_page(env, label: str) -> str | None:
    equations = env.get_domain("math").equations  # label -> (docname, number)
    entry = equations.get(label)
    return entry[0] if entry else None


def _number_labels_in_code(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """``(eq-label)`` in code cells, their outputs (the checks' HTML verdicts included) and literal
    includes reads as ``(3.2)``."""
    from sphinx.util import logging

    logger = logging.getLogger(__name__)

    def number(match: re.Match) -> str:
        label = match.group(1)
        page = _label_page(app.env, label)
        if page is None:
            logger.warning(f"{docname}: code names an unknown equation label {label!r}")
            return match.group(0)
        return f"({_number(app.env, page, label)})"

    for block in list(doctree.findall(nodes.literal_block)):
        text = block.astext()
        if "eq-" not in text:
            continue
        new = LABEL_IN_CODE.sub(number, text)
        if new != text:
            highlighted = block.rawsource == text  # keep Pygments highlighting on
            block.clear()
            block += nodes.Text(new)
            block.rawsource = new if highlighted else block.rawsource
    for raw in list(doctree.findall(nodes.raw)):  # the checks' verdicts (tc.checks.verify) are HTML
        text = raw.astext()
        if "html" not in raw.get("format", "").split() or "eq-" not in text:
            continue
        new = LABEL_IN_CODE.sub(number, text)
        if new != text:
            raw.clear()
            raw += nodes.Text(new)


def setup(app: Sphinx) -> None:
    app.add_node(equation_index)
    app.add_directive("equation-index", EquationIndexDirective)
    app.connect("doctree-resolved", _fill_index)
    app.connect("doctree-resolved", _link_code_cells_to_the_index)
    app.connect("doctree-resolved", _number_labels_in_code)
