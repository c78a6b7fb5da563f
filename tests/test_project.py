"""The project's own promises: the repository URL lives in pyproject.toml and everything that repeats it
agrees; every chapter has its page, lab, exercises, tests and module under one name (CONTRIBUTING.md)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import yaml

from transformer_course import project

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_url_comes_from_pyproject():
    # a regular expression rather than tomllib, which Python 3.10 lacks
    urls = re.findall(r'^Repository = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert urls and project.repository_url() == urls[0].rstrip("/")
    assert project.github_slug().count("/") == 1


def test_book_config_repeats_the_same_url():
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert cfg["repository"]["url"].rstrip("/") == project.repository_url()
    assert cfg["repository"]["branch"] == project.BRANCH


def test_readme_links_are_generated_from_the_url():
    readme = (ROOT / "README.md").read_text()
    urls = set(re.findall(r"https://github\.com/[\w.-]+/[\w.-]+", readme))
    assert urls == {project.repository_url()}, urls
    for link in re.findall(r"https://colab\.research\.google\.com/github/\S+?\.ipynb", readme):
        path = link.split(f"/blob/{project.BRANCH}/", 1)[1]
        assert link == project.colab_url(path)
        assert (ROOT / path).exists(), path


def test_every_lab_has_a_current_badge_and_setup_cell():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sync_labs.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_labs_badge_points_at_their_own_path_and_never_reinstall_torch():
    labs = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert labs, "no labs found"
    for lab in labs:
        nb = json.loads(lab.read_text())
        badge = "".join(nb["cells"][0]["source"])
        assert project.colab_url(f"notebooks/{lab.name}") in badge
        setup = "".join(nb["cells"][1]["source"])
        assert project.install_spec() in setup
        assert 'find_spec("transformer_course") is None' in setup
        assert "torch==" in setup and "pip install torch" not in setup
        assert "sys.path" not in json.dumps(nb), f"{lab.name} edits sys.path"


def test_every_chapter_names_an_existing_lab():
    for page in sorted((ROOT / "book").glob("*.md")):
        text = page.read_text()
        for lab in re.findall(r"```\{lab\} (\S+)", text):
            assert (ROOT / lab).exists(), f"{page.name} links to missing lab {lab}"
            assert f"lab: {lab}" in text, f"{page.name}: front matter must name the same lab"


def test_every_lab_chooses_its_device_through_the_package():
    """The GPU workflow proves the labs ran on CUDA from the log that tc.default_device() writes."""
    for lab in sorted((ROOT / "notebooks").glob("*.ipynb")):
        sources = "".join("".join(c["source"]) for c in json.loads(lab.read_text())["cells"])
        assert "tc.default_device()" in sources, f"{lab.name} never calls tc.default_device()"


def _chapter_map() -> list[dict[str, str]]:
    """The rows of CONTRIBUTING.md's table: stem, lab, exercises, tests, module."""
    rows = []
    for line in (ROOT / "CONTRIBUTING.md").read_text().splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0].isdigit():
            keys = ("number", "stem", "page", "lab", "exercises", "tests", "module")
            rows.append(dict(zip(keys, cells, strict=True)))
    return rows


def test_every_figure_stored_in_a_lab_says_what_it_shows():
    """A lab's stored figures carry their description (tc.plots.describe, in the PNG's Description
    field), which the site uses as alt text: the labs were last executed with the package imported
    (``make labs``), not saved from an older run."""
    import base64
    import io

    from PIL import Image

    bare, seen = [], 0
    for lab in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(lab.read_text())["cells"]):
            for output in cell.get("outputs", []):
                png = output.get("data", {}).get("image/png")
                if png:
                    seen += 1
                    text = Image.open(io.BytesIO(base64.b64decode(png))).info.get("Description")
                    if not text or len(text) < 15:
                        bare.append(f"{lab.name}, cell {i}: {text!r}")
    assert seen >= 20 and bare == [], bare


# A number below 1e-8 written with digits (4e-16, 3.1e-12, 0.000000002) is rounding noise, which differs
# between processors; a checked output may print it only as a bound ("below 1e-12", "< 1e-12").
_TINY = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?(?:e-\d+)|0\.0{8,}\d+)(?!\w|\.\d)")
_AS_BOUND = re.compile(r"(?:<|≤|<=|below|under|within|at most)\s*$")


def rounding_noise_in_checked_outputs(lab: pathlib.Path) -> list[str]:
    """Numbers below 1e-8 that a lab's nbval-checked cells (``# NBVAL_CHECK_OUTPUT``) print, unless they
    are printed as a bound."""
    found = []
    for i, cell in enumerate(json.loads(lab.read_text())["cells"]):
        if cell["cell_type"] != "code" or "NBVAL_CHECK_OUTPUT" not in "".join(cell["source"]):
            continue
        for output in cell.get("outputs", []):
            text = "".join(output.get("text", "") or output.get("data", {}).get("text/plain", ""))
            for m in _TINY.finditer(text):
                if 0 < float(m.group(1)) < 1e-8 and not _AS_BOUND.search(text[: m.start()]):
                    found.append(
                        f"{lab.name}, cell {i}: ...{text[max(0, m.start() - 60) : m.end()]}"
                    )
    return found


def test_no_checked_lab_output_prints_rounding_noise(tmp_path: pathlib.Path):
    """nbval compares the stored outputs of checked cells on whatever processor runs it (Intel, AMD, a
    GPU): one that prints a rounding error (``largest difference 4e-16``, ``7e-16`` on another machine)
    fails there. Planted in a copy of a lab, such a number is found; printed as a bound, it is not."""
    noisy = [
        hit
        for lab in sorted((ROOT / "notebooks").glob("*.ipynb"))
        for hit in rounding_noise_in_checked_outputs(lab)
    ]
    assert noisy == [], "print these as a bound (tc.checks.bound):\n" + "\n".join(noisy)

    lab = json.loads((ROOT / "notebooks" / "00_notation.ipynb").read_text())
    planted = {
        "cell_type": "code",
        "execution_count": 1,
        "id": "planted",
        "metadata": {},
        "outputs": [],
        "source": ["# NBVAL_CHECK_OUTPUT\n"],
    }
    for text, caught in [
        ("largest difference 4e-16.\n", True),
        ("error 2.5e-12\n", True),
        ("largest difference below 1e-12.\n", False),
        ("max |Δ| < 1e-12: True\n", False),
        ("loss 1.9e-3, lr 3e-4\n", False),
    ]:
        cell = dict(planted, outputs=[{"name": "stdout", "output_type": "stream", "text": [text]}])
        path = tmp_path / "lab.ipynb"
        path.write_text(json.dumps(dict(lab, cells=lab["cells"] + [cell])))
        assert bool(rounding_noise_in_checked_outputs(path)) == caught, text


def _registered_by(exercise) -> str:
    """The module that registered ``exercise``: the one it names (a capstone exercise's
    ``registered_by``), else its solution's; a solution from ``scratch/`` (a lab's reference model,
    which registers nothing) counts as registered by the chapter its name gives."""
    module = getattr(exercise, "registered_by", "") or exercise.solution.__module__
    if module.startswith("transformer_course.scratch."):
        return f"transformer_course.exercises.{exercise.name.split('.')[0]}"
    return module


def test_every_chapter_has_one_name_for_page_lab_exercises_tests_and_module():
    import importlib

    import transformer_course.exercises as ex

    rows = _chapter_map()
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    chapters = [
        c["file"]
        for part in toc["parts"]
        for c in part["chapters"]
        if c["file"].startswith("book/")
    ]
    with_labs = [f"book/{r['stem']}" for r in rows]
    assert [c for c in chapters if c in with_labs] == with_labs, (
        "the map lists the chapters in order"
    )
    for r in rows:
        X, n = r["stem"], int(r["number"])
        assert (ROOT / "book" / f"{X}.md").exists(), X
        assert r["lab"] == f"notebooks/{n:02d}_{X}.ipynb" and (ROOT / r["lab"]).exists(), r["lab"]
        assert r["exercises"] in (f"exercises/{X}.py", f"exercises/{X}/"), r  # or one file per part
        assert (ROOT / "src" / "transformer_course" / r["exercises"]).exists(), X
        names = ex.list_exercises(f"{X}.")
        assert names, f"exercises/{X}.py registers no exercise named {X}.*"
        module = importlib.import_module(f"transformer_course.exercises.{X}")
        registered_here = [
            n
            for n, e in ex._REGISTRY.items()
            if f"{_registered_by(e)}.".startswith(f"{module.__name__}.")  # the module, or its parts
        ]
        assert sorted(registered_here) == names, f"exercises/{X}.py registers names outside {X}.*"
        assert r["tests"] == f"tests/test_{X}.py" and (ROOT / r["tests"]).exists(), r["tests"]
        assert r["module"] in (f"{X}.py", f"{X}/"), r  # a module, or a subpackage split by part
        assert (ROOT / "src" / "transformer_course" / r["module"]).exists(), X
        page = (ROOT / "book" / f"{X}.md").read_text()
        assert f"lab: {r['lab']}" in page, f"book/{X}.md does not name its lab"
    stems = {r["stem"] for r in rows}
    exercises_dir = ROOT / "src/transformer_course/exercises"
    exercise_files = {p.stem for p in exercises_dir.glob("*.py")}
    exercise_files |= {p.parent.name for p in exercises_dir.glob("*/__init__.py")}
    assert exercise_files - {"__init__"} == stems, "an exercise module without a chapter"
    labs = {
        p.name.split("_", 1)[1].removesuffix(".ipynb") for p in (ROOT / "notebooks").glob("*.ipynb")
    }
    assert labs == stems, "a lab without a chapter"


def test_every_package_name_the_pages_and_labs_mention_exists():
    """Prose and code name the package's objects as `tc.module.name`; a rename must not leave a dead one
    (code cells fail the build, but names in prose and in comments would not)."""
    import importlib

    import transformer_course as tc

    def resolve(dotted: str) -> bool:
        obj = tc
        for part in dotted.split("."):
            if hasattr(obj, part) or part == "exercises":
                obj = getattr(obj, part)
                continue
            try:
                obj = importlib.import_module(f"{obj.__name__}.{part}")
            except (ImportError, AttributeError):
                return False
        return True

    sources = sorted((ROOT / "book").glob("*.md")) + sorted((ROOT / "notebooks").glob("*.ipynb"))
    dead = {
        (path.name, name)
        for path in sources
        for name in re.findall(r"\btc\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)", path.read_text())
        if not resolve(name)
    }
    assert not dead, sorted(dead)


def _book_labels() -> set[str]:
    return {
        label
        for page in (ROOT / "book").glob("*.md")
        for label in re.findall(r"^:label: ([\w-]+)", page.read_text(), flags=re.M)
    }


def test_every_equation_label_a_docstring_names_exists_in_the_book():
    """Docstrings say which equation they implement (``eq-...``); a renamed or dropped label must not
    leave a docstring pointing nowhere."""
    labels = _book_labels()
    dead = {
        (path.relative_to(ROOT).as_posix(), name)
        for path in (ROOT / "src" / "transformer_course").rglob("*.py")
        for name in re.findall(r"\b(eq-[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*)", path.read_text())
        if name not in labels
    }
    assert not dead, sorted(dead)


def _prose(page: pathlib.Path) -> str:
    """A page without its code cells, math blocks and front matter: the sentences a reader reads."""
    text = page.read_text()
    if text.startswith("---"):
        text = text.split("---", 2)[2]
    return re.sub(r"```\{(code-cell|math)\}.*?```", "", text, flags=re.S)


def test_other_chapters_are_named_by_links_not_by_plain_text():
    """A mention of another chapter is a `{doc}` link, so the strict build fails when it goes dead;
    'a later chapter' or 'the chapter *Title*' in plain text would go dead silently."""
    titles = {}
    for page in (ROOT / "book").glob("*.md"):
        first = next(ln for ln in _prose(page).splitlines() if ln.startswith("# "))
        titles[page.stem] = first[2:].strip()
    patterns = [
        r"\b(a|the) (later|next|previous|last|earlier|final) chapter\b(?![^.\n]*\{doc\})",
        r"\bthe chapter \*[^*]+\*",
        r"\bchapter \d+\b(?![^.\n]*\{doc\})",
    ]
    bad = []
    for page in sorted((ROOT / "book").glob("*.md")):
        prose = _prose(page)
        for pattern in patterns:
            for m in re.finditer(pattern, prose, flags=re.I):
                before = prose[max(0, m.start() - 60) : m.start()]
                if "{cite" in before or "section" in before:  # a chapter of a cited book
                    continue
                bad.append((page.name, m.group(0)))
        for stem, title in titles.items():
            if stem != page.stem and f"*{title}*" in prose:
                bad.append((page.name, f"*{title}* in italics instead of {{doc}}`{stem}`"))
    assert not bad, bad


def test_citation_file_agrees_with_the_project_and_gives_a_bibtex_entry():
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["license"] == "MIT"
    assert citation["repository-code"].rstrip("/") == project.repository_url()
    meta = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{citation["version"]}"' in meta
    assert re.search(rf'^Homepage = "{re.escape(citation["url"])}"$', meta, flags=re.M)
    entry = project.bibtex(citation)
    assert entry.startswith("@software{transformer_course2026,") and entry.endswith("}")
    assert "title = {Transformers, equation by equation}" in entry


def test_the_lab_time_budget_fails_a_slow_lab(tmp_path: pathlib.Path):
    """notebooks/conftest.py measures each lab's kernel under nbval (its CPU time on Linux, so the
    budget holds beside other jobs) and fails the run over budget."""
    import nbformat

    shutil.copy(ROOT / "notebooks" / "conftest.py", tmp_path / "conftest.py")
    nb = nbformat.v4.new_notebook()
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5:\n    pass"
    nb.cells = [nbformat.v4.new_code_cell(busy), nbformat.v4.new_code_cell("time.sleep(3)")]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, tmp_path / "99_slow.ipynb")

    def run(budget: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "--nbval-lax", "-p", "no:cacheprovider", "-q", "."],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "LAB_BUDGET_S": budget},
        )

    slow = run("1.4")  # 1.5 s of computing: over budget
    assert slow.returncode == 1 and "99_slow.ipynb (CPU time of its kernel)   OVER BUDGET" in (
        slow.stdout
    ), slow.stdout
    fine = run("4")  # the 3 s of sleep are not computing: under 4 s of CPU time, over 4 s of wall
    assert fine.returncode == 0 and "lab run times (budget 4 s each)" in fine.stdout, fine.stdout


def test_a_lab_setup_cell_installs_the_package_and_keeps_the_runtime_torch(tmp_path: pathlib.Path):
    """What the first cell of every lab does in Colab, here: a fresh environment that already has a
    torch (this one's, seen through a .pth file, as Colab's preinstalled libraries are) gets the course
    package from the local checkout in place of the git URL; torch must be neither installed nor
    upgraded, and it must take seconds."""
    import time

    import torch

    sys.path.insert(0, str(ROOT / "scripts"))
    import sync_labs

    venv = tmp_path / "colab"
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a PYTHONPATH at src/ would
    # make the course importable before the setup cell installs it
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = pathlib.Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            env=clean,
            check=True,
        ).stdout.strip()
    )
    runtime = tmp_path / "runtime"  # the "preinstalled" libraries: everything but the course
    runtime.mkdir()
    ours = pathlib.Path(torch.__file__).resolve().parents[1]
    for entry in ours.iterdir():
        if "transformer_course" not in entry.name.lower().replace("-", "_"):
            (runtime / entry.name).symlink_to(entry)
    (site / "runtime.pth").write_text(f"{runtime}\n")
    probe = (
        "import importlib.util, torch; "
        "print(importlib.util.find_spec('transformer_course'), torch.__version__)"
    )
    before = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, env=clean, check=True
    )
    assert before.stdout.split() == ["None", torch.__version__]

    setup = sync_labs.setup_source().replace(project.install_spec(), str(ROOT))
    assert str(ROOT) in setup and "git+" not in setup
    # CPU time, not wall time: on a busy machine (make test runs the book beside these tests) the
    # install waits for the cores; what must stay small is the work it does
    t0, cpu0 = time.perf_counter(), _children_cpu()
    done = subprocess.run(
        [python, "-c", setup], capture_output=True, text=True, env=clean, timeout=600
    )
    seconds, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    assert done.returncode == 0, done.stderr[-2000:]
    check = (
        "import torch, transformer_course as tc; "
        "print(torch.__version__, torch.__file__, tc.__file__, tc.language_models.GPT.__name__)"
    )
    after = subprocess.run(
        [python, "-c", check], capture_output=True, text=True, env=clean, check=True
    )
    version, torch_file, tc_file, name = after.stdout.split()
    assert version == torch.__version__ and torch_file.startswith(str(runtime)), after.stdout
    assert tc_file.startswith(str(site)) and name == "GPT", (
        after.stdout
    )  # installed, not the source tree
    assert not (site / "torch").exists(), "the setup cell installed a torch of its own"
    assert cpu < 60, f"the setup cell took {cpu:.1f} CPU-s ({seconds:.1f} s)"


def _children_cpu() -> float:
    """CPU seconds of every child process this one has waited for (pip and what it started)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_every_labelled_equation_is_implemented_or_marked_as_a_derivation():
    """The equation index (book/equations.md) lists, for every label, the code that implements it and
    the tests that check that code; an equation with no code must say it is a step of a derivation."""
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    import equation_index

    equations = equation_index.analyse(ROOT)
    assert len(equations) > 100
    orphans = [e.label for e in equations.values() if not e.implementers and not e.derivation_only]
    assert not orphans, f"no implementing docstring and no ':class: derivation-only': {orphans}"
    untested = [e.label for e in equations.values() if e.implementers and not e.tests]
    assert not untested, f"implemented, but no test uses the implementing code: {untested}"


def test_the_equation_index_reads_explicit_markers_and_calls_not_mentions(tmp_path: pathlib.Path):
    """A docstring that mentions a label implements nothing without ``Implements:``; a test checks
    code only when it calls it (a local variable of the same name does not count)."""
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    import equation_index

    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "page.md").write_text(
        "```{math}\n:label: eq-a\nx\n```\n\n```{math}\n:label: eq-b\ny\n```\n"
    )
    pkg = tmp_path / "src" / "transformer_course"
    pkg.mkdir(parents=True)
    (pkg / "mod.py").write_text(
        'def f():\n    """Implements: eq-a"""\n\n\n'
        'def oracle():\n    """A loop compared with eq-b in the tests (book eq. eq-b)."""\n\n\n'
        "class Layer:\n"
        '    """Implements: eq-b"""\n\n'
        "    def forward(self):\n        pass\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_mod.py").write_text(
        "def test_calls_f():\n    f()\n\n\n"
        "def test_only_names_f():\n    f = 1\n    assert f\n\n\n"
        "def test_builds_layer():\n    Layer()(1)\n"
    )
    found = equation_index.analyse(tmp_path)
    assert found["eq-a"].implementers == ["transformer_course.mod.f"]
    assert found["eq-b"].implementers == ["transformer_course.mod.Layer"]  # not the oracle
    assert found["eq-a"].tests == ["tests/test_mod.py::test_calls_f"]
    assert found["eq-b"].tests == ["tests/test_mod.py::test_builds_layer"]


def test_the_book_and_the_tests_stop_in_one_line_without_the_corpus(tmp_path: pathlib.Path):
    """Offline with no copy of tiny-shakespeare, `make book` (scripts/build_book.py) and `make test`
    (scripts/run_tests.py) stop before running any page or test, with the one line that says where to
    put the file, and no traceback."""
    env = {**os.environ, "TRANSFORMER_COURSE_DATA": str(tmp_path / "empty")}
    for script, args in (
        ("build_book.py", ["--path-output", str(tmp_path / "out")]),
        ("run_tests.py", []),
    ):
        done = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / script), *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, (script, done.stdout, done.stderr)
        assert "put the corpus there" in lines[0] and "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "out").exists()  # no page ran
