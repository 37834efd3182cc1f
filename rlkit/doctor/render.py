"""The doctor's report: a rich table on a terminal, Markdown and JSON files with ``--out DIR``."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from rlkit.doctor import Report

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
_MARK = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def render(report: Report, console: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"rlkit doctor {report.recipe}", show_lines=False, expand=False)
    for col in ("check", "verdict", "evidence", "fix"):
        table.add_column(col, overflow="fold")
    for c in report.checks:
        table.add_row(escape(f"{c.family}/{c.name}"), f"[{_STYLE[c.verdict]}]{_MARK[c.verdict]}[/]",
                      escape(c.evidence), escape(c.fix))
    console.print(table)
    for title, rows in report.tables.items():
        if not rows:
            continue
        sub = Table(title=title)
        for col in rows[0]:
            sub.add_column(str(col), overflow="fold")
        for row in rows[:20]:
            sub.add_row(*(escape(_cell(v)) for v in row.values()))
        console.print(sub)
    style = "bold green" if report.go else "bold red"
    console.print(f"[{style}]{escape(report.summary())}[/]", highlight=False)


def markdown(report: Report) -> str:
    lines = [f"# rlkit doctor: `{report.recipe}`", "", f"**{report.summary()}**", "",
             "| check | verdict | evidence | fix |", "|---|---|---|---|"]
    for c in report.checks:
        lines.append(f"| {c.family}/{c.name} | {_MARK[c.verdict]} | {_md(c.evidence)} | {_md(c.fix)} |")
    for title, rows in report.tables.items():
        if not rows:
            continue
        lines += ["", f"## {title}", "", "| " + " | ".join(map(str, rows[0])) + " |",
                  "|" + "---|" * len(rows[0])]
        lines += ["| " + " | ".join(_cell(v) for v in row.values()) + " |" for row in rows]
    timing = ", ".join(f"{k} {v:.2f}s" for k, v in report.seconds.items())
    lines += ["", f"Time per family: {timing}.", ""]
    return "\n".join(lines)


def write(report: Report, out: Path) -> tuple[Path, Path]:
    """``out/doctor.md`` and ``out/doctor.json``, each written whole or not at all."""
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "doctor.md", out / "doctor.json"
    for path, text in ((md, markdown(report)), (js, json.dumps(_finite(report.to_dict()), indent=2) + "\n")):
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(text)
        os.replace(partial, path)
    return md, js


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:g}"
    return str(v)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _finite(value: Any) -> Any:
    """JSON has no NaN: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
