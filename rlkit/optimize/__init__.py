"""``rlkit optimize-prompt RECIPE``: how far a better system prompt alone gets, before paying for RL.

gepa (reflective prompt evolution; Agrawal et al. 2025, https://github.com/gepa-ai/gepa) runs the search; rlkit
only plugs the recipe into it:

- the candidate is one text, the recipe's system prompt (``data.prompt``'s text; its worked turns stay);
- the task model is the recipe's model, here, greedy, through rlkit's batched generation;
- a row's score is the recipe's weighted reward total on that row (:mod:`rlkit.optimize.adapter`);
- the reflection model is an OpenAI-compatible endpoint (:mod:`rlkit.optimize.reflection`);
- the budget is gepa's ``max_metric_calls``: one call is one row generated and scored.

The train split's first ``limit_train`` rows feed gepa's reflection minibatches, the next ``limit_val`` rows are
its validation (Pareto) set, which picks the best prompt. Then the recipe's prompt and the best one are evaluated
on the eval split, row for row (accuracy by the task's answer rule, as ``rlkit eval`` reports it, and the mean
reward, each with its 95% interval, and the paired difference). The prompt is written to ``--out`` (a file
``data.prompt:`` reads) and everything else to the JSON beside it (:mod:`rlkit.optimize.report`).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from rlkit import safety
from rlkit.errors import UserError
from rlkit.optimize.report import check_out, summary_json, write_outputs

log = logging.getLogger("rlkit")
DEFAULTS = (300, 32, 32)  # budget (metric calls), reflection rows, validation rows
SMOKE_DEFAULTS = (20, 4, 4)


def optimize_prompt(recipe_path: str | Path, *, out: str | Path, reflection_endpoint: str, reflection_model: str,
                    reflection_key_env: str | None = None, reflection_temperature: float = 1.0,
                    reflection_max_tokens: int = 2048, reflection_timeout: float = 120.0, reflection_retries: int = 3,
                    budget: int | None = None, limit_train: int | None = None, limit_val: int | None = None,
                    limit_eval: int | None = None,
                    minibatch: int = 3, seed: int = 0, overrides: list[str] | None = None, smoke: bool = False,
                    overwrite: bool = False) -> dict[str, Any]:
    """Optimise the recipe's system prompt with gepa; write the prompt file and its JSON; return the summary.

    Defaults: 32 reflection rows, 32 validation rows, a budget of 300 metric calls; with ``smoke`` (whose train
    split has 32 rows) 4, 4 and 20.
    """
    from rlkit.optimize import reflection as reflect
    from rlkit.recipe import load_recipe

    defaults = SMOKE_DEFAULTS if smoke else DEFAULTS
    budget, limit_train, limit_val = (given if given is not None else default for given, default in
                                      zip((budget, limit_train, limit_val), defaults, strict=True))
    out = check_out(out, overwrite)  # before anything loads: never a file rlkit did not write
    gepa = _import_gepa()
    recipe = load_recipe(recipe_path, overrides, smoke=smoke)
    task, base_prompt, shots = _prompt_of(recipe, str(recipe_path))
    if minibatch > limit_train:
        raise UserError(f"--minibatch {minibatch}: larger than --limit-train {limit_train}")
    if budget < limit_val + 2 * minibatch:
        raise UserError(f"--budget {budget}: the recipe's prompt on the validation rows alone takes {limit_val} metric "
                        f"calls and one proposal {2 * minibatch} more; give at least {limit_val + 2 * minibatch}")
    if reflection_key_env is not None and os.environ.get(reflection_key_env) is None:
        raise UserError(f"--reflection-key-env {reflection_key_env}: the environment variable is not set; export the "
                        "reflection model's API key there")
    settings = reflect.settings(reflection_endpoint, reflection_model, api_key_env=reflection_key_env,
                                temperature=reflection_temperature, max_tokens=reflection_max_tokens,
                                timeout=reflection_timeout, retries=reflection_retries)
    train, val, held_out = _rows(recipe, limit_train, limit_val, limit_eval)
    from rlkit.rewards.judge_client import preflight

    preflight(settings)  # a dead endpoint, a wrong model or key: one line now, not after the model loads

    from rlkit.inference.load import load_for_generation
    from rlkit.optimize.adapter import COMPONENT, PromptAdapter
    from rlkit.rewards import RewardSet

    lm, tokenizer, label = load_for_generation(recipe, None, None)
    adapter = PromptAdapter(task, shots, lm, tokenizer, RewardSet(recipe.rewards),
                            chat_template_kwargs=recipe.model.chat_template_kwargs,
                            max_new_tokens=recipe.eval.max_new_tokens, batch_size=recipe.eval.batch_size)
    reflection = reflect.Reflection(settings)
    history = History()
    log.info("optimize-prompt: gepa %s, %d train + %d validation rows, budget %d metric calls, reflection model %s",
             _version("gepa"), len(train), len(val), budget, reflection_model)
    started = time.perf_counter()
    with safety.hold(out):
        result = gepa.optimize(
            seed_candidate={COMPONENT: base_prompt}, trainset=train, valset=val, adapter=adapter,
            reflection_lm=reflection, max_metric_calls=budget, stop_callbacks=[reflection.stop],
            reflection_minibatch_size=minibatch, candidate_selection_strategy="pareto",
            # Rewards are not on a 0..1 scale (1.0 + 0.1 format, say): never skip a minibatch as "perfect".
            # No evaluation cache: gepa 0.1.4 keys it by (prompt, row position), so with a separate valset the
            # validation score of a prompt reuses its minibatch scores of *train* rows at the same positions
            # (gepa-ai/gepa#424, fixed by #425 after 0.1.4). Greedy scores are the same when asked again anyway.
            skip_perfect_score=False, cache_evaluation=False, seed=seed, logger=GepaLog(), callbacks=[history],
            raise_on_exception=True, display_progress_bar=False, track_best_outputs=False)
        if reflection.error is not None:
            raise UserError(f"{reflection.error}; stopped after {result.total_metric_calls} metric calls, nothing "
                            f"written")
        optimise_seconds = time.perf_counter() - started
        best = result.best_candidate[COMPONENT].strip()
        log.info("optimize-prompt: evaluating the recipe's prompt and the best one on %d eval rows", len(held_out))
        base_eval = adapter.run(held_out, base_prompt)
        best_eval = base_eval if best == base_prompt else adapter.run(held_out, best)
        summary = summary_json(
            recipe=recipe, recipe_path=str(recipe_path), label=label, out=out, base_prompt=base_prompt, best=best,
            shots=shots, result=result, history=history, base_eval=base_eval, best_eval=best_eval,
            settings=settings, reflection=reflection, adapter=adapter, budget=budget, minibatch=minibatch, seed=seed,
            train=len(train), val=len(val), seconds=(optimise_seconds, time.perf_counter() - started),
            overrides=list(overrides or []), smoke=smoke)
        write_outputs(out, summary)
    return summary


def _import_gepa() -> Any:
    try:
        import gepa
    except ImportError:
        raise UserError("optimize-prompt needs the gepa package: pip install 'rlkit[gepa]'") from None
    return gepa


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def _prompt_of(recipe: Any, source: str) -> tuple[Any, str, str | None]:
    """(task, the recipe's system prompt text, whose worked turns follow it) for a recipe gepa can optimise."""
    from rlkit.data import get_task, resolve_prompt

    task = get_task(recipe.data.task)
    if recipe.env is not None:
        raise UserError(f"{source}: env: {recipe.env.name}: optimize-prompt evaluates plain generations; an agent's "
                        "prompt needs episodes with its tools, which it does not run yet")
    if not getattr(task, "CUSTOM_PROMPTS", False):
        raise UserError(f"{source}: data.task: task {recipe.data.task!r} takes no prompt text; optimize-prompt works "
                        "on tasks whose data.prompt may be a file (gsm8k, qa, multihop_rag)")
    if not recipe.rewards:
        raise UserError(f"{source}: rewards: none; optimize-prompt scores prompts with the recipe's rewards")
    if recipe.data.eval is None:
        raise UserError(f"{source}: data.eval: missing; the optimised prompt is evaluated on the eval split")
    if recipe.data.prompt == "mix":
        raise UserError(f"{source}: data.prompt: mix picks a prompt form per row; optimise one form, e.g. "
                        "--set data.prompt=short")
    name = resolve_prompt(task, recipe.data.prompt)
    text = task.PROMPTS.get(name, name)
    if not text.strip():
        raise UserError(f"{source}: data.prompt: {recipe.data.prompt} has no system line to optimise; start from "
                        "one, e.g. --set data.prompt='Answer with the calculation, then #### N.'")
    shots = recipe.data.shots
    if shots is None and recipe.data.prompt in getattr(task, "SHOTS", {}):
        shots = recipe.data.prompt  # the variant's worked turns stay with the optimised system line
    return task, text, shots


def _rows(recipe: Any, limit_train: int, limit_val: int, limit_eval: int | None) -> tuple[list, list, list]:
    """(reflection rows, validation rows) from the train split, and the eval rows, as plain dicts."""
    from rlkit.data import load_rows

    want = limit_train + limit_val
    source = recipe.data.train
    ds = load_rows(recipe.data.task, source.model_copy(update={"limit": min(source.limit or want, want)}))
    if len(ds) < want:
        raise UserError(f"data.train: {len(ds)} rows; --limit-train {limit_train} and --limit-val {limit_val} take "
                        f"{want} (disjoint)")
    rows = ds.to_list()
    eval_source = recipe.data.eval.model_copy(update={"limit": limit_eval}) if limit_eval else recipe.data.eval
    return rows[:limit_train], rows[limit_train:], load_rows(recipe.data.task, eval_source).to_list()


class GepaLog:
    """gepa's logger (``log(message)``): its iteration messages go to rlkit's log at debug level."""

    def log(self, message: str) -> None:
        log.debug("gepa: %s", message)


class History:
    """gepa callbacks: each proposal (its text, accepted or not, its minibatch scores) and each validation score,
    with the metric calls used so far."""

    def __init__(self) -> None:
        self.used = 0
        self.proposed = ""
        self.proposals: list[dict[str, Any]] = []
        self.validations: list[dict[str, Any]] = []

    def on_budget_updated(self, event: dict[str, Any]) -> None:
        self.used = event["metric_calls_used"]

    def on_proposal_end(self, event: dict[str, Any]) -> None:
        from rlkit.optimize.adapter import COMPONENT

        self.proposed = event["new_instructions"].get(COMPONENT, "")

    def on_candidate_rejected(self, event: dict[str, Any]) -> None:
        self.proposals.append({"iteration": event["iteration"], "accepted": False,
                               "minibatch_before": round(event["old_score"], 6),
                               "minibatch_after": round(event["new_score"], 6), "metric_calls": self.used,
                               "prompt": self.proposed})
        log.info("optimize-prompt: iteration %d: proposal scored %g on the minibatch, not above %g: rejected",
                 event["iteration"], event["new_score"], event["old_score"])

    def on_candidate_accepted(self, event: dict[str, Any]) -> None:
        self.proposals.append({"iteration": event["iteration"], "accepted": True,
                               "candidate": event["new_candidate_idx"], "minibatch_after": round(event["new_score"], 6),
                               "metric_calls": self.used, "prompt": self.proposed})

    def on_valset_evaluated(self, event: dict[str, Any]) -> None:
        self.validations.append({"iteration": event["iteration"], "candidate": event["candidate_idx"],
                                 "val_score": event["average_score"], "best": event["is_best_program"],
                                 "metric_calls": self.used or event["num_examples_evaluated"]})
        log.info("optimize-prompt: candidate %d: validation score %.3f%s (%d metric calls)", event["candidate_idx"],
                 event["average_score"], " (best so far)" if event["is_best_program"] else "",
                 self.used or event["num_examples_evaluated"])
