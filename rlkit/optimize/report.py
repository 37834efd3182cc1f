"""What ``rlkit optimize-prompt`` writes and prints.

``--out FILE.txt`` holds the best prompt, the text ``data.prompt: FILE.txt`` reads; ``FILE.json`` beside it holds
the rest: the overrides that use the prompt, the eval of the recipe's prompt against it on the eval split (with
95% intervals and the paired difference, :mod:`rlkit.stats`), the optimiser's score trajectory, and what it cost.
Both are written at the very end, each atomically; a run that fails writes neither. The API key is never in them:
the JSON names the environment variable it came from.
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import Any

from rlkit import __version__, safety
from rlkit.errors import UserError
from rlkit.stats import paired, show, show_accuracy, show_diff, summary

SUFFIXES = (".txt", ".md")
KEYS = ("recipe", "prompt", "optimizer", "eval")  # an optimize-prompt JSON (what --overwrite may replace)


def json_path(out: Path) -> Path:
    return out.with_suffix(".json")


def check_out(out: str | Path, overwrite: bool) -> Path:
    """``--out`` as a path rlkit may write: a .txt/.md prompt file, new, or (``--overwrite``) one it wrote."""
    out = safety.check_target(out, "--out")
    if out.suffix not in SUFFIXES:
        raise UserError(f"--out {out}: the prompt file's name ends in .txt or .md (its results go beside it, .json)")
    companion = json_path(out)
    existing = [p for p in (out, companion) if p.exists()]
    if not existing:
        return out
    if not overwrite:
        raise UserError(f"--out {out}: {existing[0]} already exists; pass --overwrite to replace it or choose a new "
                        "file")
    if out.is_dir():
        raise UserError(f"--out {out}: is a directory; give a file path")
    safety.check_replaceable_file(companion, "--out", KEYS)
    import json

    recorded = json.loads(companion.read_text(encoding="utf-8")).get("prompt") if companion.exists() else None
    if out.exists() and (recorded is None or out.read_text(encoding="utf-8").strip() != recorded):
        raise UserError(f"--out {out}: is not a prompt file rlkit wrote (its {companion.name} does not record this "
                        "text); rlkit replaces only its own outputs: delete it yourself or choose a new file")
    return out


def _arm(scored: Any) -> dict[str, Any]:
    reward = summary(scored.totals)
    arm = {"n": len(scored.totals), "reward": reward["mean"], "reward_interval": [reward["low"], reward["high"]]}
    if scored.correct is not None:
        accuracy = summary(scored.correct)
        arm.update(accuracy=accuracy["mean"], interval=[accuracy["low"], accuracy["high"]],
                   correct=int(sum(scored.correct)))
    return arm


def summary_json(*, recipe: Any, recipe_path: str, label: str, out: Path, base_prompt: str, best: str,
                 shots: str | None, result: Any, history: Any, base_eval: Any, best_eval: Any, settings: Any,
                 reflection: Any, adapter: Any, budget: int, minibatch: int, seed: int, train: int, val: int,
                 seconds: tuple[float, float], overrides: list[str], smoke: bool) -> dict[str, Any]:
    """Everything the run found, as the JSON written beside the prompt file."""
    import shlex

    use = [f"data.prompt={out}"] + ([f"data.shots={shots}"] if shots else [])
    # The command trains under the conditions the prompt was chosen in: the same overrides (and --smoke).
    command = " ".join(["rlkit", "train", shlex.quote(recipe_path), *(["--smoke"] if smoke else []),
                        *(f"--set {shlex.quote(x)}" for x in [*overrides, *use])])
    gains = {"reward_gain": paired(base_eval.totals, best_eval.totals)}
    if base_eval.correct is not None:
        gains = {"gain": paired(base_eval.correct, best_eval.correct), **gains}
    scores = list(result.val_aggregate_scores)
    trajectory = [{"candidate": i, "parents": [p for p in result.parents[i] if p is not None],
                   "metric_calls": result.discovery_eval_counts[i], "val_score": score,
                   "best_so_far": max(scores[:i + 1]), "prompt": result.candidates[i]["system_prompt"]}
                  for i, score in enumerate(scores)]
    accepted = sum(p["accepted"] for p in history.proposals)
    return {
        "recipe": recipe.name, "recipe_path": recipe_path, "task": recipe.data.task, "model": label,
        "prompt": best, "base_prompt": base_prompt, "shots": shots, "changed": best != base_prompt,
        "use": {"set": use, "command": command},
        "eval": {"split": "eval", "base": _arm(base_eval), "optimized": _arm(best_eval), **gains},
        "optimizer": {"library": "gepa", "version": version("gepa"), "budget": budget,
                      "metric_calls": result.total_metric_calls, "train_rows": train, "val_rows": val,
                      "minibatch": minibatch, "seed": seed, "candidates": len(scores),
                      "proposals": len(history.proposals), "accepted": accepted, "best_candidate": result.best_idx,
                      "base_val_score": scores[0], "best_val_score": scores[result.best_idx]},
        "trajectory": trajectory, "proposals": history.proposals,
        "cost": {"metric_calls": result.total_metric_calls, "rows_generated": adapter.rows_generated,
                 "generation_seconds": round(adapter.seconds, 2), **reflection.metrics(),
                 "optimize_seconds": round(seconds[0], 2), "seconds": round(seconds[1], 2)},
        "reflection": {"endpoint": settings.endpoint, "model": settings.model, "api_key_env": settings.api_key_env,
                       "temperature": settings.temperature, "max_tokens": settings.max_tokens},
        "versions": {"rlkit": __version__, "gepa": version("gepa")},
    }


def write_outputs(out: Path, summary_: dict[str, Any]) -> None:
    """The prompt file, then its JSON; if the JSON cannot be written, a prompt file this run created goes too."""
    companion = json_path(out)
    safety.make_parent(out, "output")
    created = not out.exists()
    safety.write_text(out, summary_["prompt"] + "\n")
    try:
        safety.write_text(companion, safety.dumps(summary_, indent=2))
    except UserError:
        if created:
            out.unlink(missing_ok=True)
        raise
    summary_["path"], summary_["json"] = str(out), str(companion)


def print_summary(s: dict[str, Any]) -> None:
    """The eval table (recipe's prompt against the optimised one), the trajectory and the cost."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=140)
    ev = s["eval"]
    table = Table(title=f"optimize-prompt {s['recipe']} ({s['model']}): eval split, greedy, n={ev['base']['n']}",
                  caption="gain: optimised - recipe's prompt on the same rows, 95% paired-bootstrap interval, p "
                          "(exact McNemar for right/wrong); * = significant at 5%")
    table.add_column("prompt")
    has_accuracy = "gain" in ev
    if has_accuracy:
        table.add_column("accuracy [95% interval] (correct/n)", justify="right")
    table.add_column("mean reward [95% interval]", justify="right")
    for name, arm in (("recipe's", ev["base"]), ("optimised", ev["optimized"])):
        reward = show({"mean": arm["reward"], "low": arm["reward_interval"][0], "high": arm["reward_interval"][1]})
        cells = [f"{show_accuracy(arm['accuracy'], arm['n'], arm['interval'])} ({arm['correct']}/{arm['n']})"] \
            if has_accuracy else []
        table.add_row(name, *cells, reward)
    table.add_row("gain", *([show_diff(ev["gain"])] if has_accuracy else []), show_diff(ev["reward_gain"]))
    console.print(table)

    trajectory = Table(title="gepa: candidates on the validation rows (mean reward)")
    for column in ("candidate", "parents", "found after (metric calls)", "validation score", "best so far"):
        trajectory.add_column(column, justify="right")
    for t in s["trajectory"]:
        trajectory.add_row(str(t["candidate"]), ",".join(map(str, t["parents"])) or "-", str(t["metric_calls"]),
                           f"{t['val_score']:.3f}", f"{t['best_so_far']:.3f}")
    console.print(trajectory)

    c, o = s["cost"], s["optimizer"]
    cost = Table(title="cost", show_header=False)
    # gepa checks its budget before each iteration: the last one may end past it.
    for key, value in [("metric calls (rows scored)", f"{c['metric_calls']} (budget {o['budget']})"),
                       ("proposals (accepted)", f"{o['proposals']} ({o['accepted']})"),
                       ("reflection calls / requests / retries",
                        f"{c['reflection_calls']} / {c['reflection_requests']} / {c['reflection_retries']}"),
                       ("reflection tokens in / out", f"{c['reflection_prompt_tokens']} / "
                                                      f"{c['reflection_completion_tokens']}"),
                       ("seconds: generation / reflection / all",
                        f"{c['generation_seconds']:.1f} / {c['reflection_seconds']:.1f} / {c['seconds']:.1f}")]:
        cost.add_row(key, value)
    console.print(cost)
    if not s["changed"]:
        console.print("[yellow]no proposal beat the recipe's prompt on the validation rows: the file holds it "
                      "unchanged[/]")
    console.print(f"prompt: {s['path']} (results: {s['json']})")
    console.print(f"use it: {' '.join('--set ' + x for x in s['use']['set'])}")
