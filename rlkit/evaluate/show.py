"""``rlkit eval``'s results as terminal tables, and :func:`results_table`, the layout every results table of the
demos and of ``rlkit eval --suite`` / ``--ifeval`` goes through: whole at any width, and as Markdown."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlkit import runs
from rlkit.evaluate.sampled import print_sampled
from rlkit.stats import show_accuracy, show_cut, show_degenerate


def print_eval(results: dict[str, Any]) -> None:
    """Accuracy of a task eval (or a reward model), or an agent eval's table per question type."""
    from rich.console import Console
    from rich.table import Table

    if "by_question_type" in results:  # an agent recipe: EM/F1/accuracy per question type
        print_agent_eval(results)
        return
    table = Table(title=f"eval: {results['recipe']} ({results['task']})")
    for col in ("model", "examples", "accuracy [95% interval]", "degenerate", "cut by token limit", "seconds"):
        table.add_column(col, justify="left" if col == "model" else "right")
    table.add_row(results["model"], str(results["n"]), show_accuracy(results["accuracy"], results["n"],
                                                                     results.get("interval")),
                  show_degenerate(results), show_cut(results), f"{results['seconds']:.1f}")
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
    from rlkit.stats import show_diff

    rows: list[dict[str, Any]] = [
        {"model": f"{row['role']}: {row['model']}",
         **{name: show_accuracy(row["metrics"][key]["accuracy"], None, row["metrics"][key]["interval"])
            for key, name in IFEVAL_COLUMNS},
         "seconds": f"{row['seconds']:.0f}"} for row in summary["rows"]]
    rows += [{"model": f"{c['role']} - {c['against']}", "prompt strict": show_diff(c["prompt_strict"]),
              "prompt loose": show_diff(c["prompt_loose"]),
              "tolerance check": f"[red]FLAGGED: -{c['drop']:.3f}[/]" if c["flagged"] else "within tolerance"}
             for c in summary["comparisons"]]
    return results_table(
        title or f"IFEval ({summary['rows'][0]['n']} prompts, up to {summary['max_new_tokens']} new tokens, greedy): "
                 "accuracy [95% interval]", rows,
        caption=f"prompt = every instruction of a prompt followed (Wilson); inst = instructions followed (bootstrap "
                f"over prompts). Difference: paired, exact McNemar; flagged when prompt strict falls more than "
                f"{summary['tolerance']:.3f} below the model it is compared with")


def print_ifeval(summary: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console()
    console.print(ifeval_table(summary))
    for c in summary["comparisons"]:
        if c["flagged"]:
            console.print(f"[red]IFEval: {c['role']} prompt-strict accuracy is {c['drop']:.3f} below {c['against']}'s, "
                          f"more than the tolerance {c['tolerance']:.3f} (eval.ifeval.tolerance)[/]")
    folder = Path(summary["path"]).parent
    console.print(f"per-prompt replies and verdicts: {folder}/ (table: {summary['path']})")
    if folder.parts[-2:] == ("eval", "ifeval") and runs.is_run_dir(folder.parent.parent):
        console.print(f"`rlkit report {folder.parent.parent}` adds it to the run's report.md")


def results_table(title: str, rows: Sequence[Mapping[str, Any]], *, caption: str | None = None) -> ResultsTable:
    """A table of results that reads whole on any screen: ``rows`` map column names to cells (text, rich markup
    allowed; None or "" for none), the first column names each row; columns come in the order rows first name
    them, so a stage or a comparison is a column by its name alone ("base", "SFT", "GRPO - SFT").

    Printed, it is one table where every cell fits the console's width whole, else (80 columns: a log, a pipe, a
    narrow terminal, where rich would cut cells into ``[0.34…``) one block per row: its name on a line, then a line
    per cell, ``column  value``. ``.markdown()`` is the full table as Markdown (a demo's ``table.md``)."""
    return ResultsTable(title, rows, caption)


class ResultsTable:
    """What :func:`results_table` returns: a rich renderable with ``.markdown()``."""

    def __init__(self, title: str, rows: Sequence[Mapping[str, Any]], caption: str | None = None) -> None:
        self.title, self.caption, self.rows = title, caption, [dict(r) for r in rows]
        self.columns = list(dict.fromkeys(key for row in self.rows for key in row))

    def cells(self, row: Mapping[str, Any]) -> list[str]:
        return ["" if row.get(c) is None else str(row[c]) for c in self.columns]

    def wide(self) -> tuple[Any, int]:
        """The one-table layout, and the width it needs to show every cell whole (its headers may wrap)."""
        from rich.table import Table
        from rich.text import Text

        table = Table(title=self.title, caption=self.caption)
        rows = [[Text.from_markup(cell) for cell in self.cells(row)] for row in self.rows]
        needed = 1 + 3 * len(self.columns)  # the borders, and a space either side of each cell
        for i, column in enumerate(self.columns):
            body = max((row[i].cell_len for row in rows), default=0)
            needed += max([body, *(len(word) for word in column.split())])
            table.add_column(column, justify="left" if i == 0 else "right", min_width=body)
        for row in rows:
            table.add_row(*row)
        return table, needed

    def __rich_console__(self, console: Any, options: Any) -> Iterable[Any]:
        from rich.text import Text

        wide, needed = self.wide()
        if needed <= options.max_width:
            yield wide
            return
        yield Text(self.title, style="italic")
        for row in self.rows:
            label, *cells = self.cells(row)
            yield Text.from_markup("\n" + label, style="bold")
            shown = [(name, Text.from_markup(cell)) for name, cell in zip(self.columns[1:], cells, strict=True) if cell]
            # A cell never breaks across lines: beside its column's name where both fit, else below it.
            pad = max((len(name) for name, _ in shown), default=0)
            beside = 4 + pad + max((cell.cell_len for _, cell in shown), default=0) <= options.max_width
            for name, cell in shown:
                yield (Text.assemble(f"  {name:<{pad}}  ", cell) if beside else
                       Text.assemble(f"  {name}\n    ", cell))
        if self.caption:
            yield Text("\n" + self.caption, style="dim")

    def markdown(self) -> str:
        from rich.text import Text

        def md(cell: str) -> str:
            return Text.from_markup(cell).plain.replace("|", "\\|")

        lines = [f"**{md(self.title)}**", "", "| " + " | ".join(md(c) for c in self.columns) + " |",
                 "|" + "|".join(["---"] + ["---:"] * (len(self.columns) - 1)) + "|"]
        lines += ["| " + " | ".join(md(c) for c in self.cells(row)) + " |" for row in self.rows]
        return "\n".join(lines + (["", md(self.caption)] if self.caption else [])) + "\n"


def write_markdown(path: Path, tables: Iterable[Any]) -> None:
    """Every :class:`ResultsTable` of ``tables`` as Markdown in one file (others, plain rich tables, are left out)."""
    from rlkit import safety

    safety.write_text(path, "\n".join(t.markdown() for t in tables if isinstance(t, ResultsTable)))
