"""``rlkit pairs``: on-policy preference pairs for DPO from the model's own samples.

For each prompt of the recipe's ``pairs.prompts`` the model samples K completions; the recipe's
``rewards:`` score them (TRL's calling convention, with the row's columns such as the gold
``answer``); the best and the worst make a (chosen, rejected) pair when their reward gap exceeds
``pairs.min_gap``. Prompts whose samples all score alike teach DPO nothing and are skipped.

The output is JSONL with ``prompt``/``chosen``/``rejected`` (chat messages) plus the two rewards and
the row's other columns, which a dpo recipe reads as ``data.train.path``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from rlkit import runs
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
    show_progress: bool = True,
) -> dict[str, Any]:
    """Sample, score and pair; writes ``out`` and returns a summary."""
    import torch

    from rlkit.data import load_prompt_rows
    from rlkit.evaluate import generate, load_for_eval
    from rlkit.recipe import load_recipe
    from rlkit.rewards import RewardSet

    out = Path(out)
    if out.exists() and not overwrite:
        raise UserError(f"{out}: already exists; pass --overwrite to replace it")
    recipe = load_recipe(recipe_path, overrides, smoke=smoke, validate_trainer=False)
    if recipe.pairs is None:
        raise UserError(f"{recipe_path}: no `pairs:` section (prompts to sample from); see recipes/gsm8k_dpo.yaml")
    spec = recipe.pairs.model_copy(update={k: v for k, v in (("samples", samples), ("min_gap", min_gap))
                                           if v is not None})
    if spec.samples < 2:
        raise UserError(f"--samples {spec.samples}: a pair needs at least 2 samples per prompt")
    source = spec.prompts.model_copy(update={"limit": limit}) if limit else spec.prompts
    rows = load_prompt_rows(recipe.data.task, source)
    rewards = RewardSet(recipe.rewards)

    lm, tokenizer, label = load_for_eval(recipe, None, model)
    torch.manual_seed(spec.seed)
    started = time.time()
    texts = generate(lm, tokenizer, list(rows["prompt"]), recipe.model.chat_template_kwargs,
                     max_new_tokens=spec.max_new_tokens or recipe.eval.max_new_tokens, batch_size=spec.batch_size,
                     num_return_sequences=spec.samples, temperature=spec.temperature, show_progress=show_progress,
                     description=f"sampling {spec.samples} per prompt")
    seconds = time.time() - started
    pairs, totals, tied = _pairs(rows, texts, spec.samples, spec.min_gap, rewards)

    runs.write_jsonl(pairs, out)  # never a half-written pairs file
    summary = {
        "recipe": recipe.name, "model": label, "out": str(out), "prompts": len(rows), "samples": spec.samples,
        "pairs": len(pairs), "min_gap": spec.min_gap, "tied_prompts": tied,
        "mean_reward": sum(totals) / len(totals), "seconds": round(seconds, 2),
    }
    if not pairs:
        log.warning("no prompt had a reward gap above %s: %s is empty", spec.min_gap, out)
    return summary


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
