"""``rlkit eval TARGET --suite FILE|NAME``'s body: evaluate on every set of a suite (:mod:`rlkit.evaluate.suite`)
and print one table, a column per set, the base and the trained model side by side."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.stats import show_accuracy, show_diff

if TYPE_CHECKING:
    from rlkit.evaluate.served import Served

GAIN_CAPTION = ("gain: trained - base on the same problems, its 95% paired-bootstrap interval and p (exact McNemar "
                "for right/wrong answers); * = significant at 5%")


def eval_suite(target: str, suite_name: str, *, model: str | None, base: str | None, no_base: bool,
               limit: int | None, out: Path | None, overrides: list[str],
               served: Served | None = None) -> dict[str, Any]:
    from rlkit.evaluate.suite import load_suite, run_suite

    suite = load_suite(suite_name)  # a mistake in the suite fails before any model loads
    summary = run_suite(target, suite, model=model, base=base, no_base=no_base, limit=limit, out=out,
                        overrides=overrides, served=served)
    print_suite(summary)
    return summary


def cell(entry: dict[str, Any]) -> str:
    """``0.550 [0.452, 0.644] (55/100)``: the accuracy, its 95% interval and the counts it comes from."""
    return f"{show_accuracy(entry['accuracy'], entry['n'], entry.get('interval'))} ({entry['correct']}/{entry['n']})"


def suite_table(summary: dict[str, Any]) -> Any:
    """The suite's table: a row per model (base first), a column per set; the paired gain row when there are two."""
    from rich.table import Table

    names = [s["name"] for s in summary["sets"]]
    gains = summary.get("gain")
    table = Table(title=f"eval suite {summary['suite']}: greedy accuracy [95% interval] (correct/n)",
                  caption=GAIN_CAPTION if gains else None)
    table.add_column("model")
    for name in names:
        table.add_column(name, justify="right")
    for row in summary["rows"]:
        table.add_row(f"{row['role']}: {row['model']}", *(cell(row["sets"][n]) for n in names))
    if gains:
        table.add_row("gain", *(show_diff(gains[n]) for n in names))
    return table


def print_suite(summary: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # a log file or a pipe: wide enough for every set's column, never cut
        console = Console(width=max(80, 48 + 36 * len(summary["sets"])))
    console.print(suite_table(summary))
    for s in summary["sets"]:
        if s["about"]:
            console.print(f"[dim]{s['name']}: {s['about']}[/]")
    console.print(f"per-set results and predictions: {Path(summary['path']).parent}/ (table: {summary['path']})")
