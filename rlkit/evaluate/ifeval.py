"""``rlkit eval TARGET --ifeval FILE``: IFEval (Zhou et al. 2023) as a general-ability regression check, for any
model rlkit can evaluate, the trained one beside its base.

Each prompt goes to the model as one user turn through rlkit's own batched greedy generation
(:mod:`rlkit.inference`) or to a model at an endpoint (:mod:`rlkit.evaluate.served`), and
lm-evaluation-harness's checkers score the reply (:mod:`rlkit.evaluate.ifeval_checks`). The four standard
numbers, each with its 95% interval:

- ``prompt_strict`` / ``prompt_loose``: share of prompts whose every instruction is followed (Wilson);
- ``inst_strict`` / ``inst_loose``: share of instructions followed (a bootstrap over prompts: one prompt's
  instructions are not independent). Loose forgives a first/last line and ``*`` marks, as the harness does.

With a base and a trained model, :func:`compare` gives the paired differences on the same prompts (exact
McNemar) and flags the trained model when its prompt-strict accuracy falls more than the recipe's
``eval.ifeval.tolerance`` below the base's. The settings (``limit``, ``max_new_tokens``, ``tolerance``) come
from the recipe's ``eval: {ifeval: ...}``; ``--limit`` and the function arguments win over them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit import runs, safety
from rlkit.errors import UserError
from rlkit.evaluate.ifeval_checks import load_prompts, prompts_file, score
from rlkit.evaluate.results import write_results
from rlkit.evaluate.served import Served, completer
from rlkit.inference.reference import model_tag, resolve_target, run_dir_of
from rlkit.stats import bootstrap_ratio, paired, wilson

if TYPE_CHECKING:
    from rlkit.recipe import Recipe

METRICS = {"prompt_strict": "prompt-level strict", "inst_strict": "instruction-level strict",
           "prompt_loose": "prompt-level loose", "inst_loose": "instruction-level loose"}
SUMMARY = "ifeval.json"


def resolve(target: str | Path, model: str | None = None,
            overrides: list[str] | None = None, smoke: bool = False) -> tuple[Recipe, Path | None, str | None]:
    """(recipe, run directory, model reference): a run directory or recipe as ``rlkit eval`` takes them, or a model
    alone (an adapter inside a run directory, a merged model, a Hub id, a pseudo id) with default settings."""
    from rlkit.recipe import apply_overrides, validate

    path = Path(target)
    if runs.is_run_dir(path) or path.suffix in (".yaml", ".yml"):
        recipe, run_dir = resolve_target(path, overrides, smoke)
        return recipe, run_dir, model
    if model is not None:
        raise UserError("--model: give the model as TARGET, or a run directory or recipe as TARGET and the model here")
    if runs.holds_adapter(path):
        run_dir = run_dir_of(path)
        if run_dir is None:
            raise UserError(f"{target}: an adapter outside a run directory; give the recipe it was trained with as "
                            "TARGET and the adapter as --model")
        return resolve_target(run_dir, overrides)[0], None, str(path)
    bare = {"name": "ifeval", "algorithm": "sft", "model": {"name_or_path": str(target)},
            "data": {"task": "sft", "train": {"synthetic": 1}}}
    return validate(apply_overrides(bare, overrides or []), source=f"{target} (a model alone)"), None, None


def ifeval(target: str | Path, model: str | None = None, *, prompts: str | Path, limit: int | None = None,
           max_new_tokens: int | None = None, out: str | Path | None = None, overrides: list[str] | None = None,
           smoke: bool = False, show_progress: bool = True, served: Served | None = None) -> dict[str, Any]:
    """IFEval on one model: write and return its results (``metrics``, ``examples`` with each reply and its
    per-instruction verdicts, ``path``). ``target``/``model`` name the model as for :func:`rlkit.evaluate.evaluate`
    (or ``target`` is the model itself); ``prompts`` is IFEval's ``input_data.jsonl`` or its folder."""
    recipe, run_dir, model = resolve(target, model, overrides, smoke)
    settings = recipe.eval.ifeval
    rows = load_prompts(prompts, limit or settings.limit)  # a bad file fails before any model loads
    if out is not None:
        safety.check_target(out, "--out")
        if Path(out).exists():
            safety.check_replaceable_file(out, "--out", ("recipe", "model"))
    new_tokens = max_new_tokens or settings.max_new_tokens
    subject = completer(recipe, run_dir, model, max_new_tokens=new_tokens, served=served)
    label = subject.label
    path = Path(out) if out else default_folder(target, recipe, run_dir, label) / f"{model_tag(label)}.json"
    with safety.hold(path):
        started = time.time()
        replies = subject.complete([[{"role": "user", "content": r["prompt"]}] for r in rows],
                                   batch_size=recipe.eval.batch_size, show_progress=show_progress, description="IFEval")
        seconds = time.time() - started
        examples = [{"key": row["key"], "prompt": row["prompt"], "instruction_id_list": row["instruction_id_list"],
                     "response": reply, **score(row, reply)} for row, reply in zip(rows, replies, strict=True)]
        results = {"benchmark": "ifeval", "recipe": recipe.name, "model": label, "prompts": str(prompts_file(prompts)),
                   "n": len(examples), "instructions": sum(len(e["strict"]) for e in examples),
                   "max_new_tokens": new_tokens, "tolerance": settings.tolerance, "seconds": round(seconds, 2),
                   "metrics": metrics(examples), "examples": examples}
        return write_results(results, path)


def metrics(examples: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The four IFEval numbers of scored examples: ``{name: {accuracy, interval, followed, n}}`` (``n`` counts
    prompts for the prompt-level numbers and instructions for the instruction-level ones)."""
    out = {}
    for level in ("strict", "loose"):
        followed, n = sum(bool(e[f"prompt_{level}"]) for e in examples), len(examples)
        out[f"prompt_{level}"] = {"accuracy": followed / n, "interval": list(wilson(followed, n)),
                                  "followed": followed, "n": n}
        per_prompt = [sum(e[level]) for e in examples]
        sizes = [len(e[level]) for e in examples]
        out[f"inst_{level}"] = {"accuracy": sum(per_prompt) / sum(sizes),
                                "interval": list(bootstrap_ratio(per_prompt, sizes)),
                                "followed": sum(per_prompt), "n": sum(sizes)}
    return {name: out[name] for name in METRICS}


def compare(base: dict[str, Any], trained: dict[str, Any], tolerance: float) -> dict[str, Any]:
    """Trained minus base on the same prompts: the paired prompt-level differences (exact McNemar), the drop in
    prompt-strict accuracy, and ``flagged``: whether that drop exceeds ``tolerance``."""
    keys = [e["key"] for e in base["examples"]]
    if keys != [e["key"] for e in trained["examples"]]:
        raise UserError(f"{base['path']} and {trained['path']}: not the same IFEval prompts; evaluate both with the "
                        "same file and --limit")
    diffs = {f"prompt_{level}": paired([float(e[f"prompt_{level}"]) for e in base["examples"]],
                                       [float(e[f"prompt_{level}"]) for e in trained["examples"]])
             for level in ("strict", "loose")}
    drop = base["metrics"]["prompt_strict"]["accuracy"] - trained["metrics"]["prompt_strict"]["accuracy"]
    return {**diffs, "drop": drop, "tolerance": tolerance, "flagged": drop > tolerance + 1e-12}


def default_folder(target: str | Path, recipe: Recipe, run_dir: Path | None, label: str) -> Path:
    """``RUN/eval/ifeval`` for a run, ``evals/<recipe>/ifeval`` for a recipe, ``evals/ifeval/<model>`` otherwise."""
    if run_dir is not None:
        return run_dir / "eval" / "ifeval"
    if Path(target).suffix in (".yaml", ".yml"):
        return Path("evals") / recipe.name / "ifeval"
    return Path("evals") / "ifeval" / model_tag(label)


def plan(target: str, model: str | None, base: str | None, no_base: bool) -> list[tuple[str, str, str | None]]:
    """``[(role, target, model), ...]``, base first: a run directory's adapter beside the base it recorded; a
    recipe's base model (and ``--model`` beside it); a model alone (and ``--base`` beside it)."""
    path = Path(target)
    if runs.is_run_dir(path):
        recorded = runs.read_resolved(path)["model"]["name_or_path"]
        models = [("base", target, base or recorded), ("trained", target, model)]
    elif path.suffix in (".yaml", ".yml"):
        models = [("base", target, base)] + ([("trained", target, model)] if model is not None else [])
    else:
        if model is not None:
            raise UserError("--model: give the model as TARGET, or a run directory or recipe as TARGET")
        models = ([("base", base, None)] if base is not None else []) + [("model", target, None)]
    if no_base:
        models = [m for m in models if m[0] != "base"]
    if not models:
        raise UserError("--no-base with nothing else to evaluate: give --model, or a run directory")
    return models


def run_ifeval(target: str, prompts: str | Path, *, model: str | None = None, base: str | None = None,
               no_base: bool = False, limit: int | None = None, max_new_tokens: int | None = None,
               out: str | Path | None = None, overrides: list[str] | None = None, smoke: bool = False,
               show_progress: bool = True, served: Served | None = None) -> dict[str, Any]:
    """IFEval on the base and the trained model side by side (``rlkit eval TARGET --ifeval FILE``): the models
    :func:`plan` names, through :func:`compare_models`, into ``out`` (default :func:`default_folder`)."""
    models = plan(target, model, base, no_base)
    if out is None:
        recipe, run_dir, ref = resolve(target, model, overrides, smoke)
        out = default_folder(target, recipe, run_dir, ref or str(target))
    return compare_models(models, prompts, out, limit=limit, max_new_tokens=max_new_tokens, overrides=overrides,
                          smoke=smoke, show_progress=show_progress, served=served)


def compare_models(models: list[tuple[str, str | Path, str | None]], prompts: str | Path, out: str | Path, *,
                   limit: int | None = None, max_new_tokens: int | None = None, overrides: list[str] | None = None,
                   smoke: bool = False, show_progress: bool = True, served: Served | None = None,
                   stages: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """IFEval on each ``(role, target, model)`` in turn, into ``out/<role>.json``; writes and returns the summary
    ``out/ifeval.json``: ``rows`` (one per model) and ``comparisons``: when the first role is ``base``, every other
    model against it, then each ``(role, against)`` of ``stages`` (default: with three or more models the last against
    the one before it, what the last stage cost), each with the tolerance flag of the last model's recipe."""
    prompts_file(prompts)  # a missing file fails before any model loads
    out = safety.check_target(out, "--out")
    summary_path = out / SUMMARY
    safety.check_replaceable_file(summary_path, "--out", ("benchmark", "rows"))
    rows, results = [], []
    for role, where, ref in models:
        res = ifeval(where, ref, prompts=prompts, limit=limit, max_new_tokens=max_new_tokens, smoke=smoke,
                     out=out / f"{role}.json", overrides=overrides, show_progress=show_progress, served=served)
        results.append(res)
        rows.append({"role": role, "model": res["model"], "n": res["n"], "instructions": res["instructions"],
                     "seconds": res["seconds"], "metrics": res["metrics"], "results": res["path"]})
    tolerance = results[-1]["tolerance"]  # the trained model's recipe says how much it may lose
    pairs = [(0, i) for i in range(1, len(rows))] if rows[0]["role"] == "base" else []
    index = {row["role"]: i for i, row in enumerate(rows)}
    if stages is not None:
        pairs += [(index[against], index[role]) for role, against in stages]
    elif len(rows) >= 3:
        pairs.append((len(rows) - 2, len(rows) - 1))
    comparisons = [{"role": rows[i]["role"], "against": rows[j]["role"], **compare(results[j], results[i], tolerance)}
                   for j, i in dict.fromkeys(pairs)]
    summary = {"benchmark": "ifeval", "prompts": results[0]["prompts"], "max_new_tokens": results[0]["max_new_tokens"],
               "tolerance": tolerance, "rows": rows, "comparisons": comparisons}
    safety.make_parent(summary_path, "eval")
    safety.write_text(summary_path, safety.dumps(summary, indent=2))
    summary["path"] = str(summary_path)
    return summary
