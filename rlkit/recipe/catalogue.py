"""The recipes rlkit ships (``recipes/``): listed, found by name, and described by their comment header."""

from __future__ import annotations

from pathlib import Path

from rlkit.errors import UserError
from rlkit.registry import did_you_mean


def recipes_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "recipes"


def shipped_recipes() -> list[Path]:
    return sorted(recipes_dir().glob("*.yaml"))


def find_recipe(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    for candidate in (recipes_dir() / name_or_path, recipes_dir() / f"{name_or_path}.yaml"):
        if candidate.is_file():
            return candidate
    names = [p.stem for p in shipped_recipes()]
    raise UserError(f"{name_or_path}: no such recipe file or shipped recipe{did_you_mean(name_or_path, names)}; "
                    f"shipped: {', '.join(names)}")


def recipe_header(path: Path) -> str:
    """The recipe's leading comment block (purpose, hardware, command)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return "\n".join(lines)
