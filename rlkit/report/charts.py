"""The report's charts. A chart is panels sharing the step axis; a panel is lines; a line is a metric key,
optionally with a band (± a std key, or a low..high pair of keys). Figures are built without pyplot, so there
is no global figure state and no backend switch: ``Figure.savefig`` renders PNGs with Agg. Every PNG is
written under a temporary name and moved into place.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What TRL's `loss` measures, per algorithm, for the loss chart's y axis.
_LOSS_UNITS = {"sft": "cross-entropy (nats/token)", "dpo": "DPO loss (nats)", "reward": "pairwise loss (nats)",
               "grpo": "surrogate loss (advantage units)"}


def finite_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def series(rows: list[dict[str, Any]], key: str, *extra: str) -> tuple[list[float], ...]:
    """(steps, values of ``key``, values of each ``extra`` key or NaN) over the rows where ``key`` is a number."""
    out: tuple[list[float], ...] = tuple([] for _ in range(2 + len(extra)))
    for row in rows:
        value, step = finite_number(row.get(key)), finite_number(row.get("step"))
        if value is None or step is None:
            continue
        out[0].append(step)
        out[1].append(value)
        for column, other in zip(out[2:], extra, strict=True):
            number = finite_number(row.get(other))
            column.append(math.nan if number is None else number)
    return out


def atomic_write(path: Path, write: Callable[[Path], Any]) -> None:
    partial = path.with_name(f".{path.stem}.partial{path.suffix}")
    try:
        write(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)  # a write the disk refused leaves no half file (after the move: none there)


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


@dataclass(frozen=True)
class Line:
    key: str
    label: str
    std: str | None = None
    low: str | None = None
    high: str | None = None
    band: str = ""


Panels = Callable[[list[dict[str, Any]], str], list[tuple[str, list[Line]]]]


@dataclass(frozen=True)
class Chart:
    file: str
    title: str
    caption: str
    panels: Panels | None = None  # (rows, algorithm) -> [(y label with unit, lines)]; None: eval bars
    requires: tuple[str, ...] = ()  # draw only when one of these keys was logged

    def draw(self, label: str, algorithm: str, rows: list[dict[str, Any]], evals: list[dict[str, Any]],
             path: Path) -> list[str] | None:
        if self.requires and not any(series(rows, key)[0] for key in self.requires):
            return None
        if self.panels is None:
            return draw_eval(f"{label}: {self.title}", rows, evals, path)
        panels = [(ylabel, [line for line in lines if series(rows, line.key)[0]])
                  for ylabel, lines in self.panels(rows, algorithm)]
        panels = [(ylabel, lines) for ylabel, lines in panels if lines]
        if not panels:
            return None
        fig, axes = figure(len(panels))
        for ax, (ylabel, lines) in zip(axes, panels, strict=True):
            for i, line in enumerate(lines):
                plot(ax, rows, line, i)
            decorate(ax, ylabel, legend=len(lines) > 1 or any(line.band for line in lines))
        save(fig, f"{label}: {self.title}", path)
        return [line.key for _, lines in panels for line in lines]


def _components(rows: list[dict[str, Any]], _: str) -> list[tuple[str, list[Line]]]:
    names = dict.fromkeys(m.group(1) for row in rows for key in row if (m := re.fullmatch(r"rewards/(.+)/mean", key)))
    return [("reward (reward units)",
             [Line(f"rewards/{name}/mean", name, std=f"rewards/{name}/std", band=f"{name} ± std") for name in names])]


def _tools(rows: list[dict[str, Any]], _: str) -> list[tuple[str, list[Line]]]:
    env = dict.fromkeys(key for row in rows for key in row if key.startswith("env/"))
    # TRL: call_frequency is calls per completion (can exceed 1), failure_frequency failed calls / calls
    return [("tool calls (per completion)", [Line("tools/call_frequency", "tool calls per completion")]),
            ("failed calls (fraction of calls)", [Line("tools/failure_frequency", "failed / all tool calls")]),
            ("env metric (count per episode)", [Line(key, key.removeprefix("env/")) for key in env])]


CHARTS = (
    Chart("reward.png", "reward", "Mean reward per step; the band is ± one standard deviation across the step's "
          "completions (GRPO). PPO plots the score of its reward model (`objective/scores`).",
          lambda rows, _: [("reward (reward units)", [
              Line("reward", "mean reward", std="reward_std", band="± std across completions"),
              Line("objective/scores", "score"), Line("objective/rlhf_reward", "score − KL penalty"),
              Line("eval_reward", "eval reward")])]),
    Chart("reward_components.png", "reward components", "Each reward function's mean per step (before weighting), "
          "with a ± one standard deviation band.", _components),
    Chart("preference.png", "preference rewards", "DPO's implicit rewards (β · log-ratio to the reference) of the "
          "chosen and rejected answers, their margin, how often chosen outscores rejected, and the policy's "
          "summed log-probability of each answer.",
          lambda rows, _: [("implicit reward (nats × β)", [
              Line("rewards/chosen", "chosen"), Line("rewards/rejected", "rejected"),
              Line("rewards/margins", "margin (chosen − rejected)")]),
              ("chosen > rejected (fraction)", [Line("rewards/accuracies", "preference accuracy")]),
              ("log-prob of the answer (nats)", [Line("logps/chosen", "chosen"), Line("logps/rejected", "rejected")])]),
    Chart("loss.png", "loss", "Training loss per logging step, eval loss when the trainer evaluated; PPO logs its "
          "policy and value losses instead.",
          lambda rows, algorithm: [
              (_LOSS_UNITS.get(algorithm, "loss"), [Line("loss", "train loss"), Line("eval_loss", "eval loss")]),
              ("policy loss (advantage units)", [Line("loss/policy_avg", "PPO policy loss")]),
              ("value loss (reward units²)", [Line("loss/value_avg", "PPO value loss")])]),
    Chart("kl.png", "KL to the reference", "KL divergence of the policy from the reference model; it grows as "
          "training moves the policy away from where it started.",
          lambda rows, _: [("KL divergence (nats)", [Line("kl", "KL(policy ‖ reference)"),
                                                     Line("objective/kl", "KL(policy ‖ reference)")])]),
    Chart("completion_length.png", "completion length", "Completion length per step (mean, with the min–max band), "
          "and the fraction of completions cut off at `max_completion_length`.",
          lambda rows, _: [("completion length (tokens)", [
              Line("completions/mean_length", "mean", low="completions/min_length", high="completions/max_length",
                   band="min – max")]),
              ("clipped (fraction)", [Line("completions/clipped_ratio", "cut at max_completion_length")])]),
    Chart("tools.png", "tool use", "Tool calls per completion, the share of calls that failed, and the "
          "environment's own episode metrics (`env/*`, averaged over the batch's episodes).", _tools),
    Chart("zero_variance.png", "zero-variance groups", "Share of each step's groups whose completions all earned the "
          "same reward (GRPO learns nothing from them): in the first draw, and in the batch trained on once dynamic "
          "sampling (`sampling.dynamic`) has refilled it; below, the extra generation rounds and prompts it took "
          "or, with `refill: false`, the share of each batch's groups the loss saw.",
          lambda rows, _: [("groups with equal rewards (fraction)", [
              Line("dynamic_sampling/zero_std_before", "before dynamic sampling (first draw)"),
              Line("dynamic_sampling/zero_std_after", "after (the batch trained on)"),
              Line("frac_reward_zero_std", "TRL's frac_reward_zero_std (first draw)")]),
              ("extra generation (count per batch)", [Line("dynamic_sampling/extra_rounds", "extra rounds"),
                                                      Line("dynamic_sampling/extra_prompts", "extra prompts")]),
              ("groups trained on (fraction of the batch)", [Line("dynamic_sampling/groups_trained",
                                                                  "groups with signal, left in the loss")])]),
    Chart("sft.png", "token accuracy and entropy", "Share of next tokens the model predicts right on the training "
          "batch, and the entropy of its predictions.",
          lambda rows, _: [("token accuracy (fraction)", [Line("mean_token_accuracy", "train")]),
                           ("entropy (nats/token)", [Line("entropy", "train")])], requires=("mean_token_accuracy",)),
    Chart("eval.png", "eval accuracy", "Accuracy of each evaluated model (`rlkit eval`, bars) and of the trainer's "
          "own evaluation over steps."),
    Chart("agent_eval.png", "agent eval during training", "The agent's greedy F1 (with its 95% bootstrap interval) "
          "and EM on held-out questions at step 0 (the model training started from) and every `eval.agent_every` "
          "steps (`agent_eval.jsonl`); the best step's adapter is kept in `best/`.",
          lambda rows, _: [("held-out score (fraction)", [
              Line("agent_eval/f1", "F1 (greedy)", low="agent_eval/f1_low", high="agent_eval/f1_high",
                   band="F1's 95% interval"), Line("agent_eval/em", "EM (greedy)")])]),
    Chart("learning_rate.png", "learning rate", "The learning-rate schedule.",
          lambda rows, _: [("learning rate (optimizer step size)",
                            [Line("learning_rate", "learning rate"), Line("lr", "learning rate (PPO)")])]),
)


def figure(panels: int) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure

    # 100 dpi x 10 in = 1000 px wide; constrained layout keeps outside legends and labels from overlapping.
    fig = Figure(figsize=(10, 4.8 if panels == 1 else 3.6 * panels), dpi=100, layout="constrained")
    axes = fig.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=True)
    axes[-1].set_xlabel("training step")
    return fig, list(axes)


_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"))


def plot(ax: Any, rows: list[dict[str, Any]], line: Line, index: int = 0) -> None:
    bands = [k for k in (line.std, line.low, line.high) if k]
    steps, values, *extra = series(rows, line.key, *bands)
    # Markers make sparse series readable and a metric logged once visible at all; distinct dashes and
    # hollow markers keep a series visible when another lies on top of it (two rewards stuck at 0).
    style, marker = _STYLES[index % len(_STYLES)]
    (drawn,) = ax.plot(steps, values, label=line.label, linestyle=style, marker=marker if len(steps) <= 60 else None,
                       markersize=6, markerfacecolor=None if index == 0 else "none")
    if not bands:
        return
    if line.std:
        low = [v - s for v, s in zip(values, extra[0], strict=True)]
        high = [v + s for v, s in zip(values, extra[0], strict=True)]
    else:
        low, high = extra
    if len(steps) > 1:
        ax.fill_between(steps, low, high, color=drawn.get_color(), alpha=0.2, linewidth=0, label=line.band)
    else:
        ax.errorbar(steps, values, yerr=[[values[0] - low[0]], [high[0] - values[0]]], color=drawn.get_color(),
                    capsize=4, linestyle="none", label=line.band)


def decorate(ax: Any, ylabel: str, legend: bool) -> None:
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.35)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    steps = [float(x) for line in ax.get_lines() for x in line.get_xdata()]
    if steps and max(steps) - min(steps) < 2:  # one logged step: whole-step ticks around it, not 2.84 .. 3.16
        ax.set_xlim(min(steps) - 1, max(steps) + 1)
    if "(tokens" in ylabel:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    # The unit in the y label decides the range: a fraction spans 0..1, a count starts at 0, and a flat zero
    # sits at the bottom of a 0..1 axis rather than in the middle of ±0.05 of noise.
    values = [float(v) for line in ax.get_lines() for v in line.get_ydata() if math.isfinite(v)]
    low, high = ax.get_ylim()
    if "(fraction" in ylabel or (values and max(values) == min(values) == 0):
        ax.set_ylim(-0.04, 1.04)
    elif values and min(values) >= 0 and (low < 0 or "(count" in ylabel or "(per " in ylabel):
        ax.set_ylim(-0.04 * high, high)
    # no "+6.918" offset or "1e-6" multiplier in a corner, which readers miss: every tick says its value
    low, high = ax.get_ylim()
    if 0 < max(abs(low), abs(high)) < 1e-2:
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.1e}" if value else "0"))
    else:
        ax.ticklabel_format(axis="y", useOffset=False)
    if legend:
        # above the panel, not beside it: stacked panels keep the same width, so their steps line up
        handles = len(ax.get_legend_handles_labels()[0])
        ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncols=min(handles, 4), fontsize="small", frameon=False)


def save(fig: Any, title: str, path: Path) -> None:
    fig.suptitle(title, fontsize="large", fontweight="bold")
    atomic_write(path, lambda partial: fig.savefig(partial, format="png"))


def draw_eval(title: str, rows: list[dict[str, Any]], evals: list[dict[str, Any]], path: Path) -> list[str] | None:
    """Bars for each ``eval/*.json`` (x: accuracy) above the trainer's ``eval_*accuracy*`` keys (x: steps)."""
    from matplotlib.figure import Figure

    keys = list(dict.fromkeys(key for row in rows for key in row
                              if key.startswith("eval_") and "accurac" in key and finite_number(row[key]) is not None))
    if not evals and not keys:
        return None
    heights = ([max(2.4, 0.8 + 0.6 * len(evals))] if evals else []) + ([3.2] if keys else [])
    fig = Figure(figsize=(10, sum(heights) + 1.0), dpi=100, layout="constrained")
    axes = fig.subplots(len(heights), 1, squeeze=False, height_ratios=heights)[:, 0]
    if evals:
        ax, accuracy = axes[0], [e["accuracy"] for e in evals]
        ax.barh(range(len(evals)), accuracy, color="tab:blue", height=0.6)
        # The file names which set it was (base-heldout, grpo-newwording, ...), the model which weights.
        ax.set_yticks(range(len(evals)), [f"{Path(e['file']).stem}: {shorten(e['model'])} (n={fmt(e['n'])})"
                                          for e in evals])
        ax.set_ylim(len(evals), -1)  # first file on top, as in the report's table; room above and below
        for i, value in enumerate(accuracy):
            ax.text(value + 0.01, i, f"{value:.3f}", va="center")
        ax.set_xlim(0, 1.1)
        ax.set_xticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
        ax.set_xlabel(f"{evals[0]['metric']} (fraction, rlkit eval)")
        ax.grid(True, axis="x", alpha=0.35)
    if keys:
        for i, key in enumerate(keys):
            plot(axes[-1], rows, Line(key, key), i)
        axes[-1].set_xlabel("training step")
        decorate(axes[-1], "eval accuracy (fraction)", legend=True)  # which eval_* key it is
    save(fig, title, path)
    return keys


def shorten(text: str, width: int = 40) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1):]
