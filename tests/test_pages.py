"""The reader's path on every chapter page, checked on the page sources (fast; the browser test in
``tests/test_site.py`` measures the rendered pages).

- Checking happens only through the package's one helper, ``verify`` (which refuses a check that
  cannot fail): no ``assert`` statement and no ``assert_close``/``allclose``/``testing`` call in any
  code cell of a chapter, and every cell that calls ``verify`` is folded (its verdict stays visible).
- Every displayed equation is followed, in its section, by a check cell that calls ``verify``.
- A chapter page is its core path: its *Going deeper* part (proofs, measurements, side studies) is a
  page of its own, ``book/X_deeper.md``, the chapter's child in ``_toc.yml`` and linked from it. The
  chapter page reads in at most 30 minutes and its core path (everything before ``## Summary``) in at
  most 25, by the source estimate of ``tests/pages.py``.
- The first guards hold on the *Going deeper* pages too.
"""

from __future__ import annotations

import ast
import re

import pytest
from pages import (
    _ANY_FENCE,
    CHAPTERS,
    DEEPER,
    NOT_SPLIT,
    ROOT,
    code_cells,
    core_path_estimate,
)

BUDGET_MINUTES = 25
PAGE_MINUTES = 30
# Chapters whose pages have not been rewritten to the reader's path yet (issue 21): the guards are
# expected to fail on them, and a chapter must leave this set as soon as it passes (strict xfail).
PENDING: set[str] = set()

FORBIDDEN_CALLS = {"assert_close", "assert_allclose", "allclose", "assert_equal", "isclose"}


def _params():
    return [
        pytest.param(
            c,
            marks=pytest.mark.xfail(strict=True, reason="not yet on the reader's path (issue 21)")
            if c in PENDING
            else (),
        )
        for c in CHAPTERS
    ] + [pytest.param(d) for d in DEEPER.values()]


def _text(chapter: str) -> str:
    return (ROOT / f"{chapter}.md").read_text()


@pytest.mark.parametrize("chapter", _params())
def test_checks_go_through_verify_in_folded_cells(chapter):
    problems = []
    for cell in code_cells(_text(chapter)):
        tree = ast.parse(cell.source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert):
                problems.append(f"line {cell.line}: an assert statement (use verify)")
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                if name in FORBIDDEN_CALLS:
                    problems.append(f"line {cell.line}: {name}() (use verify)")
        if "verify(" in cell.source and not cell.folded:
            problems.append(f"line {cell.line}: a check cell that is not folded (tags: hide-input)")
    assert not problems, f"{chapter}: " + "; ".join(problems)


_HEADING = re.compile(r"^#{1,3} ", re.M)
_MATH_BLOCK = re.compile(r"^(`{3,})\{math\}", re.M)


def _in_code(text: str, at: int) -> bool:
    """Whether offset ``at`` lies inside a directive's fenced block (```` ```{name} ```` or
    ``:::{name}``, e.g. a code cell) of the page."""
    return any(m.start() < at < m.end() for m in _ANY_FENCE.finditer(text))


@pytest.mark.parametrize("chapter", _params())
def test_every_displayed_equation_is_followed_by_a_check_in_its_section(chapter):
    text = _text(chapter)
    cells = code_cells(text)
    missing = []
    for m in _MATH_BLOCK.finditer(text):
        start = m.start()
        # the section ends at the next heading of the page, not at a comment inside a code cell
        ends = [h.start() for h in _HEADING.finditer(text, start) if not _in_code(text, h.start())]
        end = ends[0] if ends else len(text)
        line = text.count("\n", 0, start) + 1
        end_line = text.count("\n", 0, end) + 1
        if not any(line < c.line < end_line and "verify(" in c.source for c in cells):
            label = re.search(r":label: (\S+)", text[start : start + 300])
            missing.append(label.group(1) if label else f"line {line}")
    assert not missing, f"{chapter}: equations with no verify() cell after them: {missing}"


@pytest.mark.parametrize(
    "chapter",
    [
        pytest.param(
            c,
            marks=pytest.mark.xfail(strict=True, reason="Going deeper not yet on its own page")
            if c in NOT_SPLIT
            else (),
        )
        for c in CHAPTERS
    ],
)
def test_the_chapter_page_is_its_core_path_and_links_its_going_deeper_page(chapter):
    text = _text(chapter)
    deeper = DEEPER.get(chapter, f"{chapter}_deeper")
    assert not re.search(r"^## Going deeper", text, re.M), (
        f"{chapter}: its 'Going deeper' part is on the chapter page; move it to {deeper}.md"
    )
    assert (ROOT / f"{deeper}.md").exists() and chapter in DEEPER, (
        f"{chapter}: no page {deeper}.md as the chapter's child in _toc.yml"
    )
    stem = deeper.split("/")[-1]
    assert re.search(rf"\{{doc\}}`[^`]*{stem}>?`", text), f"{chapter}: no {{doc}} link to {stem}"
    minutes, words, code = core_path_estimate(ROOT / f"{chapter}.md", whole=True)
    assert minutes <= PAGE_MINUTES, (
        f"{chapter}: the page reads in {minutes:.1f} min ({words} words, {code} code lines) > "
        f"{PAGE_MINUTES}; move side studies to {stem}"
    )


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_core_path_fits_the_reading_budget(chapter):
    minutes, words, code = core_path_estimate(ROOT / f"{chapter}.md")
    assert minutes <= BUDGET_MINUTES, (
        f"{chapter}: core path {minutes:.1f} min ({words} words, {code} code lines) > "
        f"{BUDGET_MINUTES}; move side studies to 'Going deeper' or sources' checks to the register"
    )


def test_the_guards_catch_what_they_guard(tmp_path):
    """Each guard fails on a page with the defect it names."""
    page = tmp_path / "bad.md"
    page.write_text(
        "# Bad\n\n```{math}\n:label: eq-x\nx = 1\n```\n\n```{code-cell} ipython3\n"
        "assert 1 == 1\nverify('x', 1, 1, mistakes=[])\n```\n\n" + "word " * 6000 + "\n"
    )
    cells = code_cells(page.read_text())
    assert not cells[0].folded and "verify(" in cells[0].source
    assert any(isinstance(n, ast.Assert) for n in ast.walk(ast.parse(cells[0].source)))
    minutes, _, _ = core_path_estimate(page)
    assert minutes > BUDGET_MINUTES
