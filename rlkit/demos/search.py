"""``make demo-search``: SmolLM2-135M-Instruct learns to search a closed news corpus, offline, on a CPU.

The DeepSearch-RL pipeline at laptop scale, every stage through the code a GPU user runs:

- the base model, evaluated as greedy agent episodes with the ``retrieval`` tool;
- the teacher: ``rlkit rollout --oracle`` (a teacher that knows each question's gold evidence) on training
  questions, through the rollout engine and success filter an ``--endpoint`` teacher goes through; its
  successful episodes become SFT rows (``--sft-out``);
- ``smol_search_sft`` on those rows, evaluated;
- ``smol_search_grpo`` from the SFT adapter (F1 reward, agent eval every few steps, best step kept), evaluated:
  the kept step's adapter (``best/``), which is the SFT adapter itself when no GRPO step beat it.

Each model is evaluated on the held-out synthetic questions, on a second wording family whose question
shapes training never saw, and (when it can be had: a data folder, or HippoRAG's repository at a pinned commit,
:func:`rlkit.data.sources.public_sets`) on HotpotQA's closed set through the bring-your-own-data recipe: real
questions, transfer only.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

from rlkit import jsonl
from rlkit.demos.ifeval import ifeval_check
from rlkit.demos.stages import Stages, control_overrides, copy_evals, machine_overrides, prepare, train_minutes
from rlkit.recipe import recipes_dir

SFT, GRPO, BYOD = "smol_search_sft.yaml", "smol_search_grpo.yaml", "hotpotqa_byod_grpo.yaml"
TEACHER_QUESTIONS = 128
SETS = [("held-out questions, training wording", "heldout", []),
        ("new wording (question shapes never trained on)", "newwording",
         ["data.eval.generator.wording=other", "data.eval.seed=777"])]
# The smol model on HotpotQA through the BYOD recipe: its model (eager attention, in float32 too: FLOAT32_ATTENTION
# does not reach it; against SDPA 4.67 -> 4.37 GB alone, the same F1), tool budget and generation length.
_SMOL_ON_BYOD = ["model.name_or_path=rlkit/smollm2-135m-instruct", "model.backend=hf", "model.load_in_4bit=false",
                 "model.dtype=bfloat16", "model.attn_implementation=eager", "model.max_seq_length=1536",
                 "env.max_turns=3", "retrieval.top_k=1", "eval.max_new_tokens=64", "eval.batch_size=16"]
STAGE_KEYS = ("base", "sft", "grpo", "control")
STAGE_COLUMNS = ("base", "after SFT", "after GRPO", "SFT continued")
# In float32 (a CPU without bf16 units: machine_overrides) the loss's logits and their gradient over 8 completions
# took 3 GRPO steps from the base to a peak RSS of 4.26 GB (`time -v`); 4 completions at a time, twice: 2.86 GB, the
# same 2 prompts x 4 generated together and one optimizer step, no slower (8 min 54 s against 10 min 10 s; oneDNN
# held to AVX2, bench/results/grpo_step_history.md).
FLOAT32_GRPO = ["trainer.per_device_train_batch_size=4", "trainer.gradient_accumulation_steps=2"]
# The recipes' eager attention is for bf16 (decoding, on CPU). In float32 transformers' default (SDPA; the demo's evals,
# and GRPO since 2026-12-02, with rlkit's grouped-query form) is faster over these long rows: from the SFT agent
# (e00bf11d, AMD EPYC, 2 idle cores) 2 GRPO steps 659 -> 576 s with the same logged losses and samples, the held-out
# eval 337 -> 289 s with the same 100 trajectories (docs/performance.md). GRPO, the evals and the IFEval check take it
# (SFT and the control have no attention setting); the HotpotQA eval keeps eager, whose memory was measured there.
FLOAT32_ATTENTION = ["model.attn_implementation=null"]
# So is the recipe's static cache (bf16, with eager): TRL sized it for max_completion_length (512; since the recipe's
# cap on each reply, 64) on every turn, and a decoding step attends over all of it. In float32 GRPO generates with
# transformers' default cache, which grows with what was generated: from that SFT agent, on a slower evening (the 576 s
# run took 796 s), 2 steps 796 -> 697 s, byte-identical adapters (docs/performance.md). Kept with a user's eager too:
# alone, eager generated faster with it.
FLOAT32_CACHE = ["trainer.cache_implementation=null"]
GAIN_NOTE = ("gain: paired F1 difference on the same questions, its 95% bootstrap interval and p; "
             "* = significant at 5%")


def searches(results: dict[str, Any]) -> float:
    """Mean tool calls per episode."""
    episodes = jsonl.read_records(Path(results["trajectories"]))
    return sum(len(e["tool_calls"]) for e in episodes) / len(episodes)


def hotpotqa_data(source: Path | None, output_dir: Path) -> Path | None:
    """HotpotQA's closed set (``source``: its folder; all 100 questions: none is trained on) in the
    bring-your-own-data layout under ``output_dir/hotpotqa``, written by ``examples/hotpotqa_byod.py`` as
    ``make hotpotqa-data`` does; None without the data or the script."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "examples" / "hotpotqa_byod.py"
    if source is None or not script.is_file():
        return None
    out = output_dir / "hotpotqa"
    subprocess.run([sys.executable, str(script), str(source), str(out)], check=True, capture_output=True)
    questions = "".join((out / name).read_text(encoding="utf-8") for name in ("train.jsonl", "eval.jsonl"))
    (out / "all.jsonl").write_text(questions, encoding="utf-8")
    return out


def run_search_demo(output_dir: Path, overrides: list[str] | None = None, grpo_overrides: list[str] | None = None,
                    *, teacher_questions: int = TEACHER_QUESTIONS, limit: int | None = None,
                    data_dir: Path | None = None, control: bool = True,
                    grpo_minutes: float | None = None) -> dict[str, Any]:
    """Base, SFT, GRPO and (``control``) SFT continued on the teacher's rows for GRPO's minutes, search agents each
    evaluated on every set (its first ``limit`` questions); returns
    the summary also written to ``output_dir/demo.json``. Each stage that loads a model runs in a fresh process
    (so a script that calls this needs the ``if __name__ == "__main__":`` guard). ``overrides`` apply to both
    recipes and every eval; of them, the ``model.*`` and ``eval.*`` keys also apply to the HotpotQA eval, which runs
    the BYOD recipe. ``data_dir``: a folder holding HotpotQA's closed set and IFEval's prompts
    (:func:`rlkit.data.sources.public_sets`). ``grpo_minutes`` ends GRPO at the first step that long after it
    began (``train``'s ``max_minutes``); the control trains for the minutes GRPO took."""
    from rich.console import Console

    from rlkit import safety
    from rlkit.agents.rollout import rollout
    from rlkit.data.sources import public_sets
    from rlkit.recipe import load_recipe
    from rlkit.report import write_report
    from rlkit.tiny import resolve_model_id
    from rlkit.train import train

    console = Console()
    sft_recipe, grpo_recipe = recipes_dir() / SFT, recipes_dir() / GRPO
    overrides = float32_settings(grpo_recipe, machine_overrides(console) + list(overrides or []), FLOAT32_ATTENTION)
    output_dir = Path(output_dir)
    teacher = output_dir / "teacher" / "sft_rows.jsonl"
    sft_set = overrides + [f"data.train.path={json.dumps(str(teacher))}"]
    control_set = control_overrides(sft_set, output_dir / "sft")  # on the teacher's rows, as the SFT
    grpo_set = grpo_settings(grpo_recipe, overrides + list(grpo_overrides or []))
    # a --set the SFT recipe refuses (a GRPO-only trainer key) is one line before any work, as in the other demos
    output_dir = prepare(output_dir, [(sft_recipe, overrides), (grpo_recipe, grpo_set)])
    sft_dir, grpo_dir, control_dir = output_dir / "sft", output_dir / "grpo", output_dir / "sft-continued"
    found = public_sets({"hotpotqa": "the HotpotQA row", "ifeval": "the IFEval check"}, data_dir,
                        output_dir / "data")
    byod = hotpotqa_data(found["hotpotqa"], output_dir)
    sets = SETS + ([("HotpotQA closed set (real questions, transfer only)", "hotpotqa",
                     [f"retrieval.corpus={json.dumps(str(byod / 'corpus.json'))}",
                      f"data.eval.path={json.dumps(str(byod / 'all.jsonl'))}"])] if byod else [])
    byod_set = _SMOL_ON_BYOD + [o for o in overrides
                                if o.startswith(("model.", "eval.")) and o not in FLOAT32_ATTENTION]
    stages = Stages(console)
    steps = 9 if control else 7

    evaluate_all = partial(_evaluate_sets, sets, recipe=grpo_recipe, overrides=overrides, byod_set=byod_set,
                           out=output_dir / "eval", limit=limit)  # (tag, model); a partial pickles, a closure not

    # Every stage that loads a model runs in a fresh process (Stages.run_fresh): each starts from nothing the
    # stages before it left in the heap, and this process, which never loads one, stays small.
    console.rule(f"1/{steps}  the model: SmolLM2-135M-Instruct (Q4_1 GGUF dequantized; built once)")
    name = load_recipe(grpo_recipe, overrides).model.name_or_path
    console.print(f"{name} -> {stages.run_fresh('model build / cache check', resolve_model_id, name)}")
    console.rule(f"2/{steps}  evaluate the base model (greedy agent episodes with the search tool)")
    base = stages.run_fresh("base eval", evaluate_all, "base", None)
    console.rule(f"3/{steps}  the teacher: oracle episodes on {teacher_questions} training questions -> SFT rows")
    safety.remove(teacher.parent, "--output-dir")  # a previous run's, marked as rlkit's (or refused)
    safety.make_dir(teacher.parent, "demo")
    summary = stages.run("teacher rollout", lambda: rollout(
        grpo_recipe, oracle=True, split="train", limit=teacher_questions, overrides=overrides,
        out=teacher.parent / "trajectories.jsonl", sft_out=teacher, show_progress=False))
    console.print(f"teacher: {summary['episodes']} episodes, {summary['successes']} successful -> "
                  f"{summary['sft_rows']} SFT rows ({teacher}); `rlkit analyze {summary['path']}` for its tables")
    console.rule(f"4/{steps}  SFT on the teacher's successful trajectories ({SFT})")
    stages.run_fresh("SFT training", train, sft_recipe, sft_set, output_dir=sft_dir, overwrite=True)
    console.rule(f"5/{steps}  evaluate after SFT")
    sft = stages.run_fresh("SFT eval", evaluate_all, "sft", str(sft_dir))
    console.rule(f"6/{steps}  GRPO with the search tool, from the SFT adapter ({GRPO})")
    stages.run_fresh("GRPO training", train, grpo_recipe, grpo_set + [f"init_from={json.dumps(str(sft_dir))}"],
                     output_dir=grpo_dir, overwrite=True, max_minutes=grpo_minutes)
    grpo_model = kept_adapter(grpo_dir, stages, console)
    console.rule(f"7/{steps}  evaluate after GRPO")
    grpo = stages.run_fresh("GRPO eval", evaluate_all, "grpo", grpo_model)
    evaluated = [base, sft, grpo]
    if control:
        minutes = train_minutes(grpo_dir)
        console.rule(f"8/{steps}  the control: SFT continued for GRPO's {minutes:.1f} min on the teacher's rows")
        stages.run_fresh("SFT continued (control)", train, sft_recipe, control_set, output_dir=control_dir,
                         overwrite=True, max_minutes=minutes)
        console.rule(f"9/{steps}  evaluate the control")
        evaluated.append(stages.run_fresh("control eval", evaluate_all, "control", str(control_dir)))
    copy_evals(output_dir / "eval", grpo_dir)
    models = [("base", None), ("SFT", str(sft_dir)), ("GRPO", grpo_model),
              *([("SFT continued", str(control_dir))] if control else [])]
    ifeval_check(stages, grpo_recipe, overrides, models, grpo_dir / "eval" / "ifeval", limit=limit, fresh=True,
                 prompts=found["ifeval"])
    write_report(grpo_dir)
    rows = _rows(sets, *evaluated)
    for table in _tables(rows):
        stages.show(table)
    _plot(rows, output_dir / "f1_by_stage.png")
    return stages.finish(rows, output_dir)


def grpo_settings(recipe: Path, overrides: list[str]) -> list[str]:
    """The GRPO stage's overrides: :data:`FLOAT32_GRPO` and :data:`FLOAT32_CACHE` first in float32 (a batch or a cache
    in ``grpo_overrides`` wins)."""
    return float32_settings(recipe, float32_settings(recipe, overrides, FLOAT32_CACHE), FLOAT32_GRPO)


def float32_settings(recipe: Path, overrides: list[str], settings: list[str]) -> list[str]:
    """``settings`` (each ``section.key=value``) first where the model trains in float32
    (:func:`rlkit.backends.hf.torch_dtype`) and ``overrides`` set none of their keys (the user's own choice wins)."""
    import torch

    from rlkit.backends.hf import torch_dtype
    from rlkit.recipe import apply_overrides, load_recipe

    float32 = torch_dtype(load_recipe(recipe, overrides).model.dtype) == torch.float32
    theirs, ours = apply_overrides({}, overrides), apply_overrides({}, settings)
    mine = any(isinstance(theirs.get(section), dict) and key in theirs[section] for section, keys in ours.items()
               for key in keys)
    return (settings if float32 and not mine else []) + overrides


def _evaluate_sets(sets: list[tuple[str, str, list[str]]], tag: str, model: str | None, *, recipe: Path,
                   overrides: list[str], byod_set: list[str], out: Path, limit: int | None) -> list[dict[str, Any]]:
    """One model on every set (the search recipe's, or the BYOD recipe's for HotpotQA), each printed as it ends."""
    from rich.console import Console

    from rlkit.evaluate import evaluate

    console, scores = Console(), []
    for label, slug, extra in sets:
        on_byod = slug == "hotpotqa"
        res = evaluate(recipes_dir() / BYOD if on_byod else recipe, model,
                       overrides=(byod_set if on_byod else overrides) + extra, out=out / f"{tag}-{slug}.json",
                       limit=limit)
        scores.append({"results": res, "n": res["n"], "em": res["em"], "f1": res["f1"], "searches": searches(res)})
        console.print(f"  {label}: EM {res['em']:.3f}, F1 {res['f1']:.3f}, "
                      f"searches per episode {scores[-1]['searches']:.2f} (n={res['n']})")
    return scores


def kept_adapter(grpo_dir: Path, stages: Any, console: Any) -> str:
    """What "after GRPO" evaluates: the adapter the agent eval kept (``best/``, the highest held-out F1 of step 0,
    every ``eval.agent_every`` steps and the end), else the run's last one. The kept step goes in demo.json."""
    best = grpo_dir / "best.json"
    if not best.is_file():
        return str(grpo_dir)
    kept = json.loads(best.read_text(encoding="utf-8"))
    stages.extra["grpo_kept"] = {key: kept[key] for key in ("step", "n", "f1", "f1_interval", "why")}
    console.print(f"GRPO: evaluating the adapter the agent eval kept, step {kept['step']} ({grpo_dir / 'best'}): "
                  f"{kept['why']}")
    return str(grpo_dir / "best")


def _rows(sets: list[tuple[str, str, list[str]]], *stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per evaluated set: EM/F1 (each with its 95% interval) and searches per stage (base, SFT, GRPO and, when
    a fourth is given, the equal-time control), paired F1 gains, and F1/EM per question type."""
    from rlkit.stats import paired

    rows = []
    for (label, slug, _), *evaluated in zip(sets, *stages, strict=True):
        named = tuple(zip(STAGE_KEYS, evaluated, strict=False))
        scores = {name: _scores(s["results"]) for name, s in named}
        overall = {name: _quality(by_kind["all"]) for name, by_kind in scores.items()}
        f1 = {name: by_kind["all"]["f1"] for name, by_kind in scores.items()}
        rows.append({"set": label, "slug": slug, "n": evaluated[0]["n"],
                     **{f"{name}_{key}": overall[name][key] for name, _ in named
                        for key in ("em", "em_interval", "f1", "f1_interval")},
                     **{f"{name}_searches": s["searches"] for name, s in named},
                     "sft_minus_base": paired(f1["base"], f1["sft"]), "grpo_minus_sft": paired(f1["sft"], f1["grpo"]),
                     "grpo_minus_base": paired(f1["base"], f1["grpo"]),
                     **({"grpo_minus_control": paired(f1["control"], f1["grpo"])} if "control" in f1 else {}),
                     "by_type": {name: {kind: _quality(v) for kind, v in by_kind.items() if kind != "all"}
                                 for name, by_kind in scores.items()}})
    return rows


def _scores(results: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """Each episode's F1 and EM in row order, for all episodes (``"all"``) and per question type."""
    out: dict[str, dict[str, list[float]]] = {}
    for record in jsonl.read_records(Path(results["trajectories"])):
        metrics = record.get("metrics") or {}
        for kind in ("all", *([record["question_type"]] if record.get("question_type") is not None else [])):
            for key in ("f1", "em"):
                out.setdefault(kind, {"f1": [], "em": []})[key].append(float(metrics.get(key) or 0.0))
    return dict(sorted(out.items()))


def _quality(scores: dict[str, list[float]]) -> dict[str, Any]:
    """n, mean F1 with its 95% bootstrap interval, mean EM with its 95% Wilson interval (EM is right or wrong)."""
    from rlkit.stats import bootstrap, wilson

    f1, em = scores["f1"], scores["em"]
    return {"n": len(f1), "f1": sum(f1) / len(f1), "f1_interval": list(bootstrap(f1)),
            "em": sum(em) / len(em), "em_interval": list(wilson(round(sum(em)), len(em)))}


def _tables(rows: list[dict[str, Any]]) -> list[Any]:
    """The closing tables (:func:`rlkit.evaluate.show.results_table`): per set, then per set and question type."""
    from rlkit.evaluate.show import results_table
    from rlkit.stats import show_diff

    stages = [(column, k) for column, k in zip(STAGE_COLUMNS, STAGE_KEYS, strict=True) if f"{k}_f1" in rows[0]]
    names = " -> ".join(column.removeprefix("after ") for column, _ in stages)
    sets = results_table(
        f"rlkit search agent: SmolLM2-135M-Instruct, {names} (greedy; F1 [95% bootstrap interval], EM [95% Wilson "
        "interval]; searches per episode)",
        [{"set": r["set"], "n": str(r["n"]), **{f"F1 {column}": _show(r, k, "f1") for column, k in stages},
          **{f"EM {column}": _show(r, k, "em") for column, k in stages},
          "F1 SFT - base": show_diff(r["sft_minus_base"]), "F1 GRPO - SFT": show_diff(r["grpo_minus_sft"]),
          **({"F1 GRPO - control": show_diff(r["grpo_minus_control"])} if "grpo_minus_control" in r else {}),
          f"searches {names}": " -> ".join(f"{r[f'{k}_searches']:.2f}" for _, k in stages)}
         for r in rows], caption=GAIN_NOTE)
    kinds = results_table(
        f"F1 [95% bootstrap interval] and EM [95% Wilson interval] per question type: {names}",
        [{"set: question type": f"{r['slug']}: {kind}", "n": str(q["n"]),
          **{f"{key.upper()} {column}": _show(r["by_type"][k].get(kind), None, key)
             for key in ("f1", "em") for column, k in stages}}
         for r in rows for kind, q in r["by_type"]["base"].items()])
    return [sets, kinds]


def _show(row: dict[str, Any] | None, stage: str | None, key: str) -> str:
    """``0.275 [0.201, 0.352]``: ``row[stage_key]`` (``row[key]`` without a stage) with its interval."""
    from rlkit.stats import show

    if row is None:
        return "-"
    prefix = f"{stage}_" if stage else ""
    low, high = row[f"{prefix}{key}_interval"]
    return show({"mean": row[f"{prefix}{key}"], "low": low, "high": high})


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    """F1 by stage with its 95% bootstrap interval as error bars, one line per evaluated set (a PNG next to
    demo.json)."""
    from matplotlib.figure import Figure

    from rlkit.report.charts import save

    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    stages = [k for k in STAGE_KEYS if f"{k}_f1" in rows[0]]
    for i, r in enumerate(rows):
        means = [r[f"{k}_f1"] for k in stages]
        # max(0, ...): when every F1 is equal the bounds are the mean, give or take a rounding error of either sign
        below = [max(0.0, m - r[f"{k}_f1_interval"][0]) for m, k in zip(means, stages, strict=True)]
        above = [max(0.0, r[f"{k}_f1_interval"][1] - m) for m, k in zip(means, stages, strict=True)]
        shift = 0.05 * (i - (len(rows) - 1) / 2)  # side by side, so one set's bars do not hide another's
        ax.errorbar([x + shift for x in range(len(stages))], means, yerr=[below, above], marker="o", capsize=4,
                    label=f"{r['slug']} (n={r['n']})")
    ax.set_xticks(range(len(stages)), [c for c, k in zip(STAGE_COLUMNS, STAGE_KEYS, strict=True) if k in stages])
    ax.set_ylabel("F1 (greedy, mean over questions;\nbars: 95% bootstrap interval)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", frameon=False)
    save(fig, "search agent: F1 by stage", path)
