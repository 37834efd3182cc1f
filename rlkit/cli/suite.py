"""``rlkit eval TARGET --suite FILE|NAME``'s body: evaluate on every set of a suite (:mod:`rlkit.evaluate.suite`)
and print one table, a row per set, the base and the trained model side by side (also ``suite.md``); and
``rlkit compare``'s: models already evaluated on one suite, paired against the first."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.errors import UserError
from rlkit.stats import show_accuracy, show_cut, show_degenerate, show_diff

if TYPE_CHECKING:
    from collections.abc import Callable

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
    """The suite's table (:func:`rlkit.evaluate.show.results_table`): a row per set, a column per model (base
    first), and the paired gain when there are two."""
    from rlkit.evaluate.show import results_table

    gains = summary.get("gain")
    return results_table(
        f"eval suite {summary['suite']}: greedy accuracy [95% interval] (correct/n)",
        [{"set": s["name"],
          **{f"{row['role']}: {row['model']}": cell(row["sets"][s["name"]]) for row in summary["rows"]},
          **({"gain": show_diff(gains[s["name"]])} if gains else {}),
          **_beside(summary, s["name"], "degenerate", "degenerate", show_degenerate),
          **_beside(summary, s["name"], "cut", "cut by token limit", show_cut)}
         for s in summary["sets"]],
        caption=GAIN_CAPTION if gains else None)


def _beside(summary: dict[str, Any], name: str, key: str, column: str,
            show: Callable[[dict[str, Any]], str]) -> dict[str, str]:
    """``{column: "base -> trained"}``: a share set ``name``'s cells carry, shown for each model; nothing when no
    cell has it (results written before rlkit recorded it)."""
    cells = [row["sets"][name] for row in summary["rows"]]
    return {column: " -> ".join(show(c) for c in cells)} if any(key in c for c in cells) else {}


def print_suite(summary: dict[str, Any]) -> None:
    from rich.console import Console

    from rlkit import safety

    console = Console()
    table = suite_table(summary)
    console.print(table)
    for s in summary["sets"]:
        if s["about"]:
            console.print(f"[dim]{s['name']}: {s['about']}[/]")
    markdown = Path(summary["path"]).with_suffix(".md")
    safety.write_text(markdown, table.markdown())
    console.print(f"per-set results and predictions: {markdown.parent}/ (table: {summary['path']}, {markdown.name})")


def compare_table(summary: dict[str, Any]) -> Any:
    """``rlkit compare``'s table: a row per set (then pooled), each model's accuracy [95% interval], then each
    later model minus the first, paired."""
    from rlkit.evaluate.show import results_table

    return results_table(
        f"eval suite {summary['suite']}: greedy accuracy [95% interval], paired differences",
        [{"set": row["set"], "n": str(row["n"]),
          **{name: show_accuracy(a["accuracy"], None, a["interval"]) for name, a in row["accuracy"].items()},
          **{name: show_diff(d) for name, d in row["diff"].items()}} for row in summary["rows"]],
        caption="difference: on the same problems, its 95% paired-bootstrap interval and p (exact McNemar for "
                "right/wrong answers); * = significant at 5%")


def print_compare(summary: dict[str, Any], out: Path | None) -> None:
    """The table; with ``out``, the comparison as JSON there and the table as Markdown beside it (``.md``)."""
    from rich.console import Console

    from rlkit import safety

    if out is not None and out.suffix != ".json":
        raise UserError(f"--out {out}: give a .json file (the table goes beside it as .md)")
    console = Console()
    table = compare_table(summary)
    console.print(table)
    for m in summary["models"]:
        console.print(f"[dim]{m['name']}: {m['role']} row of {m['summary']} ({m['model']})[/]")
    if out is None:
        return
    markdown = out.with_suffix(".md")
    safety.check_replaceable_file(out, "--out", ("suite", "models"))
    if markdown.exists() and not (out.is_file() and out.stat().st_size):  # beside a comparison rlkit wrote, or not
        raise UserError(f"--out {out}: {markdown} is already there and rlkit did not write it; choose another --out")
    safety.make_parent(out, "compare")
    safety.write_text(out, safety.dumps(summary, indent=2))
    safety.write_text(markdown, table.markdown())
    console.print(f"comparison: {out}, {markdown.name}")
