"""Learnability: can GRPO learn anything from this model on these prompts?

K completions for each of N train prompts, sampled with the recipe's model and sampling settings (the
local model through rlkit's rollout engine, or a served model with ``--endpoint``; tool recipes run
whole episodes with the environment), scored with the recipe's rewards. GRPO's advantage is a
completion's reward minus its group's mean: a group whose K rewards are all equal teaches nothing.
A completion *passes* when it earns as much as the gold answer does (the reward card's best form).

No-go when fewer than ``MIN_SIGNAL`` of the prompts have any reward variance. ``--write-filtered FILE``
writes the prompts with signal, in the task's own row format, for ``--set data.train.path=FILE``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from rlkit.doctor import Check, Context

F = "learnability"
MIN_SIGNAL = 0.25  # share of prompts whose group has reward variance
DEFAULT_SAMPLES = 8


class _NoTools:
    """The environment of a recipe without tools: the episode is one assistant turn."""

    def reset(self, **row: Any) -> None:
        return None


def checks(ctx: Context, *, samples: int | None, endpoint: str | None = None, api_key: str | None = None,
           write_filtered: str | Path | None = None) -> tuple[list[Check], dict[str, list[dict[str, Any]]]]:
    recipe = ctx.recipe
    if samples is None:
        samples = 0 if ctx.smoke else DEFAULT_SAMPLES
    if samples == 0:
        return [Check(F, "probe", "skip", "not sampled (--samples 0, the default with --smoke)",
                      "rlkit doctor RECIPE --samples 8 --limit 16")], {}
    if not recipe.rewards:
        return [Check(F, "probe", "skip", f"{recipe.algorithm} recipes train without rewards: nothing to probe")], {}
    rows = ctx.scored_rows
    if rows is None:
        return [Check(F, "probe", "skip", "the task has no prompt rows to sample")], {}
    from rlkit.agents.engine import run_episodes
    from rlkit.agents.policies import make_policy
    from rlkit.agents.scoring import score_episodes
    from rlkit.doctor.rewards import gold_totals

    row_list = rows.to_list()
    temperature = float(ctx.setting("temperature", 1.0) or 1.0)
    max_new = ctx.setting("max_completion_length", None) or recipe.eval.max_new_tokens
    if recipe.env is not None:
        from rlkit.data import env_factory

        make_env, max_turns = env_factory(recipe), recipe.env.max_turns
    else:
        make_env, max_turns = _NoTools, 1
    from rlkit.errors import UserError

    try:
        # The policy training starts from: the init_from adapter on its base, else the base model.
        policy, label = make_policy(recipe, None, model=None if endpoint else recipe.init_from, endpoint=endpoint,
                                    api_key=api_key, temperature=temperature, max_new_tokens=max_new)
    except UserError as e:
        if endpoint:
            raise
        return [Check(F, "probe", "skip", f"cannot load the model here: {e}",
                      "run where the model is cached, or sample a served copy with --endpoint URL")], {}
    from transformers import set_seed

    set_seed(int(ctx.setting("seed", 42)))  # the trainer's seed: the same samples on every run, whatever ran before
    episodes = run_episodes([r for r in row_list for _ in range(samples)], make_env, policy, max_turns=max_turns,
                            show_progress=False)
    rewards = [r["reward"] for r in score_episodes(episodes, recipe)]
    gold = gold_totals(recipe, rows)
    groups = [rewards[i * samples:(i + 1) * samples] for i in range(len(row_list))]
    stats = summarize(groups, gold)
    table = [{"prompt": i, "gold": round(g, 4), "mean": round(statistics.fmean(grp), 4),
              "std": round(statistics.pstdev(grp), 4), "passes": sum(v >= g - 1e-9 for v in grp)}
             for i, (grp, g) in enumerate(zip(groups, gold, strict=True))]
    evidence = (f"{label}, {len(groups)} prompts x {samples} samples at temperature {temperature:g}: "
                f"pass@1 {stats['pass@1']:.2f}, pass@{samples} {stats['pass@k']:.2f}, mean reward "
                f"{stats['mean_reward']:.3f}, zero-variance groups {stats['zero_variance']:.0%}")
    out = []
    if stats["signal"] < MIN_SIGNAL:
        out.append(Check(F, "probe", "fail", evidence + f": under {MIN_SIGNAL:.0%} of prompts give GRPO any signal",
                         "easier prompts, a short SFT warm-up, a higher temperature, more samples, or a "
                         "partial-credit reward", data=stats))
    elif stats["pass@1"] > 0.95:
        out.append(Check(F, "probe", "warn", evidence + ": the model already solves almost everything",
                         "harder prompts (--write-filtered keeps the ones with signal)", data=stats))
    else:
        out.append(Check(F, "probe", "ok", evidence, data=stats))
    if write_filtered is not None:
        out.append(_write_filtered(ctx, groups, Path(write_filtered)))
    return out, {"learnability": table}


def summarize(groups: list[list[float]], gold: list[float]) -> dict[str, float]:
    """pass@1 (mean pass rate), pass@K (any pass), mean reward, zero-variance share, signal share."""
    n = len(groups)
    passes = [[v >= g - 1e-9 for v in grp] for grp, g in zip(groups, gold, strict=True)]
    zero = sum(max(grp) == min(grp) for grp in groups)
    return {"prompts": n, "samples": len(groups[0]) if groups else 0,
            "pass@1": round(sum(sum(p) / len(p) for p in passes) / n, 4),
            "pass@k": round(sum(any(p) for p in passes) / n, 4),
            "mean_reward": round(statistics.fmean(v for grp in groups for v in grp), 4),
            "zero_variance": round(zero / n, 4), "signal": round(1 - zero / n, 4)}


def _write_filtered(ctx: Context, groups: list[list[float]], path: Path) -> Check:
    from rlkit import runs

    if ctx.recipe.algorithm != "grpo":
        return Check(F, "filtered data", "skip", "--write-filtered writes GRPO train prompts; this recipe samples "
                     "other prompts")
    keep = [i for i, grp in enumerate(groups) if max(grp) != min(grp)]
    raw = ctx.raw_rows.select(range(len(groups))).to_list()
    runs.write_jsonl([raw[i] for i in keep], path)
    hint = f"--set 'data.train={{path: {path}}}'"
    verdict = "ok" if keep else "warn"
    return Check(F, "filtered data", verdict, f"wrote {len(keep)} of {len(groups)} prompts with signal to {path}",
                 f"train on them: {hint}" if keep else "no prompt had signal; nothing to train on",
                 data={"path": str(path), "kept": len(keep)})
