"""Agent eval during training: every ``eval.agent_every`` steps, a GRPO run with an ``env:`` scores its agent
on the first ``eval.agent_limit`` held-out questions (greedy, through the same episode engine as
``rlkit eval``), appends the scores to ``agent_eval.jsonl``, logs ``agent_eval/f1``, and keeps the best
adapter in ``best/`` with ``best.json`` saying which step and why (the highest held-out F1; a tie keeps the
earlier step). The model training starts from is scored too, as step 0: when no update beats it, ``best/`` is
that starting adapter and ``best.json`` says so. Small-model GRPO often peaks early and then collapses:
``best/`` is that peak. F1 and EM carry
their 95% intervals (bootstrap for F1, Wilson for EM, which is right or wrong) in both files: on a few questions,
two steps' F1 often differ by less than an interval's width.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlkit.recipe import Recipe


def agent_eval_callback(recipe: Recipe, run_dir: Path, tokenizer: Any, *, main: bool = True) -> Any:
    """A TrainerCallback that scores the agent every ``recipe.eval.agent_every`` steps (and at the end)."""
    from transformers import TrainerCallback

    from rlkit.agents.rollout import episode_rows
    from rlkit.data import env_factory

    every, make_env = recipe.eval.agent_every, env_factory(recipe)
    rows = episode_rows(recipe, "eval", recipe.eval.agent_limit)
    state_ = {"best": None, "last": -1}
    if (run_dir / "best.json").is_file():  # a resumed run: later steps must beat what was kept before
        state_["best"] = json.loads((run_dir / "best.json").read_text())

    def score(model: Any, step: int) -> None:
        import torch

        from rlkit.agents.engine import run_episodes
        from rlkit.agents.hf import HFPolicy
        from rlkit.agents.scoring import score_episodes

        started, training = time.time(), model.training
        model.eval()
        policy = HFPolicy(model, tokenizer, chat_template_kwargs=recipe.model.chat_template_kwargs,
                          max_new_tokens=recipe.eval.max_new_tokens, temperature=0.0,
                          batch_size=recipe.eval.batch_size)
        with torch.no_grad():
            episodes = run_episodes(rows, make_env, policy, max_turns=recipe.env.max_turns, show_progress=False)
        model.train(training)
        entry = scores(score_episodes(episodes, recipe), step, time.time() - started)
        state_["last"] = step
        if not main:
            return
        with (run_dir / "agent_eval.jsonl").open("a") as f:
            f.write(json.dumps(entry) + "\n")
        best = state_["best"]
        if best is None or entry["f1"] > best["f1"]:
            state_["best"] = {**entry, "why": why(entry, best)}
            # With a KL reference (beta > 0) from init_from, TRL adds a frozen "ref" copy of the starting adapter,
            # and PEFT saves every adapter: best/ is the trained one alone, as the run's adapter/ is.
            adapters = getattr(model, "peft_config", None) or {}
            only = {"selected_adapters": [model.active_adapter]} if len(adapters) > 1 else {}
            model.save_pretrained(run_dir / "best", **only)
            tokenizer.save_pretrained(run_dir / "best")  # `rlkit eval --model RUN/best` loads it from there
            (run_dir / "best.json").write_text(json.dumps(state_["best"], indent=2) + "\n")

    class AgentEval(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if state.global_step == 0:
                score(model, 0)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % every == 0:
                score(model, state.global_step)
                control.should_log = True

        def on_train_end(self, args, state, control, model=None, **kwargs):
            if state_["last"] != state.global_step:
                score(model, state.global_step)
            best = state_["best"]
            if main and best is not None and best["step"] == 0 and state.global_step > 0:
                note = ("; no training step scored higher than the start (step 0, before any update), so `best/` "
                        "holds the adapter training began from")
                (run_dir / "best.json").write_text(json.dumps({**best, "why": best["why"] + note}, indent=2) + "\n")

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs is not None and state_["last"] == state.global_step and main:
                last = json.loads((run_dir / "agent_eval.jsonl").read_text().splitlines()[-1])
                logs.update({"agent_eval/f1": last["f1"], "agent_eval/em": last["em"]})

    return AgentEval()


def scores(records: list[dict[str, Any]], step: int, seconds: float) -> dict[str, Any]:
    """One ``agent_eval.jsonl`` row: mean F1 and EM of the scored episodes, each with its 95% interval
    (``f1_interval``: bootstrap; ``em_interval``: Wilson), searches per episode and the eval's seconds."""
    from rlkit.stats import bootstrap, wilson

    n = len(records)
    f1 = [float(r["metrics"].get("f1") or 0.0) for r in records]
    em = [float(r["metrics"].get("em") or 0.0) for r in records]
    return {"step": step, "n": n, "f1": round(sum(f1) / max(n, 1), 4),
            "f1_interval": [round(v, 4) for v in bootstrap(f1)], "em": round(sum(em) / max(n, 1), 4),
            "em_interval": [round(v, 4) for v in wilson(round(sum(em)), n)],
            "searches": round(sum(len(r["tool_calls"]) for r in records) / max(n, 1), 3), "seconds": round(seconds, 2)}


def why(entry: dict[str, Any], best: dict[str, Any] | None) -> str:
    """best.json's reason: this step's F1 and EM with their intervals, and the F1 of the step it displaced."""
    return (f"the highest held-out F1 ({_show(entry, 'f1')}; EM {_show(entry, 'em')}; greedy, n={entry['n']}) "
            "of the agent evals so far" + (" (the model before any update)" if entry["step"] == 0 else "")
            + (f"; step {best['step']} had F1 {_show(best, 'f1')}" if best else ""))


def _show(entry: dict[str, Any], key: str) -> str:
    from rlkit.stats import show_accuracy

    return show_accuracy(entry[key], bounds=entry.get(f"{key}_interval"))
