"""The repository URL lives in pyproject.toml; everything that repeats it is checked here."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import tomllib
import yaml

from transformer_course import project

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_url_comes_from_pyproject():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project.repository_url() == meta["project"]["urls"]["Repository"].rstrip("/")
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
