"""``make demo-calc``: SmolLM2-135M-Instruct learns to use a calculator tool, offline, on a CPU.

The model gets word problems with multi-digit arithmetic it cannot do in its head (task ``calc``) and the
``calculator`` environment. Three models are evaluated as greedy agent episodes, each on the held-out
problems and on a second family whose wording training never saw:

- the base model (two worked tool turns in the prompt);
- after ``smol_calc_sft``: a short SFT warm-up on oracle tool-call trajectories (the call format);
- after ``smol_calc_grpo``: GRPO with the calculator, continuing from the SFT adapter;
- the equal-time control: ``smol_calc_sft`` continued from the SFT adapter on oracle trajectories of GRPO's problems
  for as many minutes as GRPO trained.

Every stage goes through ``rlkit train`` / ``rlkit eval``'s code and is timed (:class:`rlkit.demos.stages.Stages`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlkit import jsonl
from rlkit.demos.ifeval import ifeval_check
from rlkit.demos.stages import (
    GAIN_CAPTION,
    Stages,
    control_overrides,
    copy_evals,
    machine_overrides,
    prepare,
    train_minutes,
)
from rlkit.recipe import recipes_dir

SFT, GRPO = "smol_calc_sft.yaml", "smol_calc_grpo.yaml"
SETS = [("held-out problems, training wording", "heldout", []),
        ("new wording (names, things, sentence shapes never trained on)", "newwording",
         ["data.eval.generator.wording=other", "data.eval.seed=777"])]


def tool_share(results: dict[str, Any]) -> float:
    """Share of the evaluated episodes that called a tool at least once."""
    episodes = jsonl.read_records(Path(results["trajectories"]))
    return sum(bool(e["tool_calls"]) for e in episodes) / len(episodes)


def run_calc_demo(output_dir: Path, overrides: list[str] | None = None, grpo_overrides: list[str] | None = None,
                  *, data_dir: Path | None = None, control: bool = True) -> dict[str, Any]:
    """Base, SFT, GRPO and (``control``) SFT continued for GRPO's minutes on GRPO's problems, each evaluated on both
    sets; returns the summary that is also written to ``output_dir/demo.json``. ``overrides`` apply to both recipes
    (and every eval), ``grpo_overrides`` to GRPO training only (its trainer keys are not SFT's); ``data_dir``: a
    folder holding IFEval's prompts (:func:`rlkit.data.sources.public_sets`)."""
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
    sft_recipe, grpo_recipe = recipes_dir() / SFT, recipes_dir() / GRPO
    overrides = machine_overrides(console) + list(overrides or [])
    pool = load_recipe(grpo_recipe, overrides).data.train.model_dump(exclude_defaults=True)
    control_set = control_overrides(overrides, Path(output_dir) / "sft", pool)
    output_dir = prepare(Path(output_dir), [(sft_recipe, overrides),
                                            (grpo_recipe, overrides + list(grpo_overrides or [])),
                                            *([(sft_recipe, control_set)] if control else [])])
    sft_dir, grpo_dir, control_dir = output_dir / "sft", output_dir / "grpo", output_dir / "sft-continued"
    found = public_sets({"ifeval": "the IFEval check"}, data_dir, output_dir / "data")
    stages = Stages(console)
    steps = 8 if control else 6

    def evaluate_both(tag: str, model: str | None) -> list[dict[str, Any]]:
        out = []
        for label, slug, extra in SETS:
            res = evaluate(grpo_recipe, model, overrides=overrides + extra,
                           out=output_dir / "eval" / f"{tag}-{slug}.json")
            out.append({"accuracy": res["accuracy"], "interval": res["interval"], "tool_share": tool_share(res),
                        "n": res["n"], "results": res})
            console.print(f"  {label}: accuracy {res['accuracy']:.3f}, episodes calling the tool "
                          f"{out[-1]['tool_share']:.2f} (n={res['n']})")
        return out

    console.rule(f"1/{steps}  the model: SmolLM2-135M-Instruct (Q4_1 GGUF dequantized; built once)")
    name = load_recipe(grpo_recipe, overrides).model.name_or_path
    console.print(f"{name} -> {stages.run('model build / cache check', lambda: resolve_model_id(name))}")
    console.rule(f"2/{steps}  evaluate the base model (greedy agent episodes with the calculator)")
    evals = {"base": stages.run("base eval", lambda: evaluate_both("base", None))}
    console.rule(f"3/{steps}  SFT warm-up on oracle tool-call trajectories ({SFT})")
    stages.run("SFT training", lambda: train(sft_recipe, overrides, output_dir=sft_dir, overwrite=True))
    console.rule(f"4/{steps}  evaluate after SFT")
    evals["SFT"] = stages.run("SFT eval", lambda: evaluate_both("sft", str(sft_dir)))
    console.rule(f"5/{steps}  GRPO with the calculator, from the SFT adapter ({GRPO})")
    grpo_set = overrides + list(grpo_overrides or []) + [f"init_from={json.dumps(str(sft_dir))}"]
    stages.run("GRPO training", lambda: train(grpo_recipe, grpo_set, output_dir=grpo_dir, overwrite=True))
    console.rule(f"6/{steps}  evaluate after GRPO")
    evals["GRPO"] = stages.run("GRPO eval", lambda: evaluate_both("grpo", str(grpo_dir)))
    if control:
        minutes = train_minutes(grpo_dir)
        console.rule(f"7/{steps}  the control: SFT continued for GRPO's {minutes:.1f} min on its problems")
        stages.run("SFT continued (control)", lambda: train(sft_recipe, control_set, output_dir=control_dir,
                                                            overwrite=True, max_minutes=minutes))
        console.rule(f"8/{steps}  evaluate the control")
        evals["SFT continued"] = stages.run("control eval", lambda: evaluate_both("control", str(control_dir)))
    # The GRPO run's report.md then shows every stage's accuracies next to its reward curves.
    copy_evals(output_dir / "eval", grpo_dir)
    models = [("base", None), ("SFT", str(sft_dir)), ("GRPO", str(grpo_dir)),
              *([("SFT continued", str(control_dir))] if control else [])]
    ifeval_check(stages, grpo_recipe, overrides, models, grpo_dir / "eval" / "ifeval", prompts=found["ifeval"])
    write_report(grpo_dir)

    pairs = {"GRPO - SFT": ("SFT", "GRPO"), "GRPO - base": ("base", "GRPO"),
             "GRPO - control": ("SFT continued", "GRPO")}
    rows = [{"set": label, "n": evals["base"][i]["n"],
             **{m: {"accuracy": e[i]["accuracy"], "interval": e[i]["interval"], "tool_share": e[i]["tool_share"]}
                for m, e in evals.items()},
             **{k: gain(evals[a][i]["results"], evals[b][i]["results"]) for k, (a, b) in pairs.items()
                if a in evals and b in evals}}
            for i, (label, _, _) in enumerate(SETS)]
    stages.show(results_table(
        "rlkit calculator agent: SmolLM2-135M-Instruct (greedy accuracy [95% Wilson interval]; tool = episodes "
        "calling the calculator)",
        [{"held-out set": r["set"], "n": str(r["n"]),
          **{m: show_accuracy(r[m]["accuracy"], r["n"], r[m]["interval"]) for m in evals},
          **{k: show_diff(r[k]) for k in pairs if k in r},
          "tool " + " -> ".join(evals): " -> ".join(f"{r[m]['tool_share']:.2f}" for m in evals)}
         for r in rows], caption=GAIN_CAPTION))
    return stages.finish(rows, output_dir)
