"""The report's GRPO sampling sections: the prompt pool (``RUN/pool.json``: its size before and after the filter,
the pass-rate histogram as a table and a PNG) and the share of zero-variance groups per step, before and after
dynamic sampling (``dynamic_sampling/*`` and TRL's ``frac_reward_zero_std`` in ``metrics.jsonl``; the curve is
the ``zero_variance.png`` chart of :mod:`rlkit.report.charts`)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from rlkit import runs
from rlkit.errors import UserError
from rlkit.report.charts import atomic_write, series

POOL_PNG = "pool.png"
_SHARES = (("frac_reward_zero_std", "TRL's `frac_reward_zero_std` (the first draw)"),
           ("dynamic_sampling/zero_std_before", "before dynamic sampling (the first draw)"),
           ("dynamic_sampling/zero_std_after", "after dynamic sampling (the batch trained on)"))


def read_pool(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / runs.POOL
    if not path.is_file():
        return None
    try:
        pool = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e.msg}); train again, or remove the file") from None
    return pool if isinstance(pool, dict) and isinstance(pool.get("histogram"), dict) else None


def draw_pool(title: str, pool: dict[str, Any], path: Path) -> None:
    """Bars: prompts per pass rate (``passes/samples``), the learnable ones (strictly between 0 and 1) in colour."""
    from matplotlib.figure import Figure

    labels, counts = list(pool["histogram"]), list(pool["histogram"].values())
    fig = Figure(figsize=(10, 4.8), dpi=100, layout="constrained")
    ax = fig.subplots()
    colours = ["tab:gray" if i in (0, len(labels) - 1) else "tab:blue" for i in range(len(labels))]
    ax.bar(range(len(labels)), counts, color=colours)
    for i, count in enumerate(counts):
        ax.text(i, count, str(count), ha="center", va="bottom")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel(f"pass rate (passes of {pool['samples']} samples; blue: learnable, kept by keep: learnable)")
    ax.set_ylabel("prompts (count)")
    ax.grid(True, axis="y", alpha=0.35)
    fig.suptitle(title, fontsize="large", fontweight="bold")
    atomic_write(path, lambda partial: fig.savefig(partial, format="png"))


def pool_chart(label: str, pool: dict[str, Any] | None, plots_dir: Path) -> dict[str, Any] | None:
    """Draw ``plots/pool.png`` and return the report's chart entry (None, and no file, without a pool)."""
    path = plots_dir / POOL_PNG
    if pool is None:
        path.unlink(missing_ok=True)
        return None
    draw_pool(f"{label}: prompt pool", pool, path)
    return {"file": POOL_PNG, "title": "prompt pool", "path": path,
            "caption": "How many probed train prompts the starting model passed 0, 1, ... of K times "
                       "(`pool.json`); GRPO learns from the blue ones, whose groups can differ in reward."}


def pool_lines(pool: dict[str, Any]) -> list[str]:
    probed, total = pool["probed"], max(pool["probed"], 1)
    after = ("every train prompt is kept (`keep: all`)" if pool["keep"] == "all"
             else f"training draws from the **{pool['pool_size']}** learnable ones (`keep: learnable`)")
    lines = ["", "## Prompt pool", "",
             f"Before training, {probed} of the {pool['train_rows']} train prompts were each sampled "
             f"{pool['samples']} times at temperature {pool.get('temperature', '?')} (up to "
             f"{pool.get('max_new_tokens', '?')} new tokens) with the model training started from; a sample passes "
             f"by {pool.get('rule', 'the task rule')}. **{pool['learnable']}** have a pass rate strictly between 0 "
             f"and 1; {after}. Pool size: {pool['train_rows']} before, {pool['pool_size']} after. "
             f"Zero-variance reward groups among the probed prompts: {pool['zero_variance']:.1%}.", "",
             "| pass rate | prompts | share |", "|---|---|---|"]
    lines += [f"| {rate} | {n} | {n / total:.1%} |" for rate, n in pool["histogram"].items()]
    return lines


def zero_variance_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A table of the zero-variance share per step (first, last, mean), before and after dynamic sampling."""
    found = [(key, label, series(rows, key)[1]) for key, label in _SHARES]
    found = [(key, label, values) for key, label, values in found if values]
    if not found:
        return []
    lines = ["", "## Zero-variance groups", "",
             "Share of the step's groups whose completions all earned the same reward (advantage 0: GRPO learns "
             "nothing from them). Dynamic sampling (`sampling.dynamic`) drops them and refills the batch with new "
             "prompts' groups, or with `refill: false` trains on the rest alone.", "",
             "| share of groups | first step | last step | mean over steps | steps |",
             "|---|---|---|---|---|"]
    lines += [f"| {label} | {values[0]:.3f} | {values[-1]:.3f} | {statistics.fmean(values):.3f} | {len(values)} |"
              for _, label, values in found]
    rounds = series(rows, "dynamic_sampling/extra_rounds")[1]
    prompts = series(rows, "dynamic_sampling/extra_prompts")[1]
    trained = series(rows, "dynamic_sampling/groups_trained")[1]
    if trained:  # sampling.refill: false
        lines += ["", f"No refills: the loss saw {statistics.fmean(trained):.3f} of each generation batch's groups on "
                      "average, the others left out."]
    elif rounds:
        lines += ["", f"Refills: {statistics.fmean(rounds):.2f} extra generation rounds and "
                      f"{statistics.fmean(prompts):.1f} extra prompts per generation batch on average."]
    return lines
