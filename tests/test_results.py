"""Benchmark results as the book reads them: loading, targets, and the warning for stale results."""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

from transformer_course import results


def _git(root: pathlib.Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: pathlib.Path) -> pathlib.Path:
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@example.org")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("x = 1\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "code")
    return tmp_path


def _write(root: pathlib.Path, name: str, data: dict) -> None:
    folder = root / "bench" / "results" / "cpu"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(data))


def test_load_and_targets(tmp_path):
    _write(tmp_path, "a", {"targets": {"x": ["<=", 2], "y": [">=", 5], "z": ["==", True]},
                           "x": 1.5, "y": 4, "z": True, "commit": "abc"})  # fmt: skip
    r = results.load(tmp_path)["a"]
    assert r.name == "a" and r.device == "cpu" and r["x"] == 1.5
    assert results.met(r, "x") and not results.met(r, "y") and results.met(r, "z")
    with pytest.raises(KeyError):
        results.met(r, "missing")
    assert results.load(tmp_path, "cuda") == {}


def test_a_result_is_current_until_the_code_changes(repo):
    measured_at = _git(repo, "rev-parse", "--short", "HEAD")
    result = results.Result("a", "cpu", {"commit": measured_at})
    assert results.staleness(result, repo) is None
    (repo / "bench" / "results").mkdir(parents=True)
    (repo / "bench" / "results" / "r.json").write_text("{}")  # new results do not age a result
    (repo / "README").write_text("prose\n")  # nor do changes outside the code
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "results and prose")
    assert results.staleness(result, repo) is None
    (repo / "src" / "m.py").write_text("x = 2\n")
    _git(repo, "commit", "-qam", "code changed")
    assert "older than the latest change to the code" in results.staleness(result, repo)
    dirty = results.Result("a", "cpu", {"commit": measured_at + "+changes"})
    assert "uncommitted changes" in results.staleness(dirty, repo)
    unknown = results.Result("a", "cpu", {"commit": "0123456"})
    assert "not in this clone's history" in results.staleness(unknown, repo)
