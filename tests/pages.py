"""Reading the book's MyST text notebooks: code cells with their tags, and the chapter list.

Shared by the page guards (``tests/test_pages.py``) and ``scripts/run_page.py``.
"""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
REFERENCE_PAGES = {"book/exercises", "book/sources", "book/performance", "book/equations"}
CHAPTERS = [
    c["file"]
    for part in TOC["parts"]
    for c in part["chapters"]
    if c["file"].startswith("book/")
    and c["file"] not in REFERENCE_PAGES
    and c["file"] not in {"book/citing", "book/bibliography"}
]
# A chapter's *Going deeper* page (proofs, measurements, side studies): its child in the table of
# contents, ``book/X_deeper.md``, linked from the chapter's last section.
DEEPER = {
    c["file"]: s["file"]
    for part in TOC["parts"]
    for c in part["chapters"]
    for s in c.get("sections", [])
    if s["file"] == f"{c['file']}_deeper"
}


# Chapters whose *Going deeper* part is still on the chapter page (issue 34): the split's guards are
# expected to fail on them (strict xfail in tests/test_pages.py; tests/test_site.py measures their old
# core path), and a chapter leaves this set when its deeper page lands.
NOT_SPLIT = {c for c in CHAPTERS if c not in DEEPER}


def toc_pages() -> list[str]:
    """Every page of the table of contents, in reading order: the root, each chapter and its
    sections (a chapter's *Going deeper* page follows it)."""

    def walk(entries):
        for entry in entries:
            yield entry["file"]
            yield from walk(entry.get("sections", []))

    return [TOC["root"], *walk(c for part in TOC["parts"] for c in part["chapters"])]


FOLDED = {"hide-input", "hide-cell", "remove-input", "remove-cell"}


@dataclass(frozen=True)
class Cell:
    line: int  # 1-based line of the ```{code-cell} fence
    tags: frozenset[str]
    source: str

    @property
    def folded(self) -> bool:
        return bool(self.tags & FOLDED)


_FENCE = re.compile(r"^(`{3,})\{code-cell\}[^\n]*\n", re.M)


def code_cells(text: str) -> list[Cell]:
    """The ``{code-cell}`` blocks of a MyST page, in order, with the tags of their front matter."""
    cells = []
    for m in _FENCE.finditer(text):
        fence = m.group(1)
        end = text.index("\n" + fence + "\n", m.end() - 1)
        body = text[m.end() : end + 1]
        tags: set[str] = set()
        if body.startswith("---\n"):
            close = body.index("\n---\n", 3)
            meta = yaml.safe_load(body[4:close]) or {}
            tags = set(meta.get("tags", []))
            body = body[close + 5 :]
        else:
            while body.startswith(":"):
                line, _, body = body.partition("\n")
                if line.startswith(":tags:"):
                    tags |= set(yaml.safe_load(line.split(":", 2)[2]))
        line = text.count("\n", 0, m.start()) + 1
        cells.append(Cell(line, frozenset(tags), body))
    return cells


_MATH = re.compile(r"^(`{3,}|:{3,})\{math\}.*?^\1$", re.M | re.S)
_DROPDOWN = re.compile(
    r"^(:{3,})\{[\w-]+\}[^\n]*\n:class: [^\n]*dropdown[^\n]*\n.*?^\1$", re.M | re.S
)
_INCLUDE = re.compile(r"^(`{3,})\{literalinclude\} ([^\n]+)\n(.*?)^\1$", re.M | re.S)
_ANY_FENCE = re.compile(r"^(`{3,}|:{3,})\{([\w-]+)\}[^\n]*\n(.*?)^\1$", re.M | re.S)
GOING_DEEPER = re.compile(r"^## Going deeper", re.M)
SUMMARY = re.compile(r"^## Summary", re.M)
WORDS_PER_MINUTE, CODE_LINES_PER_MINUTE = 200, 20


def _pyobject_lines(page: pathlib.Path, target: str, options: str) -> int:
    import ast

    path = (page.parent / target.strip()).resolve()
    source = path.read_text()
    m = re.search(r":pyobject: ([\w.]+)", options)
    if not m:
        return len(source.splitlines())
    node: ast.AST = ast.parse(source)
    for part in m.group(1).split("."):
        node = next(
            n
            for n in ast.iter_child_nodes(node)
            if isinstance(n, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
            and n.name == part
        )
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return node.end_lineno - start + 1


def core_path_estimate(page: pathlib.Path, whole: bool = False) -> tuple[float, int, int]:
    """(minutes, prose words, visible code lines) of a chapter's core path, estimated from its
    source: everything before ``## Summary`` (or before an old ``## Going deeper`` part), or with
    ``whole`` the whole page; folded cells, dropdowns and display math left out, literal includes
    counted by the lines of the object they show, and each folded cell that prints a verdict counted
    as a 10-word line (a verdict is one line; its detail is folded). The site test measures the
    rendered page instead."""
    text = page.read_text()
    if text.startswith("---\n"):
        text = text[text.index("\n---\n", 3) + 5 :]
    m = None if whole else (GOING_DEEPER.search(text) or SUMMARY.search(text))
    core = text[: m.start()] if m else text
    words = 0
    code = 0
    for cell in code_cells(core):
        if cell.tags & {"remove-input", "remove-cell", "hide-cell"}:
            continue
        if cell.folded:
            words += 10 * cell.source.count("verify(")
        else:
            code += sum(1 for line in cell.source.splitlines() if line.strip())
    core = _DROPDOWN.sub("", core)  # folded: neither its prose nor a listing in it is read
    for inc in _INCLUDE.finditer(core):
        code += _pyobject_lines(page, inc.group(2), inc.group(3))
    core = _MATH.sub("", core)
    core = _ANY_FENCE.sub(
        lambda f: (
            f.group(3) if f.group(2) in {"margin", "note", "admonition", "tip", "important"} else ""
        ),
        core,
    )
    core = re.sub(r"\$\$.*?\$\$", " ", core, flags=re.S)
    core = re.sub(r"\$[^$\n]+\$", " x ", core)
    core = re.sub(r"\{[\w:-]+\}`([^`<]*)(<[^>]*>)?`", r"\1", core)
    core = re.sub(r"<!--.*?-->", " ", core, flags=re.S)
    core = re.sub(r"^\(.*\)=$|^:[\w-]+:.*$", " ", core, flags=re.M)  # labels, directive options
    words += len(re.findall(r"[A-Za-z0-9][\w'’-]*", core))
    return words / WORDS_PER_MINUTE + code / CODE_LINES_PER_MINUTE, words, code
