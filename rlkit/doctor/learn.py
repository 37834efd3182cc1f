"""Learnability: can GRPO learn anything from this model on these prompts?

K completions for each of N train prompts, sampled with the recipe's model and sampling settings (the
local model through rlkit's rollout engine, or a served model with ``--endpoint``; tool recipes run
whole episodes with the environment), scored with the recipe's rewards. GRPO's advantage is a
completion's reward minus its group's mean: a group whose K rewards are all equal teaches nothing.
A completion *passes* when it earns as much as the gold answer does (the reward card's best form).

No-go when fewer than ``MIN_SIGNAL`` of the prompts have any reward variance. ``--write-filtered FILE``
writes the prompts with signal, in the task's own row format, for ``--set data.train.path=FILE``.

The same sampling measures a GRPO run's prompt pool before training (``sampling.pool``, :func:`prompt_pool`):
each of the first ``limit`` train prompts' pass rate under the model training starts from (the task's success
rule, ``data.success``, over K samples), written to ``RUN/pool.json``; ``keep: learnable`` trains only on the
prompts whose pass rate is strictly between 0 and 1.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from rlkit.doctor import Check, Context

log = logging.getLogger("rlkit")

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
    from rlkit.agents.policies import make_policy
    from rlkit.doctor.rewards import gold_totals
    from rlkit.trainers.grpo import reply_tokens

    row_list = rows.to_list()
    temperature = float(ctx.setting("temperature", 1.0) or 1.0)
    max_new = ctx.setting("max_completion_length", None)
    max_new = reply_tokens(ctx.setting("generation_kwargs", None), max_new) if max_new else recipe.eval.max_new_tokens
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
    # the trainer's seed: the same samples on every run, whatever ran before
    rewards = [r["reward"] for r in sample(recipe, row_list, policy, samples, int(ctx.setting("seed", 42)))]
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


def sample(recipe: Any, rows: list[dict[str, Any]], policy: Any, samples: int, seed: int,
           show_progress: bool = False) -> list[dict[str, Any]]:
    """``samples`` scored episodes per row, a row's consecutive (``rlkit.agents.scoring`` records: ``reward`` is
    the recipe's weighted total, ``success`` the task's rule); whole tool episodes when the recipe has an env."""
    from transformers import set_seed

    from rlkit.agents.engine import run_episodes
    from rlkit.agents.scoring import score_episodes

    if recipe.env is not None:
        from rlkit.data import env_factory

        make_env, max_turns = env_factory(recipe), recipe.env.max_turns
    else:
        make_env, max_turns = _NoTools, 1
    set_seed(seed)
    episodes = run_episodes([r for r in rows for _ in range(samples)], make_env, policy, max_turns=max_turns,
                            show_progress=show_progress)
    return score_episodes(episodes, recipe)


def prompt_pool(recipe: Any, model: Any, tokenizer: Any, train_ds: Any, args: Any, run_dir: Path, *,
                main: bool = True) -> Any:
    """The train rows GRPO draws from (``sampling.pool``; without it, ``train_ds``): each of the first ``limit`` rows'
    pass rate under ``model`` (loaded as training starts: the base, or the ``init_from`` adapter) over ``samples``
    completions at the trainer's temperature and limit for a reply (``generation_kwargs``' ``max_new_tokens``, else
    ``max_completion_length``: per turn, for a tool agent), written to ``RUN/pool.json``. ``keep: learnable`` returns
    the rows whose pass rate is strictly between 0 and 1, and refuses when fewer are left than one generation batch
    needs. A run directory that already holds ``pool.json`` is a resumed run's (a new run starts in an empty one): its
    pool is read, not sampled again."""
    spec = recipe.sampling.pool if recipe.sampling is not None else None
    if spec is None:
        return train_ds
    import copy

    from transformers import set_seed

    from rlkit import runs
    from rlkit.agents.hf import HFPolicy
    from rlkit.errors import UserError
    from rlkit.trainers.grpo import reply_tokens

    path = run_dir / runs.POOL
    if path.is_file():
        pool = json.loads(path.read_text(encoding="utf-8"))
    else:
        started = time.perf_counter()
        rows = train_ds.select(range(min(spec.limit, len(train_ds)))).to_list()
        # A copy: a policy gives its tokenizer a response parser, which changes how TRL decodes plain completions.
        max_new = reply_tokens(getattr(args, "generation_kwargs", None), args.max_completion_length)
        policy = HFPolicy(model, copy.deepcopy(tokenizer), chat_template_kwargs=recipe.model.chat_template_kwargs,
                          max_new_tokens=max_new, temperature=args.temperature, batch_size=recipe.eval.batch_size)
        records = sample(recipe, rows, policy, spec.samples, args.seed, show_progress=main)
        set_seed(args.seed)  # the LoRA TRL adds next starts as it would without this sampling
        pool = pool_summary(rows, records, spec.samples, spec.keep, len(train_ds))
        pool.update(temperature=args.temperature, max_new_tokens=max_new, seed=args.seed,
                    seconds=round(time.perf_counter() - started, 2))
        if main:
            path.write_text(json.dumps(pool, indent=1) + "\n", encoding="utf-8")
    counts = ", ".join(f"{rate}: {n}" for rate, n in pool["histogram"].items())
    log.info("sampling.pool: %d prompts x %d samples, pass rates %s; %s %d (%s)", pool["probed"], pool["samples"],
             counts, "training on" if spec.keep == "learnable" else "learnable:", pool["learnable"], path)
    if spec.keep == "all":
        return train_ds
    need = args.generation_batch_size // args.num_generations
    if pool["learnable"] < need:
        raise UserError(f"sampling.pool: {pool['learnable']} of {pool['probed']} probed prompts have a pass rate "
                        f"strictly between 0 and 1 (pass rates {counts}), fewer than the {need} one generation batch "
                        "needs; raise sampling.pool.limit or sampling.pool.samples, start from an SFT adapter "
                        "(init_from), or set sampling.pool.keep=all")
    return train_ds.select([p["index"] for p in pool["prompts"] if p["learnable"]])


def pool_summary(rows: list[dict[str, Any]], records: list[dict[str, Any]], samples: int, keep: str,
                 train_rows: int) -> dict[str, Any]:
    """``pool.json``'s content: per prompt its passes, pass rate, mean reward, whether its rewards were all equal
    and whether it is learnable (0 < pass rate < 1); the pass-rate histogram (``passes/samples``: prompts); the
    pool's size before (``train_rows``) and after the filter (``pool_size``)."""
    prompts = []
    for i, row in enumerate(rows):
        mine = records[i * samples:(i + 1) * samples]
        passes = sum(bool(r["success"]) for r in mine)
        rewards = [r["reward"] for r in mine]
        prompts.append({"index": i, "passes": passes, "pass_rate": round(passes / samples, 4),
                        "reward_mean": round(statistics.fmean(rewards), 4),
                        "zero_variance": max(rewards) == min(rewards), "learnable": 0 < passes < samples,
                        "question": row["prompt"][-1]["content"]})
    learnable = sum(p["learnable"] for p in prompts)
    return {"keep": keep, "samples": samples, "rule": "the task's success rule (data.success)",
            "train_rows": train_rows, "probed": len(rows), "learnable": learnable,
            "pool_size": learnable if keep == "learnable" else train_rows,
            "zero_variance": round(sum(p["zero_variance"] for p in prompts) / max(len(prompts), 1), 4),
            "histogram": {f"{k}/{samples}": sum(p["passes"] == k for p in prompts) for k in range(samples + 1)},
            "prompts": prompts}


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
