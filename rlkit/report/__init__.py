"""``rlkit report``: PNG charts and a Markdown report for a run directory.

    RUN/plots/*.png   one chart per group of metrics the run logged (reward, loss, KL, lengths, ...; the prompt pool)
    RUN/report.md     what the run was, a first/last/min/max table of its key metrics, the prompt pool and the share
                      of zero-variance groups before/after dynamic sampling (GRPO), its evals (with IFEval's
                      base -> trained check from RUN/eval/ifeval/ifeval.json, flagged past its tolerance), the
                      `rlkit analyze` numbers of every agent eval's episodes in the order they ran (base before
                      trained: EM, F1, evidence recall, tool calls, rounds, F1 per question type), the charts

Charts are drawn only for metrics present in ``metrics.jsonl``; the x axis is TRL's ``global_step``. A value
that is missing, null or NaN is skipped, not drawn as zero. Every file is written under a temporary name and
moved into place, so a reader (a browser, VS Code's preview) never sees half a PNG, even mid-training.
The report reads named fields of the resolved recipe only, never the environment, and masks any known secret value
(``rlkit.secrets``) that still slipped into its text. Links are relative to RUN: it renders on GitHub and VS Code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rlkit import runs, secrets
from rlkit.errors import UserError
from rlkit.report import sampling
from rlkit.report.charts import CHARTS, atomic_write, finite_number, fmt, series
from rlkit.stats import show_accuracy, show_degenerate, show_diff

PLOTS = "plots"
REPORT = "report.md"
AGENT_EVAL = "agent_eval.jsonl"  # rlkit.evaluate.during's scores, step 0 (before any update) included
_TRAINER_KEYS = ("learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                 "beta", "max_completion_length", "num_train_epochs")


def wanted() -> bool:
    """Whether `rlkit train` ends with the report: yes unless ``RLKIT_NO_REPORT=1`` (the test suite sets it except
    where a test checks the report); ``rlkit report RUN`` draws it later from the run directory alone."""
    return os.environ.get("RLKIT_NO_REPORT") != "1"


def write_report(run_dir: str | Path) -> dict[str, Any]:
    """Draw the charts into ``RUN/plots/``, write ``RUN/report.md``; return what was written and the table rows."""
    run_dir = Path(run_dir)
    if not runs.is_run_dir(run_dir):
        raise UserError(f"{run_dir}: not a run directory (no {runs.RESOLVED}); pass the --output-dir of an "
                        "`rlkit train` run")
    recipe = runs.read_resolved(run_dir) or {}
    rows = _with_agent_evals(_read_metrics(run_dir / runs.METRICS), run_dir / AGENT_EVAL)
    if not any(_numbers(row) for row in rows):
        raise UserError(f"{run_dir}: no metrics yet ({runs.METRICS} is missing or empty); wait for the first "
                        "logging step or lower trainer.logging_steps")
    name = str(recipe.get("name") or run_dir.name)
    label = name if run_dir.name == name else f"{name} ({run_dir.name})"
    algorithm = str(recipe.get("algorithm", "?"))
    evals = _read_evals(run_dir / "eval")
    episodes = _agent_episodes(run_dir / "eval", evals)

    plots_dir = run_dir / PLOTS
    plots_dir.mkdir(exist_ok=True)
    charts: list[dict[str, Any]] = []
    keys: list[str] = []
    for chart in CHARTS:
        drawn = chart.draw(label, algorithm, rows, evals, plots_dir / chart.file)
        if drawn is None:
            (plots_dir / chart.file).unlink(missing_ok=True)  # a chart of ours from an older report no longer applies
            continue
        charts.append({"file": chart.file, "title": chart.title, "caption": chart.caption,
                       "path": plots_dir / chart.file})
        keys += [key for key in drawn if key not in keys]
    pool = sampling.read_pool(run_dir)
    if (chart := sampling.pool_chart(label, pool, plots_dir)) is not None:
        charts.append(chart)
    table = [_row(key, rows) for key in keys]
    best = json.loads((run_dir / "best.json").read_text()) if (run_dir / "best.json").exists() else None
    summary = {"run": str(run_dir), "name": name, "algorithm": algorithm, "rows": table, "evals": evals,
               "episodes": episodes, "best": best, "pool": pool,
               "sampling_lines": (sampling.pool_lines(pool) if pool else []) + sampling.zero_variance_lines(rows),
               "ifeval": _read_ifeval(run_dir / "eval" / "ifeval" / "ifeval.json"),
               "plots": [c["path"] for c in charts], "report": run_dir / REPORT, "judges": _judge_totals(rows),
               **_progress(recipe, rows, run_dir)}
    text = secrets.redact(_markdown(summary, charts))  # a token that found its way into a model path, say
    atomic_write(run_dir / REPORT, lambda path: path.write_text(text, encoding="utf-8"))
    return summary


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    """The logged rows; a half-written last line is being appended by a running trainer and is skipped."""
    from rlkit.jsonl import read_records

    return read_records(path, torn_tail="drop", missing_ok=True)


def _with_agent_evals(rows: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    """The metric rows with every agent eval of ``agent_eval.jsonl`` in them: its F1, EM and F1 interval on the row
    of its step that logged it, else on a row of its own (the trainer logs nothing at step 0, before any update,
    and the chart must start where training started). In step order."""
    from rlkit.jsonl import read_records

    for entry in read_records(path, torn_tail="drop", missing_ok=True):
        low, high = entry.get("f1_interval") or (None, None)
        scores = {"agent_eval/f1": entry.get("f1"), "agent_eval/em": entry.get("em"),
                  "agent_eval/f1_low": low, "agent_eval/f1_high": high}
        logged = next((r for r in rows if r.get("step") == entry.get("step") and "agent_eval/f1" in r), None)
        if logged is None:
            rows.append({"step": entry.get("step"), **scores})
        else:
            logged.update(scores)
    return sorted(rows, key=lambda row: finite_number(row.get("step")) or 0)


def _read_evals(eval_dir: Path) -> list[dict[str, Any]]:
    """The results files ``rlkit eval`` wrote into ``RUN/eval/``, without their examples."""
    out = []
    for path in sorted(eval_dir.glob("*.json")) if eval_dir.is_dir() else []:
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: not valid JSON ({e.msg}); rerun `rlkit eval` or remove the file") from None
        if isinstance(result, dict) and finite_number(result.get("accuracy")) is not None:
            out.append({"file": path.name, "model": str(result.get("model", path.stem)), "n": result.get("n"),
                        "metric": str(result.get("metric", "accuracy")), "accuracy": result["accuracy"],
                        "interval": result.get("interval"), "seconds": result.get("seconds"),
                        "degenerate": result.get("degenerate"), "degenerate_kinds": result.get("degenerate_kinds"),
                        "by_question_type": result.get("by_question_type") or {},
                        "trajectories": result.get("trajectories")})
    return out


def _agent_episodes(eval_dir: Path, evals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rlkit analyze`` of each agent eval's episodes, one summary row each, in the order they were played (their
    files' times, which the demos keep when they copy them). The episodes are the trajectories file the results
    name, next to them or else where recorded; an eval without one has no row, and one whose file cannot be read
    or does not hold the results' n episodes (an eval replaced or cut short since) has a row saying so."""
    from rlkit.analyze import EVIDENCE, analyze

    found = []
    for e in evals:
        recorded = e.get("trajectories")
        candidates = [eval_dir / Path(recorded).name, Path(recorded)] if isinstance(recorded, str) else []
        path = next((c for c in candidates if c.is_file()), None)
        if path is not None:
            found.append((path.stat().st_mtime, e, path))
    rows = []
    for _, e, path in sorted(found, key=lambda item: item[0]):
        row: dict[str, Any] = {"file": e["file"], "model": e["model"], "trajectories": str(path)}
        try:
            report = analyze(path)
        except UserError as error:
            rows.append(row | {"problem": f"cannot be analysed: {error}"})
            continue
        if report["episodes"] != e["n"]:
            rows.append(row | {"problem": f"{report['episodes']} episodes where the results count {e['n']}"})
            continue
        answers, shape = report["answers"], report["outcomes"]["all"]
        rows.append(row | {"n": report["episodes"], **{key: answers["all"][key] for key in ("em", "f1")},
                           "intervals": answers["all"]["intervals"], EVIDENCE: answers["all"].get(EVIDENCE),
                           "tool_calls": shape["tool_calls"]["mean"], "rounds": shape["rounds"]["histogram"],
                           "f1_by_type": {kind: row["f1"] for kind, row in answers.items() if kind != "all"}})
    return rows


def _read_ifeval(path: Path) -> dict[str, Any] | None:
    """The summary ``rlkit eval RUN --ifeval`` (or a demo) wrote, if any."""
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e.msg}); rerun `rlkit eval RUN --ifeval FILE`") from None
    return summary if isinstance(summary, dict) and summary.get("benchmark") == "ifeval" else None


def _ifeval_lines(summary: dict[str, Any]) -> list[str]:
    """Report lines: a row per model, then each paired difference and whether the drop passed the tolerance."""
    names = (("prompt_strict", "prompt strict"), ("inst_strict", "inst strict"), ("prompt_loose", "prompt loose"),
             ("inst_loose", "inst loose"))
    rows = summary["rows"]
    lines = ["", "## General ability: IFEval", "",
             f"{rows[0]['n']} prompts of `{summary['prompts']}`, greedy, up to {summary['max_new_tokens']} new tokens; "
             "accuracy [95% interval]. Tolerance: prompt strict may fall "
             f"{summary['tolerance']:.3f} below the base.", "",
             "| model | " + " | ".join(n for _, n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for row in rows:
        cells = [show_accuracy(row["metrics"][k]["accuracy"], None, row["metrics"][k]["interval"]) for k, _ in names]
        lines.append(f"| {row['role']}: `{row['model']}` | " + " | ".join(cells) + " |")
    for c in summary.get("comparisons") or []:
        lines.append(f"| {c['role']} - {c['against']} | {show_diff(c['prompt_strict'])} | | "
                     f"{show_diff(c['prompt_loose'])} | |")
    for c in summary.get("comparisons") or []:
        lines += ["", f"**⚠ IFEval regression: {c['role']}'s prompt-strict accuracy is {c['drop']:.3f} below "
                      f"{c['against']}'s, more than the tolerance {c['tolerance']:.3f}.**" if c["flagged"] else
                  f"IFEval: {c['role']} is within tolerance (prompt strict {c['prompt_strict']['diff']:+.3f} against "
                  f"{c['against']}, tolerance {c['tolerance']:.3f})."]
    return lines


def _episode_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Report lines: one row per agent eval, as ``rlkit analyze`` scores its episodes."""
    from rlkit.analyze import EVIDENCE

    lines = ["", "## Agent episodes", "",
             "`rlkit analyze` of each agent eval's trajectories, in the order they were played (95% interval: Wilson "
             "for 0/1 scores, bootstrap for graded ones).", "",
             "| eval | model | n | EM | F1 | evidence recall | tool calls per episode | rounds (rounds:episodes) "
             "| F1 per question type |", "|---" * 9 + "|"]
    for r in rows:
        if "problem" in r:
            problem = f"`{r['trajectories']}`: {r['problem']}".replace("|", "\\|").replace("\n", " ")
            lines.append(f"| `eval/{r['file']}` | `{r['model']}` | - | {problem} |" + " |" * 5)
            continue
        cells = [show_accuracy(r[key], None, r["intervals"].get(key)) for key in ("em", "f1")]
        recall = "-" if r[EVIDENCE] is None else f"{r[EVIDENCE]:.3f}"
        rounds = " ".join(f"{k}:{v}" for k, v in r["rounds"].items())
        kinds = ", ".join(f"{k} {v:.3f}" for k, v in r["f1_by_type"].items() if v is not None)
        lines.append(f"| `eval/{r['file']}` | `{r['model']}` | {r['n']} | {' | '.join(cells)} | {recall} "
                     f"| {r['tool_calls']:.2f} | {rounds} | {kinds or '-'} |")
    return lines


def _numbers(row: dict[str, Any]) -> list[str]:
    return [key for key, value in row.items() if key not in ("step", "epoch") and finite_number(value) is not None]


JUDGE_COUNTS = ("requests", "cache_hits", "retries", "failures", "skipped")


def _judge_totals(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each judge reward's requests, failures and failed tries by kind (``judge/errors/timeout``, ...) over the run.
    TRL logs a reward's metric as its mean over the logging interval, so a row counts once per step since the one
    before: exact when each step scores one generation batch (TRL's default)."""
    totals: dict[str, dict[str, float]] = {}
    for name in sorted({key.split("/")[0] for row in rows for key in row if key.count("/") == 2 and "/errors/" in key}):
        previous, total = 0.0, dict.fromkeys(JUDGE_COUNTS, 0.0)
        for row in (r for r in rows if None not in (finite_number(r.get("step")), r.get(f"{name}/requests"))):
            for field in [k.removeprefix(f"{name}/") for k in row if k.startswith(f"{name}/")]:
                if field in JUDGE_COUNTS or field.startswith("errors/"):
                    count = finite_number(row[f"{name}/{field}"]) or 0.0
                    total[field] = total.get(field, 0.0) + count * (row["step"] - previous)
            previous = row["step"]
        totals[name] = total
    return totals


def _judge_lines(totals: dict[str, dict[str, float]]) -> list[str]:
    columns = [*JUDGE_COUNTS, *sorted({k for t in totals.values() for k in t if k.startswith("errors/")})]
    header = " | ".join(c.replace("errors/", "failed tries: ") for c in columns)
    return ["", "## Judge requests", "", "Summed over the run. A failed try is retried (`max_retries`); a request "
            "fails once every try has, and under `on_failure: skip` its completions are `skipped`: unscored (None), "
            "never a judge's 0.", "", f"| reward | {header} |", "|---" * (1 + len(columns)) + "|",
            *(f"| `{name}` | " + " | ".join(fmt(t.get(c, 0.0)) for c in columns) + " |" for name, t in totals.items())]


def _row(key: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    _, values = series(rows, key)
    return {"metric": key, "first": values[0], "last": values[-1], "min": min(values), "max": max(values),
            "steps": len(values)}


def _progress(recipe: dict[str, Any], rows: list[dict[str, Any]], run_dir: Path) -> dict[str, Any]:
    trainer = recipe.get("trainer") or {}
    provenance = recipe.get("provenance") or {}
    final = next((row for row in reversed(rows) if "train_runtime" in row), {})
    steps = [s for s in (finite_number(row.get("step")) for row in rows) if s is not None]
    return {"model": (recipe.get("model") or {}).get("name_or_path"),
            "backend": provenance.get("backend") or (recipe.get("model") or {}).get("backend"),
            "smoke": bool(provenance.get("smoke")), "steps": int(max(steps, default=0)),
            "max_steps": trainer.get("max_steps"), "runtime": finite_number(final.get("train_runtime")),
            "finished": bool(final), "adapter": (run_dir / "adapter").is_dir(),
            "trainer": {key: trainer[key] for key in _TRAINER_KEYS if key in trainer}}


# ---------------------------------------------------------------------------------------------
# Markdown and the terminal table


def _markdown(summary: dict[str, Any], charts: list[dict[str, Any]]) -> str:
    s = summary
    max_steps = s["max_steps"] if s["max_steps"] not in (None, -1) else "?"
    runtime = (f"finished in {s['runtime']:.1f} s" if s["runtime"] is not None
               else "no final row yet (still training, or stopped early)")
    kind = "a **smoke** run (shrunk recipe; numbers are not meaningful)" if s["smoke"] else "a full run"
    lines = [
        f"# Run report: {s['name']}", "",
        f"`{s['run']}` is {kind}: **{s['algorithm'].upper()}** on `{s['model']}` with the `{s['backend']}` backend, "
        f"{s['steps']} / {max_steps} steps, {runtime}. Adapter: {'`adapter/`' if s['adapter'] else 'not saved yet'}.",
    ]
    if s["trainer"]:
        lines += ["", "Trainer: " + ", ".join(f"`{k}={v}`" for k, v in s["trainer"].items()) + "."]
    lines += ["", "## Metrics", "", "| metric | first | last | min | max | steps logged |", "|---|---|---|---|---|---|"]
    lines += [f"| `{r['metric']}` | {fmt(r['first'])} | {fmt(r['last'])} | {fmt(r['min'])} | {fmt(r['max'])} "
              f"| {r['steps']} |" for r in s["rows"]]
    lines += s.get("sampling_lines") or []
    if s["evals"]:
        lines += ["", "## Evaluations", "", "Degenerate: the share of replies with no answer, a character run "
                  "(`########`) or a loop cut by the token limit.", "",
                  "| model | n | accuracy [95% interval] | degenerate | seconds | file |", "|---|---|---|---|---|---|"]
        for e in s["evals"]:
            lines.append(f"| `{e['model']}` | {fmt(e['n'])} | {_accuracy(e)} | {show_degenerate(e)} "
                         f"| {fmt(e['seconds'])} | `eval/{e['file']}` |")
            lines += [f"| ↳ {kind} | {fmt(row.get('n'))} | {_accuracy(row)} | | | |"
                      for kind, row in e["by_question_type"].items() if isinstance(row, dict)]
    if s.get("episodes"):
        lines += _episode_lines(s["episodes"])
    if s.get("ifeval"):
        lines += _ifeval_lines(s["ifeval"])
    if s.get("judges"):
        lines += _judge_lines(s["judges"])
    if s.get("best"):
        b = s["best"]
        lines += ["", "## Best checkpoint (agent eval during training)", "",
                  f"Step **{b['step']}**, kept in `best/`: {b['why']}. Every eval: `agent_eval.jsonl`."]
    lines += ["", "## Charts"]
    for c in charts:
        lines += ["", f"### {c['title']}", "", c["caption"], "", f"![{c['title']}]({PLOTS}/{c['file']})"]
    return "\n".join(lines) + "\n"


def render(summary: dict[str, Any], console: Any) -> None:
    """Print the metrics table (and the evals) of a ``write_report`` summary."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"{summary['name']} ({summary['algorithm']}, {summary['steps']} steps)", title_justify="left")
    for i, column in enumerate(("metric", "first", "last", "min", "max", "steps logged")):
        table.add_column(column, justify="left" if i == 0 else "right")
    for r in summary["rows"]:
        table.add_row(escape(r["metric"]), *(fmt(r[k]) for k in ("first", "last", "min", "max", "steps")))
    console.print(table)
    if summary["evals"]:
        evals = Table(title="evaluations", title_justify="left")
        for i, column in enumerate(("model", "n", "accuracy [95% interval]", "degenerate")):
            evals.add_column(column, justify="left" if i == 0 else "right")
        for e in summary["evals"]:
            evals.add_row(escape(e["model"]), fmt(e["n"]), _accuracy(e), show_degenerate(e))
        console.print(evals)
    for c in (summary.get("ifeval") or {}).get("comparisons") or []:
        if c["flagged"]:
            console.print(f"[red]IFEval regression: {c['role']}'s prompt-strict accuracy is {c['drop']:.3f} below "
                          f"{c['against']}'s (tolerance {c['tolerance']:.3f})[/]")


def _accuracy(row: dict[str, Any]) -> str:
    """The accuracy with its 95% interval: the one the eval recorded, else Wilson's from n (older results files)."""
    accuracy = finite_number(row.get("accuracy"))
    bounds = row.get("interval") or (row.get("intervals") or {}).get("accuracy")
    valid = isinstance(bounds, list) and len(bounds) == 2 and all(finite_number(b) is not None for b in bounds)
    return show_accuracy(accuracy, row.get("n"), bounds if valid else None)
