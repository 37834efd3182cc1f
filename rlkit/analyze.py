"""``rlkit analyze``: a report on the episodes in a ``trajectories.jsonl`` written by the rollout engine.

Sections: answer quality (EM / F1 / accuracy, evidence recall when the questions name their supporting
ids, reward, success rate) per ``question_type``; rounds
and tool calls per episode; token usage in the last turn and summed over the episode; each of these
for all episodes and split by the ``success`` flag; per-tool calls and failures; episode errors by
message prefix (the text before the first colon: "timeout", "endpoint error"); turn finish reasons;
thinking per assistant turn (every assistant message in ``messages``): the share of turns with a
well-formed think block and the think length in tokens, both as ``rlkit.rewards.think`` defines them
(``think_spans``, ``approx_tokens``; a turn without thinking is 0 tokens, a malformed one counts every
block it holds, an unclosed one to its end), for all episodes and split by ``success``.
A record without ``success: true`` counts as a failure; means of EM / F1 / accuracy / reward are
over the episodes that have them; p90 interpolates linearly between order statistics (numpy's default).

``analyze`` returns plain numbers (JSON-serialisable), ``render`` prints rich tables, ``to_markdown``
writes the same tables for a README or a PR.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np

from rlkit.errors import UserError
from rlkit.rewards.think import approx_tokens, think_spans
from rlkit.stats import interval, show

TRAJECTORIES = "trajectories.jsonl"
QUALITY = ("em", "f1", "accuracy")
# Share of a question's supporting ids its searches retrieved (rollouts of tasks with supporting ids).
EVIDENCE = "evidence_recall"
TOKENS = ("prompt", "completion", "total")
SPLITS = ("all", "success", "failure")

# Top-level keys read, with the JSON type each must have when present and not null.
_SHAPES = {"question_type": str, "messages": list, "tool_calls": list, "turns": list, "usage": dict,
           "rounds": int, "reward": (int, float), "metrics": dict, "success": bool, "error": str}


def analyze(path: str | Path) -> dict[str, Any]:
    """The report for a trajectories file (or a run directory holding ``trajectories.jsonl``)."""
    path = Path(path)
    episodes = _read(path / TRAJECTORIES if path.is_dir() else path)
    types = sorted({e["question_type"] for e in episodes if e["question_type"] is not None})
    by_outcome = {
        "all": episodes,
        "success": [e for e in episodes if e["success"]],
        "failure": [e for e in episodes if not e["success"]],
    }
    tools: dict[str, list[dict]] = collections.defaultdict(list)
    for episode in episodes:
        for call in episode["tool_calls"]:
            tools[call["name"]].append(call)
    return {
        "path": str(path),
        "episodes": len(episodes),
        "answers": {name: _quality([e for e in episodes if e["question_type"] == name]) for name in types}
        | {"all": _quality(episodes)},
        "outcomes": {split: _quality(group) | _shape(group) for split, group in by_outcome.items()},
        "thinking": {split: _thinking(group) for split, group in by_outcome.items()},
        "tools": {name: _tool_stats(calls) for name, calls in sorted(tools.items())},
        "errors": _counts(e["error"].partition(":")[0].strip() for e in episodes if e["error"] is not None),
        "finish_reasons": _counts(reason for e in episodes for reason in e["finish_reasons"]),
    }


def _read(path: Path) -> list[dict]:
    from rlkit.jsonl import numbered_records

    episodes = [_episode(record, f"{path}: line {number}") for number, record in numbered_records(path)]
    if not episodes:
        raise UserError(f"{path}: no episodes (the file is empty)")
    return episodes


def _episode(record: dict, where: str) -> dict:
    """The facts ``analyze`` uses from one record, checked; ``where`` names the file and line for errors."""
    for key, kind in _SHAPES.items():
        value = record.get(key)
        if value is not None and not isinstance(value, kind):
            raise UserError(f"{where}: `{key}` is a {type(value).__name__}, expected {_type_name(kind)}")
    for key in ("messages", "tool_calls", "turns"):
        if not all(isinstance(item, dict) for item in record.get(key) or []):
            raise UserError(f"{where}: every item of `{key}` must be a JSON object")
    turns, usage, metrics = record.get("turns") or [], record.get("usage"), record.get("metrics") or {}
    if usage is None and turns:  # a record without `usage`: it is the sum over turns
        usage = {f"{kind}_tokens": sum(_number(t, f"{kind}_tokens", where) or 0 for t in turns) for kind in TOKENS}
    last, usage = turns[-1] if turns else {}, usage or {}
    thinking = [think_spans(m) for m in record.get("messages") or [] if m.get("role") == "assistant"]
    rounds = record.get("rounds")
    if rounds is None:
        rounds = sum(message.get("role") == "assistant" for message in record.get("messages") or [])
    return {
        "question_type": record.get("question_type"),
        "success": record.get("success") is True,
        "error": record.get("error"),
        "reward": record.get("reward"),
        "metrics": {key: _number(metrics, key, where) for key in (*QUALITY, EVIDENCE)},
        "rounds": rounds,
        "tool_calls": [{"name": str(call.get("name")), "failed": call.get("error") is not None,
                        "seconds": _number(call, "seconds", where)} for call in record.get("tool_calls") or []],
        "finish_reasons": [str(turn.get("finish_reason")) for turn in turns],
        "last_turn": {kind: _number(last, f"{kind}_tokens", where) for kind in TOKENS},
        "cumulative": {kind: _number(usage, f"{kind}_tokens", where) for kind in TOKENS},
        "thinking": [(spans.well_formed, sum(approx_tokens(block.strip()) for block in spans.blocks))
                     for spans in thinking],
    }


def _number(mapping: dict, key: str, where: str) -> float | None:
    value = mapping.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise UserError(f"{where}: `{key}` is {value!r}, expected a number")
    return value


def _type_name(kind: type | tuple) -> str:
    names = {str: "a string", list: "a list", dict: "an object", int: "an integer", bool: "true/false"}
    return names.get(kind, "a number")


def _mean(values: list) -> float | None:
    return float(np.mean(values)) if values else None


def _quality(episodes: list[dict]) -> dict[str, Any]:
    """n, mean EM / F1 / accuracy and reward (over episodes that have them), and the success rate."""
    row: dict[str, Any] = {"n": len(episodes)}
    row["intervals"] = {}
    for key in QUALITY:
        values = [e["metrics"][key] for e in episodes if e["metrics"][key] is not None]
        row[key] = _mean(values)
        if values:  # 95%: Wilson for 0/1 scores (accuracy, EM), bootstrap for graded ones (F1)
            row["intervals"][key] = list(interval(values))
    recall = [e["metrics"][EVIDENCE] for e in episodes if e["metrics"][EVIDENCE] is not None]
    if recall:  # only rollouts whose questions name their supporting ids
        row[EVIDENCE] = _mean(recall)
    row["reward"] = _mean([e["reward"] for e in episodes if e["reward"] is not None])
    row["success_rate"] = _mean([float(e["success"]) for e in episodes])
    return row


def _shape(episodes: list[dict]) -> dict[str, Any]:
    """Rounds, tool calls and tokens per episode."""
    return {
        "rounds": _distribution([e["rounds"] for e in episodes]),
        "tool_calls": _distribution([len(e["tool_calls"]) for e in episodes]),
        "tokens": {
            scope: {kind: _stats([e[scope][kind] for e in episodes if e[scope][kind] is not None]) for kind in TOKENS}
            for scope in ("last_turn", "cumulative")
        },
    }


def _thinking(episodes: list[dict]) -> dict[str, Any]:
    """Assistant turns, the share with a well-formed think block, and think tokens per turn."""
    turns = [turn for e in episodes for turn in e["thinking"]]
    return {"turns": len(turns), "well_formed": _mean([float(good) for good, _ in turns]),
            "think_tokens": _stats([length for _, length in turns])}


def _stats(values: list) -> dict[str, Any]:
    if not values:
        return dict.fromkeys(("mean", "median", "p90", "max"))
    return {"mean": float(np.mean(values)), "median": float(np.median(values)),
            "p90": float(np.percentile(values, 90)), "max": max(values)}


def _distribution(values: list[int]) -> dict[str, Any]:
    return _stats(values) | {"histogram": dict(sorted(collections.Counter(values).items()))}


def _tool_stats(calls: list[dict]) -> dict[str, Any]:
    failures = sum(call["failed"] for call in calls)
    seconds = [call["seconds"] for call in calls if call["seconds"] is not None]
    return {"calls": len(calls), "failures": failures, "failure_rate": failures / len(calls),
            "mean_seconds": _mean(seconds)}


def _counts(values) -> dict[str, int]:
    return dict(collections.Counter(values).most_common())


# ---------------------------------------------------------------------------------------------
# Rendering: one list of (title, header, rows) feeds both the rich tables and the markdown.


def _tables(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    outcomes = report["outcomes"]
    quality = ["em", "f1", "accuracy", "reward", "success_rate"]
    quality_header = ["EM", "F1", "accuracy", "reward", "success rate"]
    if report["answers"]["all"].get(EVIDENCE) is not None:  # only rollouts whose questions name their evidence
        quality.insert(3, EVIDENCE)
        quality_header.insert(3, "evidence recall")
    answers = [[name, *_cells({EVIDENCE: None, **row}, ["n", *quality])] for name, row in report["answers"].items()]
    answers += [[f"{split} episodes", *_cells({EVIDENCE: None, **outcomes[split]}, ["n", *quality])]
                for split in SPLITS[1:]]
    stats = ["mean", "median", "p90", "max"]

    def distribution(key: str) -> list[list[str]]:
        return [[split, str(outcomes[split]["n"]), *_cells(outcomes[split][key], stats),
                 " ".join(f"{value}:{count}" for value, count in outcomes[split][key]["histogram"].items())]
                for split in SPLITS]

    tokens = [[split, scope.replace("_", " "), kind, *_cells(outcomes[split]["tokens"][scope][kind], stats, digits=1)]
              for split in SPLITS for scope in ("last_turn", "cumulative") for kind in TOKENS]
    thinking = [[split, *_cells(report["thinking"][split], ["turns", "well_formed"]),
                 *_cells(report["thinking"][split]["think_tokens"], stats, digits=1)] for split in SPLITS]
    return [
        ("answers", ["question type", "n", *quality_header], answers),
        ("rounds per episode", ["episodes", "n", *stats, "histogram (rounds:episodes)"], distribution("rounds")),
        ("tool calls per episode", ["episodes", "n", *stats, "histogram (calls:episodes)"],
         distribution("tool_calls")),
        ("tokens per episode", ["episodes", "scope", "tokens", *stats], tokens),
        ("thinking (think tokens per assistant turn)", ["episodes", "turns", "well-formed", *stats], thinking),
        ("tools", ["tool", "calls", "failures", "failure rate", "mean seconds"],
         [[name, *_cells(row, ["calls", "failures", "failure_rate", "mean_seconds"])]
          for name, row in report["tools"].items()]),
        ("episode errors", ["error", "episodes"], [[k, str(v)] for k, v in report["errors"].items()]),
        ("finish reasons", ["finish reason", "turns"], [[k, str(v)] for k, v in report["finish_reasons"].items()]),
    ]


def _cells(row: dict[str, Any], keys: list[str], digits: int = 3) -> list[str]:
    """Each number formatted; a mean with a 95% interval in ``row["intervals"]`` shows it: 0.410 [0.319, 0.508]."""
    intervals = row.get("intervals") or {}

    def cell(key: str) -> str:
        value = row[key]
        if value is None:
            return "-"
        if isinstance(value, int):
            return str(value)
        if key in intervals:
            return show({"mean": value, "low": intervals[key][0], "high": intervals[key][1]}, digits)
        return f"{value:.{digits}f}"

    return [cell(key) for key in keys]


def render(report: dict[str, Any], console: Any) -> None:
    """Print the report as rich tables, one per section."""
    from rich.markup import escape
    from rich.table import Table

    console.print(f"[bold]{escape(report['path'])}[/]: {report['episodes']} episodes", highlight=False)
    for title, header, rows in _tables(report):
        table = Table(title=title, title_justify="left")
        for i, column in enumerate(header):
            table.add_column(column, justify="left" if i == 0 else "right")
        for row in rows:
            table.add_row(*map(escape, row))  # tool names and error messages are not markup
        console.print(table)


def to_markdown(report: dict[str, Any]) -> str:
    """The report as GitHub-flavoured markdown: a heading and a table per section."""
    parts = [f"# Trajectories: `{report['path']}` ({report['episodes']} episodes)"]
    for title, header, rows in _tables(report):
        lines = [f"| {' | '.join(header)} |", f"|{'|'.join('---' for _ in header)}|"]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        parts.append(f"## {title}\n\n" + "\n".join(lines))
    return "\n\n".join(parts) + "\n"


def main(path: str, markdown: bool = False, out: str | None = None) -> None:
    """Analyse ``path``; print rich tables, or markdown to stdout (``markdown``) or to the file ``out``."""
    from rich.console import Console

    report = analyze(path)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(to_markdown(report), encoding="utf-8")
        Console(soft_wrap=True).print(f"markdown report written to {out}", highlight=False)
    elif markdown:
        print(to_markdown(report), end="")
    else:
        render(report, Console())
