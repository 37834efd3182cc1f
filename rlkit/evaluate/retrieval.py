"""``rlkit index build`` and ``rlkit index eval``: a recipe's retrieval index, and how well it finds the
gold evidence of the recipe's queries (passage recall, Hits, MRR and MAP at each depth)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.errors import UserError

if TYPE_CHECKING:
    from rlkit.recipe import Recipe


def retrieval_recipe(recipe: Path, overrides: list[str] | None, smoke: bool) -> Recipe:
    """The recipe, which must have a ``retrieval:`` section."""
    from rlkit.recipe import load_recipe

    spec = load_recipe(recipe, overrides or [], smoke=smoke)
    if spec.retrieval is None:
        raise UserError(f"{recipe}: no `retrieval:` section")
    return spec


def build_index(recipe: Path, overrides: list[str] | None, smoke: bool, rebuild: bool) -> str:
    """Build (or load from its cache) the recipe's index; one line saying which, and where."""
    from rlkit.retrieval import build_retriever

    spec = retrieval_recipe(recipe, overrides, smoke)
    retriever = build_retriever(spec.retrieval, model_name=spec.model.name_or_path, rebuild=rebuild)
    how = f"built in {retriever.build_seconds:.1f}s" if retriever.built else "loaded from cache"
    return f"[green]index[/] {len(retriever)} chunks, {how}: {retriever.path}"


def evaluate_index(recipe: Path, overrides: list[str] | None, smoke: bool, *, split: str, limit: int | None,
                   k: str) -> None:
    """Score the recipe's index on the split's queries with gold evidence and print the table."""
    from rlkit.data import WithEvidence, get_task, load_rows
    from rlkit.retrieval import build_retriever
    from rlkit.retrieval import evaluate as evaluate_retrieval

    ks = parse_depths(k)
    spec = retrieval_recipe(recipe, overrides, smoke)
    if split not in ("eval", "train"):
        raise UserError(f"--split {split!r}: use eval or train")
    task = get_task(spec.data.task)
    if not isinstance(task, WithEvidence):
        raise UserError(f"{recipe}: task {spec.data.task!r} has no gold evidence to score retrieval against")
    source = spec.data.train if split == "train" else spec.data.eval
    if source is None:
        raise UserError(f"{recipe}: the recipe has no data.eval split; use --split train")
    if limit:
        source = source.model_copy(update={"limit": limit})
    queries = task.retrieval_queries(load_rows(spec.data.task, source))
    if not queries:
        raise UserError(f"{recipe}: no queries with evidence in data.{split} (qa: map data.columns.supporting_ids)")
    retriever = build_retriever(spec.retrieval, model_name=spec.model.name_or_path)
    metrics = evaluate_retrieval(retriever, queries, ks)
    print_retrieval(metrics, ks, f"retrieval: {spec.name} ({spec.retrieval.method}, {len(retriever)} chunks)")


def parse_depths(text: str) -> tuple[int, ...]:
    """``--k 1,2,5,10`` as sorted distinct positive depths."""
    try:
        ks = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        ks = ()
    if not ks or ks[0] < 1:
        raise UserError(f"--k {text!r}: give positive depths, comma-separated, e.g. --k 1,2,5,10")
    return ks


def print_retrieval(metrics: dict[str, Any], ks: tuple[int, ...], title: str) -> None:
    """Passage recall, Hits, MRR and MAP, one row per depth."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left",
                  caption=f"{metrics['n']} queries, matched by {metrics['matched_by']}, "
                          f"{metrics['queries_per_second']:.0f} queries/s")
    for i, column in enumerate(("k", "passage recall", "hits", "MRR", "MAP")):
        table.add_column(column, justify="left" if i == 0 else "right")
    for depth in ks:
        table.add_row(str(depth), *(f"{metrics[f'{name}@{depth}']:.4f}" for name in ("recall", "hits", "mrr", "map")))
    Console().print(table)
