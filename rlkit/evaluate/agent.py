"""``rlkit eval`` of an agent recipe (one with ``env:``): greedy rollouts on the eval split, scored like
``rlkit analyze``; each trajectory is appended next to the results as its episode ends."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit import safety
from rlkit.agents.policies import make_policy
from rlkit.agents.rollout import TRAJECTORY_KEYS, episode_rows, in_row_order, play
from rlkit.evaluate.results import default_out, journal, write_results
from rlkit.evaluate.sampled import sample_agent
from rlkit.evaluate.served import Served, endpoint_of

if TYPE_CHECKING:
    from rlkit.recipe import Recipe


def evaluate_agent(recipe: Recipe, run_dir: Path | None, model: str | None, *, limit: int | None,
                   out: str | Path | None, show_progress: bool = True, resume: bool = False,
                   samples: int | None = None, temperature: float = 1.0,
                   served: Served | None = None, backend: str = "hf") -> dict[str, Any]:
    """Accuracy, EM, F1 and evidence recall, overall and per question type; the results JSON's path."""
    from rlkit.analyze import analyze
    from rlkit.data import env_factory

    rows, make_env = episode_rows(recipe, "eval", limit), env_factory(recipe)
    url, served = endpoint_of(recipe, run_dir, model), served or Served()
    policy, label = make_policy(recipe, run_dir, model=None if url else model, endpoint=url, api_key=served.api_key,
                                served_model=served.served_model, timeout=served.timeout, retries=served.retries,
                                backend=backend)
    started = time.time()
    results_path = Path(out) if out else default_out(recipe.name, run_dir, label)
    with safety.hold(results_path), journal(results_path, ".trajectories.jsonl", resume, TRAJECTORY_KEYS) as sink:
        play(recipe, rows, make_env, policy, 30.0, served.concurrency, show_progress, sink)
        sink.close()
        trajectories = sink.path
        records = in_row_order(trajectories, rows)
        report = analyze(trajectories)
        overall = report["answers"]["all"]
        results = {"recipe": recipe.name, "model": label, "task": recipe.data.task, "n": len(records),
                   "accuracy": overall["accuracy"],
                   "interval": overall["intervals"].get("accuracy"), "em": overall["em"], "f1": overall["f1"],
                   "evidence_recall": overall.get("evidence_recall"),
                   "by_question_type": report["answers"], "seconds": round(time.time() - started, 2),
                   "trajectories": str(trajectories)}
        if samples:  # K episodes per problem, played together (rlkit.evaluate.sampled)
            results["samples"] = sample_agent(recipe, policy, rows, make_env, results_path, k=samples,
                                              temperature=temperature, resume=resume, show_progress=show_progress)
        return write_results(results, results_path)
