"""``rlkit eval --samples K [--temperature T]``: K sampled answers per problem, next to greedy pass@1.

Reports pass@1 (the mean correctness of the samples), pass@K (Chen et al.'s unbiased estimator; with
exactly K samples, whether any is right), avg@K and maj@K (the most common extracted answer, right or
not), each with its 95% interval over problems (:mod:`rlkit.stats`).

Batched: a plain task's K samples of a prompt come from one ``generate`` call
(``num_return_sequences=K``, the prompt's prefix computed once), with ``eval.batch_size // K`` prompts
per batch so a batch holds as many rows as a greedy one. A tool agent plays K copies of each episode,
and the local policy batches the live episodes' turns, so K episodes cost about one batched pass per
turn, not K. Sampling is plain (no top-k/top-p) at ``T`` (default 1.0) and seeded (torch seed 0) so a
rerun draws the same samples. Each problem's samples are appended to ``<results>.samples.jsonl``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit import jsonl
from rlkit.errors import UserError
from rlkit.evaluate.results import journal
from rlkit.stats import sampled

if TYPE_CHECKING:
    from rlkit.recipe import Recipe

SEED = 0
SAMPLE_KEYS = ("prompt", "samples")


def check(samples: int | None, temperature: float | None) -> None:
    if samples is None:
        if temperature is not None:
            raise UserError("--temperature applies to --samples K; add --samples (e.g. --samples 8)")
        return
    if samples < 1:
        raise UserError(f"--samples {samples}: give K >= 1 samples per problem")
    if temperature is not None and temperature <= 0:
        raise UserError(f"--temperature {temperature:g}: sampling needs T > 0 (greedy pass@1 is always reported)")


def sample_task(recipe: Recipe, lm: Any, tokenizer: Any, task: Any, rows: Any, path: Path, *, k: int,
                temperature: float, resume: bool, show_progress: bool) -> dict[str, Any]:
    """K completions per prompt of a scored task, checked by the task's answer rule."""
    import torch

    from rlkit.inference.generate import generate
    from rlkit.rewards.math import extract_answer

    with journal(path, ".samples.jsonl", resume, SAMPLE_KEYS) as sink:
        todo = rows.select(range(len(sink.done), len(rows)))

        def write_batch(first: int, completions: list[str], _cut: list[bool]) -> None:
            n = len(completions) // k
            batch = todo.select([first + i for i in range(n) for _ in range(k)])
            scores = task.score(completions, batch)
            for i in range(n):
                row = batch[i * k]
                mine = completions[i * k:(i + 1) * k]
                sink.write({"prompt": row["prompt"][-1]["content"], "gold": row["answer"],
                            "samples": [{"prediction": extract_answer(c), "correct": bool(s), "completion": c}
                                        for c, s in zip(mine, scores[i * k:(i + 1) * k], strict=True)]})

        torch.manual_seed(SEED)
        started = time.time()
        generate(lm, tokenizer, list(todo["prompt"]), recipe.model.chat_template_kwargs,
                 max_new_tokens=recipe.eval.max_new_tokens, batch_size=max(1, recipe.eval.batch_size // k),
                 num_return_sequences=k, temperature=temperature, show_progress=show_progress,
                 description=f"sampling {k} per prompt", on_batch=write_batch)
        seconds = time.time() - started
        records = jsonl.read_records(sink.path)
    return summary(records, k, temperature, seconds, sink.path)


def sample_agent(recipe: Recipe, policy: Any, rows: list[dict[str, Any]], make_env: Any, path: Path, *, k: int,
                 temperature: float, resume: bool, show_progress: bool) -> dict[str, Any]:
    """K episodes per problem (copies of the row, ids ``<id>#<j>``), played together at temperature T."""
    from rlkit.agents.rollout import TRAJECTORY_KEYS, in_row_order, play

    if not hasattr(policy, "temperature"):
        raise UserError("--samples needs a policy that samples at a temperature (the local hf model or an endpoint)")
    copies = [{**row, "id": f"{row.get('id', i)}#{j}"} for i, row in enumerate(rows) for j in range(k)]
    greedy_temperature, policy.temperature = policy.temperature, temperature
    try:
        import torch

        torch.manual_seed(SEED)
        started = time.time()
        with journal(path, ".samples.jsonl", resume, TRAJECTORY_KEYS) as sink:
            play(recipe, copies, make_env, policy, 30.0, 8, show_progress, sink)
            sink.close()
            episodes = in_row_order(sink.path, copies)
        seconds = time.time() - started
    finally:
        policy.temperature = greedy_temperature
    records = [{"prompt": None, "samples": [
        {"prediction": e.get("prediction"), "correct": bool((e.get("metrics") or {}).get("accuracy"))}
        for e in episodes[i * k:(i + 1) * k]]} for i in range(len(rows))]
    return summary(records, k, temperature, seconds, sink.path)


def summary(records: list[dict[str, Any]], k: int, temperature: float, seconds: float, path: Path) -> dict[str, Any]:
    answers = [[s["prediction"] for s in r["samples"]] for r in records]
    correct = [[s["correct"] for s in r["samples"]] for r in records]
    if any(len(c) != k for c in correct):
        raise UserError(f"{path}: some problems have other than {k} samples (an earlier eval with another --samples?); "
                        "rerun without --resume")
    return {"k": k, "temperature": temperature, "seed": SEED, "n": len(records), "seconds": round(seconds, 2),
            "metrics": sampled(answers, correct), "samples": str(path)}


def print_sampled(results: dict[str, Any], console: Any) -> None:
    """The sampled metrics next to greedy pass@1, each with its 95% interval."""
    from rich.table import Table

    from rlkit.stats import show, show_accuracy

    s = results["samples"]
    table = Table(title=f"sampled: {s['k']} per problem at temperature {s['temperature']:g} "
                        f"(95% intervals over {s['n']} problems)")
    for col in ("metric", "value [95%]", "seconds"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    table.add_row("greedy pass@1", show_accuracy(results["accuracy"], results["n"], results.get("interval")),
                  f"{results['seconds']:.1f}")
    for i, (name, value) in enumerate(s["metrics"].items()):
        table.add_row(name, show(value), f"{s['seconds']:.1f}" if i == 0 else "")
    console.print(table)
    console.print(f"samples: {s['samples']}")
