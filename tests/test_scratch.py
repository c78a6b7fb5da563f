"""The from-scratch files stay what a learner types: torch only, never the package, within their line
budgets (``src/transformer_course/scratch/``). Their equality with the package's models is proven in
``tests/test_scratch_<file>.py``."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRATCH = ROOT / "src" / "transformer_course" / "scratch"
# Non-blank lines (code, comments and docstrings) each file may have: issue 34's budgets.
BUDGETS = {"attention.py": 60, "gpt.py": 150, "seq2seq.py": 150, "vit.py": 100, "bert.py": 120}
ALLOWED = {"__future__", "math", "torch", "torch.nn", "torch.nn.functional", "torch.Tensor"}


def imports(source: str) -> set[str]:
    """The modules a file imports (``from torch import nn`` counts as ``torch.nn``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            found |= {f"{base}.{a.name}" if base in ("torch",) else base for a in node.names}
    return found


def lines(source: str) -> int:
    return sum(1 for line in source.splitlines() if line.strip())


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_a_scratch_file_imports_torch_only_and_keeps_its_budget(name):
    source = (SCRATCH / name).read_text()
    extra = imports(source) - ALLOWED
    assert not extra, f"scratch/{name} imports {sorted(extra)}: a learner's file uses torch only"
    assert lines(source) <= BUDGETS[name], (
        f"scratch/{name} has {lines(source)} non-blank lines, over its budget of {BUDGETS[name]}"
    )


def test_every_scratch_file_has_a_budget():
    assert {p.name for p in SCRATCH.glob("*.py")} - {"__init__.py"} == set(BUDGETS)


def test_the_guards_catch_the_package_and_a_long_file():
    assert imports("from .. import block\nimport transformer_course as tc\n") - ALLOWED == {
        "..",
        "transformer_course",
    }
    assert (
        imports("import torch\nfrom torch import nn\nimport torch.nn.functional as F\n") <= ALLOWED
    )
    assert lines("x = 1\n\n" * 200) == 200
