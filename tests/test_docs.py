"""The docs site builds offline with --strict, its CLI reference is generated from the app, and the README fits."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("mkdocs", reason="the docs extra is not installed (`pip install -e .[docs]`)")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, env=env, cwd=config.parent, timeout=300)


def test_the_site_builds_strictly_and_documents_every_command(tmp_path):
    done = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    import typer

    from rlkit.cli import app

    cli_page = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    commands = typer.main.get_command(app).commands
    assert len(commands) >= 12
    for name in commands:
        assert f"rlkit {name}" in cli_page, f"the CLI reference lacks `rlkit {name}`"
    api_page = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "rlkit.recipe.load_recipe" in api_page or "load_recipe" in api_page
    for page in ("install", "recipes", "agents", "doctor", "merging", "scaling", "runs", "safety", "performance",
                 "gpu", "architecture", "changelog"):
        assert (tmp_path / "site" / page / "index.html").is_file(), page


def test_a_broken_link_fails_the_strict_build(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copy(ROOT / "CHANGELOG.md", copy / "CHANGELOG.md")
    with (copy / "docs" / "install.md").open("a") as f:
        f.write("\nSee [the missing page](no-such-page.md).\n")
    done = _build(copy / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr


def test_readme_fits_its_budget_and_links_into_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for page in ("docs/recipes.md", "docs/agents.md", "docs/performance.md"):
        assert page in readme
        assert (ROOT / page).is_file()


def test_version_is_one_number_everywhere():
    from importlib.metadata import version

    import rlkit

    done = subprocess.run([sys.executable, "-m", "rlkit", "--version"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip() == f"rlkit {rlkit.__version__}"
    assert f"## [{rlkit.__version__}]" in (ROOT / "CHANGELOG.md").read_text()
    if Path(rlkit.__file__).resolve().parent.parent == ROOT:
        assert version("rlkit") == rlkit.__version__
