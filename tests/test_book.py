"""The book: a strict build (warnings are errors), failing cells fail loudly, and the site is whole.

These tests build the real book once per session into a temporary folder (about a minute), so they
are marked ``book``; skip them while iterating with ``pytest -m "not book and not site"``.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest
from conftest import JUPYTER_BOOK

from transformer_course import project

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.book


def build(source: pathlib.Path, out: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [JUPYTER_BOOK, "build", str(source), "-W", "-n", "--keep-going", "--path-output", str(out)],
        capture_output=True,
        text=True,
        cwd=source,
    )


def sphinx_warnings(log: str) -> list[str]:
    """Warning lines from Sphinx (kernel chatter on stderr is not a build warning)."""
    return [line for line in log.splitlines() if "WARNING" in line and "[IPKernelApp]" not in line]


@pytest.fixture(scope="session")
def html(built_book: pathlib.Path) -> pathlib.Path:
    return built_book


def test_strict_build_succeeds_without_warnings(built_book_log: str):
    assert "build succeeded" in built_book_log, built_book_log[-3000:]
    assert sphinx_warnings(built_book_log) == []


def test_every_toc_page_is_built(html: pathlib.Path):

    from pages import toc_pages

    for f in toc_pages():
        assert (html / f"{f}.html").exists(), f


def test_equations_are_numbered_and_referenced(html: pathlib.Path):
    for page in sorted((ROOT / "book").glob("*.md")):
        labels = re.findall(r"^:label: (eq-[\w-]+)", page.read_text(), flags=re.M)
        if not labels:
            continue
        out = (html / "book" / page.name).with_suffix(".html").read_text()
        for label in labels:
            anchor = f'id="equation-{label.lower()}"'  # Sphinx lower-cases ids
            assert anchor in out, f"{page.name}: {label} is not a numbered equation"
        assert len(re.findall(r'class="eqno"', out)) >= len(labels), page.name


def test_citations_resolve(html: pathlib.Path):
    for page in (html / "book").glob("*.html"):
        text = page.read_text()
        assert "??" not in re.sub(r"<(script|style)[^>]*>.*?</\1>", "", text, flags=re.S), page.name
    bib = (html / "book" / "bibliography.html").read_text()
    for author in ("Turner", "Bishop", "Vaswani", "Dosovitskiy", "Dramko", "Phuong", "Bahdanau"):
        assert author in bib, author


def test_no_asset_is_loaded_from_the_internet(html: pathlib.Path):
    """Scripts, stylesheets and fonts must come from the site itself (it has to work offline)."""
    pattern = re.compile(r'<(?:script|link)\b[^>]*?(?:src|href)="(https?:)?//[^"]+"[^>]*>', re.I)
    for page in html.rglob("*.html"):
        bad = [
            m.group(0)
            for m in pattern.finditer(page.read_text())
            if "<link" not in m.group(0).lower()
            or "stylesheet" in m.group(0).lower()
            or "preload" in m.group(0).lower()
        ]
        assert not bad, f"{page.relative_to(html)} loads {bad[:2]}"
    assert (html / "_static" / "mathjax" / "tex-chtml.js").exists()
    notation = (html / "book" / "notation.html").read_text()
    assert "_static/mathjax/tex-chtml.js" in notation


def test_chapter_launch_button_opens_its_lab_in_colab(html: pathlib.Path):
    notation = (html / "book" / "notation.html").read_text()
    assert project.colab_url("notebooks/00_notation.ipynb") in notation
    assert (
        "colab.research.google.com/github/" + project.github_slug() + "/blob/main/book/"
        not in notation
    )
    lab = (html / "notebooks" / "00_notation.html").read_text()
    assert project.colab_url("notebooks/00_notation.ipynb") in lab


def _one_part_toc(book: pathlib.Path, root: str) -> None:
    """A table of contents with the page under test and one plain page in a part (the theme's
    navigation, rendered for the 404 page too, needs at least one part)."""
    (book / "book" / "other.md").write_text("# Other\n\nA plain page.\n")
    (book / "_toc.yml").write_text(
        f"format: jb-book\nroot: {root}\nparts:\n  - caption: Part\n    chapters:\n"
        "      - file: book/other\n"
    )


def test_a_failing_cell_fails_the_build_and_names_page_and_cell(tmp_path: pathlib.Path):
    book = tmp_path / "mini"
    (book / "book").mkdir(parents=True)
    for name in ("_config.yml", "references.bib"):
        shutil.copy(ROOT / name, book / name)
    shutil.copytree(ROOT / "book" / "_ext", book / "book" / "_ext")
    shutil.copytree(
        ROOT / "_static", book / "_static"
    )  # the logo, favicon and badge the config names
    _one_part_toc(book, "book/broken")
    header = (ROOT / "book" / "notation.md").read_text().split("---")[1]
    (book / "book" / "broken.md").write_text(
        f"---{header}---\n# Broken\n\n```{{code-cell}} ipython3\nx = 1\n```\n\n"
        '```{code-cell} ipython3\nraise ValueError("deliberate failure in cell 2")\n```\n'
    )
    done = build(book, tmp_path / "out")
    log = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)  # drop colour codes
    assert done.returncode != 0
    assert "book/broken.md" in log  # the page
    assert 'raise ValueError("deliberate failure in cell 2")' in log  # the cell
    assert "ValueError: deliberate failure in cell 2" in log


def test_cached_execution_reruns_a_page_when_the_code_it_imports_changes(tmp_path: pathlib.Path):
    """jupyter-cache sees a page's code cells only; the extension also makes it see the package."""
    book = tmp_path / "mini"
    (book / "book").mkdir(parents=True)
    (book / "lib").mkdir()
    for name in ("_config.yml", "references.bib"):
        shutil.copy(ROOT / name, book / name)
    shutil.copytree(ROOT / "book" / "_ext", book / "book" / "_ext")
    shutil.copytree(
        ROOT / "_static", book / "_static"
    )  # the logo, favicon and badge the config names
    config = (book / "_config.yml").read_text()
    assert "execute_notebooks: cache" in config
    (book / "_config.yml").write_text(config + "    course_execution_inputs: [lib]\n")
    _one_part_toc(book, "book/page")
    header = (ROOT / "book" / "notation.md").read_text().split("---")[1]
    header = "\n".join(line for line in header.splitlines() if not line.startswith("lab:"))
    page = book / "book" / "page.md"
    code = 'import sys\nsys.path.insert(0, "../lib")\nimport value\nprint("VALUE", value.V)'
    cell = f"```{{code-cell}} ipython3\n{code}\n```\n"
    page.write_text(f"---{header}\n---\n# Page\n\nSome prose.\n\n{cell}")
    (book / "lib" / "value.py").write_text("V = 1\n")
    out = tmp_path / "out"

    def build_and_read() -> tuple[str, str]:
        done = build(book, out)
        log = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)
        assert done.returncode == 0, log[-3000:]
        html = (out / "_build" / "html" / "book" / "page.html").read_text()
        return log, html

    log, html = build_and_read()
    assert "Executing notebook" in log and "VALUE 1" in html
    page.write_text(page.read_text().replace("Some prose.", "Some other prose."))
    log, html = (
        build_and_read()
    )  # prose edited: the page is read again, its outputs come from the cache
    assert "Some other prose." in html and "VALUE 1" in html
    assert "Executing notebook" not in log
    (book / "lib" / "value.py").write_text("V = 2\n")
    log, html = build_and_read()  # the imported code changed: the page runs again
    assert "Executing notebook" in log and "VALUE 2" in html


def test_every_labelled_equation_links_to_its_index_entry(html: pathlib.Path):
    """Each labelled equation on a chapter page is followed by a link to its row in the equation
    index, also when several equations stand before one code cell."""
    missing = []
    for page in sorted((ROOT / "book").glob("*.md")):
        labels = re.findall(r"^:label: (eq-[\w-]+)", page.read_text(), flags=re.M)
        if not labels or page.stem == "equations":
            continue
        out = (html / "book" / page.name).with_suffix(".html").read_text()
        missing += [f"{page.stem}:{lab}" for lab in labels if f"#eqindex-{lab.lower()}" not in out]
    assert not missing, f"equations with no link to their index entry: {missing}"


def test_code_shows_equation_numbers_not_labels(html: pathlib.Path):
    """``(eq-label)`` in code cells, outputs (the checks' verdicts) and literal includes is shown as
    the reader's number; a verdict shows its one line, with its detail folded under it."""
    raw = {}
    for page in (html / "book").glob("*.html"):
        text = page.read_text()
        blocks = re.findall(r'<div class="highlight">(.*?)</div>', text, flags=re.S)
        blocks += re.findall(r'<details class="tc-verdict">(.*?)</details>', text, flags=re.S)
        hits = [m for b in blocks for m in re.findall(r"\(eq-[\w-]+\)", re.sub(r"<[^>]+>", "", b))]
        if hits:
            raw[page.stem] = hits[:3]
    assert not raw, f"raw equation labels in code: {raw}"
    self_attention = (html / "book" / "self_attention.html").read_text()
    assert re.search(r"<summary>✓ \(3\.\d+\) ", self_attention), (
        "no verdict line with a (3.n) number"
    )


def test_every_interactive_figure_has_alt_text_and_a_browser_test(html: pathlib.Path):
    """The figures the pages display (tc.interactive) are the ones tests/test_site.py moves, at least
    seven, each with a static image whose alt text says what it shows."""
    from test_site import FIGURES

    found = {}
    for page in sorted((html / "book").glob("*.html")):
        text = page.read_text()
        names = re.findall(r'<figure class="tc-fig" id="tc-fig-([a-z0-9-]+)" data-tc-figure>', text)
        alts = re.findall(
            r'<img class="tc-fig-static" src="data:image/png;base64,[^"]+" alt="([^"]+)"', text
        )
        assert len(alts) == len(names), (
            f"{page.name}: a figure without its static image or alt text"
        )
        assert all(len(alt) > 40 for alt in alts), alts
        if names:
            found[f"book/{page.stem}"] = sorted(names)
    assert found == {doc: sorted(names) for doc, names in FIGURES.items()}
    assert sum(map(len, found.values())) >= 7
    assert (html / "_static" / "course-figures.js").exists()


def test_every_figure_of_a_chapter_or_lab_says_what_it_shows(html: pathlib.Path):
    """Every image of a chapter or lab page has alt text in words (tc.plots.describe, or an
    interactive figure's sentence), never its file name."""
    bare = []
    for page in sorted([*(html / "book").glob("*.html"), *(html / "notebooks").glob("*.html")]):
        for tag in re.findall(r"<img\b[^>]*>", page.read_text()):
            alt = re.search(r'alt="([^"]*)"', tag)
            src = re.search(r'src="([^"]*)"', tag)
            bad = alt is None or not alt.group(1).strip() or alt.group(1).endswith(".png")
            if bad or (src and alt.group(1) == src.group(1)):
                bare.append(f"{page.parent.name}/{page.name}: {tag[:120]}")
    assert bare == [], bare[:5]


def verdict_problems(log: pathlib.Path) -> tuple[int, list[str]]:
    """(verdicts, problems) of one page's verdict log (one JSON line per ``verify`` call, written by
    the build; ``tc.checks.VERDICT_LOG_ENV``): a variant rejected by raising, by its shape or by a
    non-finite value that its ``Mistake`` does not declare, a refused variant, or a claim too long for
    one line."""
    import json

    from transformer_course.checks import MAX_CLAIM

    problems, n = [], 0
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if "refused" in record:
            problems.append(f"{log.stem}: refused: {record['refused']}")
            continue
        n += 1
        if len(record["claim"]) > MAX_CLAIM:
            problems.append(f"{log.stem}: a claim of {len(record['claim'])} characters")
        for r in record["rejected"]:
            failed = re.match(r"raises|shape|overflows|gives NaN", r["how"])
            if failed and not r["fails_by"]:
                problems.append(
                    f"{log.stem}: {record['claim']!r} rejects {r['why']!r} by {r['how']}"
                )
    return n, problems


def test_every_check_the_build_ran_rejects_its_variants_by_what_they_compute(
    html: pathlib.Path, tmp_path: pathlib.Path
):
    """Every verdict of every executed page is in the build's verdict log (``_build/verdicts``): each
    page that calls ``verify`` logged its checks, and no wrong variant was rejected only because it
    raised, changed shape or overflowed, unless its ``Mistake`` declares that failure as the point. A
    planted log with such a rejection, and one with a refused variant, fail."""
    import json
    import os

    from pages import toc_pages

    logs = html.parent / "verdicts"
    if not logs.is_dir():
        if os.environ.get("COURSE_BOOK_BUILD"):
            pytest.fail(
                f"no verdict logs in {logs}: the book was not built by scripts/build_book.py"
            )
        pytest.skip("the book was built by jupyter-book alone, which writes no verdict log")
    problems, total = [], 0
    for doc in toc_pages():
        page = ROOT / f"{doc}.md"
        if not page.exists() or "verify(" not in page.read_text():
            continue
        log = logs / f"{page.stem}.jsonl"
        assert log.exists(), f"{doc} calls verify but wrote no verdict log"
        n, found = verdict_problems(log)
        assert n > 0, f"{doc}: an empty verdict log"
        problems += found
        total += n
    assert not problems, "\n".join(problems)
    assert total >= 400, total

    planted = tmp_path / "planted.jsonl"
    shape = {
        "why": "heads stacked along the tokens",
        "how": "shape (4, 2) instead of (2, 4), as it should",
    }
    for record, caught in [
        ({"claim": "c", "rejected": [dict(shape, fails_by=None)]}, True),
        ({"claim": "c", "rejected": [dict(shape, fails_by="shape")]}, False),
        ({"refused": "the wrong variant 'x' of 'c' is a literal constant"}, True),
        (
            {
                "claim": "c" * 100,
                "rejected": [{"why": "x", "how": "misses by 0.5", "fails_by": None}],
            },
            True,
        ),
    ]:
        planted.write_text(json.dumps(record) + "\n")
        assert bool(verdict_problems(planted)[1]) == caught, record
