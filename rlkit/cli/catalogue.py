"""``rlkit recipes`` (list, show, validate) and ``rlkit index`` (build, eval): the recipe catalogue and a
recipe's retrieval index."""

from __future__ import annotations

from pathlib import Path

import typer

from rlkit.cli.options import SetOpt, SmokeOpt, console
from rlkit.errors import UserError

recipes_app = typer.Typer(help="List, show and validate recipes.", no_args_is_help=True)
index_app = typer.Typer(help="Build and evaluate a recipe's retrieval index.", no_args_is_help=True)


@recipes_app.command("list")
def recipes_list() -> None:
    """The shipped recipes."""
    from rich.table import Table

    from rlkit.recipe import read_yaml, recipe_header, shipped_recipes

    table = Table(title="shipped recipes")
    for col in ("name", "algorithm", "model", "about"):
        table.add_column(col)
    for path in shipped_recipes():
        data = read_yaml(path)
        header = recipe_header(path).splitlines()
        table.add_row(path.stem, str(data.get("algorithm")), str((data.get("model") or {}).get("name_or_path")),
                      header[0] if header else "")
    console().print(table)


@recipes_app.command("show")
def recipes_show(name: str = typer.Argument(..., help="A shipped recipe name or a path.")) -> None:
    """Print a recipe."""
    from rich.syntax import Syntax

    from rlkit.recipe import find_recipe

    path = find_recipe(name)
    console().print(Syntax(path.read_text(), "yaml", word_wrap=True))
    console().print(f"[dim]{path}[/]")


@recipes_app.command("validate")
def recipes_validate(
    paths: list[Path] = typer.Argument(None, help="Recipe files (default: every shipped recipe)."),
    smoke: bool = SmokeOpt,
) -> None:
    """Validate recipes (schema and TRL config) without loading any model."""
    from rlkit.recipe import load_recipe, shipped_recipes
    from rlkit.trainers import check_trainer

    out = console()
    failed = 0
    for path in paths or shipped_recipes():
        try:
            recipe = load_recipe(path, smoke=smoke)
            check_trainer(recipe, source=str(path))
        except UserError as e:
            failed += 1
            out.print(f"[red]✗[/] {e}", highlight=False)
        else:
            out.print(f"[green]✓[/] {path} ({recipe.algorithm}, {recipe.model.name_or_path})", highlight=False)
    if failed:
        raise typer.Exit(2)


@index_app.command("build")
def index_build(
    recipe: Path = typer.Argument(..., help="A recipe with a `retrieval:` section."),
    rebuild: bool = typer.Option(False, "--rebuild", help="Build again even when a cached index exists."),
    smoke: bool = SmokeOpt,
    set_: list[str] = SetOpt,
) -> None:
    """Chunk and index the recipe's corpus (cached on disk by corpus + settings)."""
    from rlkit.evaluate.retrieval import build_index

    console().print(build_index(recipe, set_, smoke, rebuild))


@index_app.command("eval")
def index_eval(
    recipe: Path = typer.Argument(..., help="A recipe with `retrieval:` and queries with gold evidence."),
    split: str = typer.Option("eval", "--split", help="Which data split's queries: eval or train."),
    limit: int = typer.Option(None, "--limit", min=1, help="The first N queries."),
    k: str = typer.Option("1,2,5,10", "--k", help="Depths to score at, comma-separated, e.g. 1,2,5,10."),
    smoke: bool = SmokeOpt,
    set_: list[str] = SetOpt,
) -> None:
    """Passage recall, Hits, MRR and MAP at each k over the queries with gold evidence (by id when ids exist)."""
    from rlkit.evaluate.retrieval import evaluate_index

    evaluate_index(recipe, set_, smoke, split=split, limit=limit, k=k)
