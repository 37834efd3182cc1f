"""``rlkit eval``'s results as terminal tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlkit import runs
from rlkit.evaluate.sampled import print_sampled
from rlkit.stats import show_accuracy, show_degenerate


def print_eval(results: dict[str, Any]) -> None:
    """Accuracy of a task eval (or a reward model), or an agent eval's table per question type."""
    from rich.console import Console
    from rich.table import Table

    if "by_question_type" in results:  # an agent recipe: EM/F1/accuracy per question type
        print_agent_eval(results)
        return
    table = Table(title=f"eval: {results['recipe']} ({results['task']})")
    for col in ("model", "examples", "accuracy [95% interval]", "degenerate", "seconds"):
        table.add_column(col, justify="left" if col == "model" else "right")
    table.add_row(results["model"], str(results["n"]), show_accuracy(results["accuracy"], results["n"],
                                                                     results.get("interval")),
                  show_degenerate(results), f"{results['seconds']:.1f}")
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


IFEVAL_COLUMNS = (("prompt_strict", "prompt strict"), ("inst_strict", "inst strict"),
                  ("prompt_loose", "prompt loose"), ("inst_loose", "inst loose"))


def ifeval_table(summary: dict[str, Any], title: str | None = None) -> Any:
    """A row per model (accuracy [95% interval] of the four IFEval numbers), then per trained model its paired
    prompt-level differences from the base and whether the drop passed the tolerance."""
    from rich.table import Table

    from rlkit.stats import show_diff

    table = Table(title=title or f"IFEval ({summary['rows'][0]['n']} prompts, up to {summary['max_new_tokens']} new "
                                 "tokens, greedy): accuracy [95% interval]",
                  caption=f"prompt = every instruction of a prompt followed (Wilson); inst = instructions followed "
                          f"(bootstrap over prompts). Difference: paired, exact McNemar; flagged when prompt strict "
                          f"falls more than {summary['tolerance']:.3f} below the base")
    table.add_column("model")
    for _, name in IFEVAL_COLUMNS:
        table.add_column(name, justify="right")
    table.add_column("seconds", justify="right")
    table.add_column("tolerance check")
    for row in summary["rows"]:
        m = row["metrics"]
        table.add_row(f"{row['role']}: {row['model']}",
                      *(show_accuracy(m[key]["accuracy"], None, m[key]["interval"]) for key, _ in IFEVAL_COLUMNS),
                      f"{row['seconds']:.0f}", "")
    for c in summary["comparisons"]:
        verdict = (f"[red]FLAGGED: -{c['drop']:.3f}[/]" if c["flagged"] else "within tolerance")
        table.add_row(f"{c['role']} - {c['against']}", show_diff(c["prompt_strict"]), "",
                      show_diff(c["prompt_loose"]), "", "", verdict)
    return table


def print_ifeval(summary: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # a log file or a pipe: every column whole
        console = Console(width=200)
    console.print(ifeval_table(summary))
    for c in summary["comparisons"]:
        if c["flagged"]:
            console.print(f"[red]IFEval: {c['role']} prompt-strict accuracy is {c['drop']:.3f} below {c['against']}'s, "
                          f"more than the tolerance {c['tolerance']:.3f} (eval.ifeval.tolerance)[/]")
    folder = Path(summary["path"]).parent
    console.print(f"per-prompt replies and verdicts: {folder}/ (table: {summary['path']})")
    if folder.parts[-2:] == ("eval", "ifeval") and runs.is_run_dir(folder.parent.parent):
        console.print(f"`rlkit report {folder.parent.parent}` adds it to the run's report.md")
