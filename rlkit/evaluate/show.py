"""``rlkit eval``'s results as terminal tables."""

from __future__ import annotations

from typing import Any

from rlkit.evaluate.sampled import print_sampled
from rlkit.stats import show_accuracy


def print_eval(results: dict[str, Any]) -> None:
    """Accuracy of a task eval (or a reward model), or an agent eval's table per question type."""
    from rich.console import Console
    from rich.table import Table

    if "by_question_type" in results:  # an agent recipe: EM/F1/accuracy per question type
        print_agent_eval(results)
        return
    table = Table(title=f"eval: {results['recipe']} ({results['task']})")
    for col in ("model", "examples", "accuracy [95% interval]", "seconds"):
        table.add_column(col, justify="left" if col == "model" else "right")
    table.add_row(results["model"], str(results["n"]), show_accuracy(results["accuracy"], results["n"],
                                                                     results.get("interval")),
                  f"{results['seconds']:.1f}")
    console = Console()
    console.print(table)
    console.print(f"per-example predictions: {results['path']}")
    if "samples" in results:
        print_sampled(results, console)


def print_agent_eval(results: dict[str, Any]) -> None:
    """Accuracy, EM, F1 (and evidence recall where questions have supporting ids) per question type."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"eval: {results['recipe']} ({results['task']}) — {results['model']}")
    evidence = results.get("evidence_recall") is not None  # questions with supporting ids
    for col in ("question type", "n", "accuracy", "EM", "F1", *(["evidence recall"] if evidence else [])):
        table.add_column(col, justify="left" if col == "question type" else "right")

    def cell(row: dict[str, Any], key: str) -> str:  # with its 95% interval; "-" where absent (GSM8K has no F1)
        return show_accuracy(row.get(key), None, (row.get("intervals") or {}).get(key))

    for name, row in results["by_question_type"].items():
        recall = [cell(row, "evidence_recall")] if evidence else []
        table.add_row(name, str(row["n"]), cell(row, "accuracy"), cell(row, "em"), cell(row, "f1"), *recall)
    console = Console()
    console.print(table)
    console.print(f"{results['seconds']:.1f}s; results: {results['path']}; trajectories: {results['trajectories']}")
    if "samples" in results:
        print_sampled(results, console)
