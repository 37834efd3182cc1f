"""``make demo``: the whole pipeline on the built-in tiny model, offline, on a CPU.

Builds the tiny model, evaluates it untrained, runs SFT on generated arithmetic word problems,
evaluates, runs GRPO continuing from the SFT adapter, evaluates again, and prints what happened: each
stage's accuracy with its 95% Wilson interval and its paired gain over the stage before (the same problems).
Every stage goes through the same code as ``rlkit train`` / ``rlkit eval`` with the shipped
recipes ``tiny_arith_sft`` and ``tiny_arith_grpo``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rlkit.recipe import recipes_dir

GAIN_CAPTION = ("gain: this stage minus the one before on the same problems (both recipes share the eval set), "
                "its 95% bootstrap interval and exact McNemar p; * = significant at 5%")


def run_demo(output_dir: Path) -> list[dict]:
    from rich.console import Console

    from rlkit.evaluate import evaluate
    from rlkit.evaluate.results import gain
    from rlkit.evaluate.show import results_table, write_markdown
    from rlkit.stats import show_accuracy, show_diff
    from rlkit.tiny import TINY_MODEL_SMALL, tiny_model_path
    from rlkit.train import train

    console = Console()
    output_dir = Path(output_dir)
    sft_recipe, grpo_recipe = recipes_dir() / "tiny_arith_sft.yaml", recipes_dir() / "tiny_arith_grpo.yaml"
    sft_dir, grpo_dir = output_dir / "sft", output_dir / "grpo"
    rows: list[dict] = []
    evals: list[dict] = []  # each stage's results: the paired gain compares one with the one before

    def stage(name: str, seconds: float, results: dict) -> None:
        fmt = sum(e["prediction"] is not None and "####" in e["completion"] for e in results["examples"])
        rows.append({"stage": name, "accuracy": results["accuracy"], "interval": results["interval"],
                     "gain": gain(evals[-1], results) if evals else None, "format": fmt / results["n"],
                     "n": results["n"], "train_seconds": round(seconds, 1)})
        evals.append(results)
        accuracy = show_accuracy(results["accuracy"], results["n"], results["interval"])
        console.print(f"[bold]{name}[/]: accuracy {accuracy} on {results['n']} held-out problems")

    started = time.time()
    console.rule("1/5  build the tiny model")
    path = tiny_model_path("small")
    console.print(f"{TINY_MODEL_SMALL} -> {path}")
    console.rule("2/5  evaluate the untrained model")
    stage("untrained", 0.0, evaluate(sft_recipe, out=output_dir / "eval-untrained.json"))
    console.rule("3/5  SFT (LoRA) on generated arithmetic word problems")
    t = time.time()
    train(sft_recipe, output_dir=sft_dir, overwrite=True)
    sft_seconds = time.time() - t
    stage("after SFT", sft_seconds, evaluate(sft_dir, out=output_dir / "eval-sft.json"))
    console.rule("4/5  GRPO continuing from the SFT adapter")
    t = time.time()
    train(grpo_recipe, [f"init_from={sft_dir}"], output_dir=grpo_dir, overwrite=True)
    grpo_seconds = time.time() - t
    console.rule("5/5  evaluate after GRPO")
    stage("after SFT + GRPO", grpo_seconds, evaluate(grpo_dir, out=output_dir / "eval-grpo.json"))

    table = results_table(
        "rlkit demo: tiny Qwen3 on held-out arithmetic word problems (greedy pass@1 [95% Wilson interval])",
        [{"stage": r["stage"], "accuracy": show_accuracy(r["accuracy"], r["n"], r["interval"]),
          "gain over the stage before [95%] p": show_diff(r["gain"]) if r["gain"] else "-",
          "answer format": f"{r['format']:.2f}", "examples": str(r["n"]), "train time (s)": f"{r['train_seconds']:.0f}"}
         for r in rows], caption=GAIN_CAPTION)
    console.print(table)
    write_markdown(output_dir / "table.md", [table])
    console.print(f"total {time.time() - started:.0f}s; runs and per-example predictions in {output_dir}/")
    (output_dir / "demo.json").write_text(json.dumps(rows, indent=2))
    return rows
