"""``rlkit pairs``: on-policy preference pairs for DPO from the model's own samples.

For each prompt of the recipe's ``pairs.prompts`` the model samples K completions; the recipe's
``rewards:`` score them (TRL's calling convention, with the row's columns such as the gold
``answer``); the best and the worst make a (chosen, rejected) pair when their reward gap exceeds
``pairs.min_gap``. Prompts whose samples all score alike teach DPO nothing and are skipped.

The output is JSONL with ``prompt``/``chosen``/``rejected`` (chat messages) plus the two rewards and
the row's other columns, which a dpo recipe reads as ``data.train.path``.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rlkit import jsonl, safety
from rlkit.errors import UserError

log = logging.getLogger("rlkit")


def build_pairs(
    recipe_path: str | Path,
    model: str,
    out: str | Path,
    *,
    samples: int | None = None,
    min_gap: float | None = None,
    limit: int | None = None,
    smoke: bool = False,
    overrides: list[str] | None = None,
    overwrite: bool = False,
    resume: bool = False,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Sample, score and pair; appends each pair to ``out`` as its prompt is scored; returns a summary.

    ``resume`` keeps the pairs a killed run wrote and samples only the prompts without one.
    """
    import torch

    from rlkit.data import load_prompt_rows
    from rlkit.inference.generate import generate
    from rlkit.inference.load import load_for_generation
    from rlkit.recipe import load_recipe
    from rlkit.rewards import RewardSet

    out = Path(out)
    if resume and overwrite:
        raise UserError("--resume continues --out and --overwrite replaces it; choose one")
    safety.check_target(out, "--out")
    if out.exists() and not resume:
        if not overwrite:
            raise UserError(f"{out}: already exists; pass --resume to continue it or --overwrite to replace it")
        safety.check_replaceable_file(out, "--out", ("prompt", "chosen", "rejected"))
    recipe = load_recipe(recipe_path, overrides, smoke=smoke)
    if recipe.pairs is None:
        raise UserError(f"{recipe_path}: no `pairs:` section (prompts to sample from); see recipes/gsm8k_dpo.yaml")
    spec = recipe.pairs.model_copy(update={k: v for k, v in (("samples", samples), ("min_gap", min_gap))
                                           if v is not None})
    if spec.samples < 2:
        raise UserError(f"--samples {spec.samples}: a pair needs at least 2 samples per prompt")
    source = spec.prompts.model_copy(update={"limit": limit}) if limit else spec.prompts
    rows = load_prompt_rows(recipe, source)
    rewards = RewardSet(recipe.rewards)

    with safety.hold(out):
        if out.exists() and not resume:
            out.unlink()  # checked above: a pairs file rlkit wrote, and --overwrite asked for it
        with safety.JsonlAppender(out, resume=resume, keys=("prompt", "chosen", "rejected")) as sink:
            written = Counter(json.dumps(p["prompt"], sort_keys=True) for p in sink.done)
            # A prompt whose pair is in the file is done; one that tied before is sampled again.
            todo = [i for i, p in enumerate(rows["prompt"]) if not _take(written, json.dumps(p, sort_keys=True))]
            if sink.done:
                log.info("%s: %d pairs already written; sampling the other %d prompts", out, len(sink.done),
                         len(todo))
            rows = rows.select(todo)
            lm, tokenizer, label = load_for_generation(recipe, None, model)
            torch.manual_seed(spec.seed)
            started = time.time()
            totals: list[float] = []
            tied = 0

            def write_batch(first: int, texts: list[str], _cut: list[bool]) -> None:  # first: the batch's first prompt
                nonlocal tied
                batch = rows.select(range(first, first + len(texts) // spec.samples))
                pairs, scores, ties = _pairs(batch, texts, spec.samples, spec.min_gap, rewards)
                for pair in pairs:
                    sink.write(pair)
                totals.extend(scores)
                tied += ties

            generate(lm, tokenizer, list(rows["prompt"]), recipe.model.chat_template_kwargs,
                     max_new_tokens=spec.max_new_tokens or recipe.eval.max_new_tokens, batch_size=spec.batch_size,
                     num_return_sequences=spec.samples, temperature=spec.temperature, show_progress=show_progress,
                     description=f"sampling {spec.samples} per prompt", on_batch=write_batch)
            seconds = time.time() - started
    written_now = len(jsonl.read_records(out))
    summary = {
        "recipe": recipe.name, "model": label, "out": str(out), "prompts": len(rows), "samples": spec.samples,
        "pairs": written_now, "min_gap": spec.min_gap, "tied_prompts": tied,
        "mean_reward": sum(totals) / len(totals) if totals else float("nan"), "seconds": round(seconds, 2),
    }
    if not written_now:
        log.warning("no prompt had a reward gap above %s: %s is empty", spec.min_gap, out)
    return summary


def _take(counter: Counter, key: str) -> bool:
    if counter[key] > 0:
        counter[key] -= 1
        return True
    return False


def _pairs(rows: Any, texts: list[str], k: int, min_gap: float, rewards: Any) -> tuple[list[dict], list[float], int]:
    """(pairs, every sample's total reward, number of prompts whose samples all scored the same)."""
    prompts = [p for p in rows["prompt"] for _ in range(k)]
    columns = {c: [v for v in rows[c] for _ in range(k)] for c in rows.column_names if c != "prompt"}
    completions = [[{"role": "assistant", "content": t}] if isinstance(p, list) else t
                   for p, t in zip(prompts, texts, strict=True)]
    totals, _ = rewards(prompts, completions, **columns)
    pairs, tied = [], 0
    for i, row in enumerate(rows):
        group = list(range(i * k, (i + 1) * k))
        best = max(group, key=lambda j: totals[j])
        worst = min(group, key=lambda j: totals[j])
        if totals[best] == totals[worst]:
            tied += 1
        if totals[best] - totals[worst] <= min_gap:
            continue
        pairs.append({**{c: v for c, v in row.items() if c != "prompt"}, "prompt": row["prompt"],
                      "chosen": completions[best], "rejected": completions[worst],
                      "chosen_reward": totals[best], "rejected_reward": totals[worst]})
    return pairs, totals, tied


def print_summary(summary: dict[str, Any]) -> None:
    """The summary ``build_pairs`` returns, as a table, and where the pairs are."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"pairs: {summary['recipe']} ({summary['model']})", show_header=False)
    for key in ("prompts", "samples", "pairs", "tied_prompts", "mean_reward", "seconds"):
        value = summary[key]
        table.add_row(key.replace("_", " "), f"{value:.3f}" if isinstance(value, float) else str(value))
    console = Console()
    console.print(table)
    console.print(f"pairs written to {summary['out']}")
