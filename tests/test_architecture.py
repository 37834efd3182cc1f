"""The package's shape: layered imports with no loops (import-linter), every module placed in a layer,
and no module grown past what one reader holds in their head."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rlkit"
MAX_LINES = 350


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_imports_follow_the_layers_and_never_loop():
    lint = Path(sys.executable).parent / "lint-imports"
    if not lint.exists():
        pytest.skip("import-linter is not installed (it comes with the dev extra: make install)")
    done = subprocess.run([str(lint), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


def test_every_module_has_a_layer():
    layers = next(c["layers"] for c in _contracts() if c["type"] == "layers")
    placed = {name.strip() for layer in layers for name in layer.replace("|", ":").split(":")}
    modules = {f"rlkit.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    packages = {f"rlkit.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py")}
    assert modules | packages == placed, "add the new module to a layer in pyproject.toml [tool.importlinter]"


def test_no_module_is_too_long():
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "bench").glob("*.py")]
    lengths = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in files}
    assert {path: n for path, n in lengths.items() if n > MAX_LINES} == {}
