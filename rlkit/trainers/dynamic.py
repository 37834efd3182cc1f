"""Dynamic sampling (DAPO's): groups whose rewards are all equal are dropped and refilled before the loss.

A group is a prompt's ``num_generations`` completions, consecutive rows of TRL's generation batch. When every
scorable completion of a group earns the same total reward (weighted as TRL weights it; completions every
reward function returned None for do not count), its advantages are all equal, and GRPO learns nothing from it
while paying for its generation and its loss. :func:`trainer_class` is TRL's ``GRPOTrainer`` with one method
hooked, ``_generate_and_score_completions``: it calls TRL's own on the batch, and while the batch holds fewer
groups with signal than it had groups, calls it again on new prompts (each repeated ``num_generations`` times,
as TRL's ``RepeatSampler`` does), up to ``max_rounds`` extra rounds; a batch still short after them is filled
with dropped groups (the first draw's first), so the batch keeps the size TRL expects. TRL generates, scores,
computes advantages and log-probs; rlkit only picks rows and pads them to one width.

- With ``sampling.refill: false`` (``max_rounds`` 0 here) nothing is drawn again: the loss is computed on the groups
  with signal alone (padded with dropped ones to a multiple of ``steps_per_generation``), a smaller batch whose
  backward pass costs less: on a CPU the loss, not the generation, is most of a GRPO step.
- A refill round draws ``shortfall / (share of groups with signal so far)`` prompts (at most the batch's group
  count): one larger generation call costs less than several small ones, on a CPU most of all.
- The refill prompts come from the train dataset (after the prompt pool's filter), drawn without replacement per
  round by a generator seeded with the trainer's seed, the global step and the round: no sampler state to
  checkpoint, and a resumed run picks the same refill prompts as an uninterrupted one.
- Advantages are TRL's, per draw: with ``scale_rewards: group`` or ``none`` a kept group's advantages are exactly
  those of its group; with ``batch`` each draw was scaled by its own batch's standard deviation.
- TRL's own metrics (``reward``, ``frac_reward_zero_std``, ...) keep the first draw's values, an unbiased sample
  of the prompts; rlkit adds ``dynamic_sampling/zero_std_before`` (share of zero-variance groups in the first
  draw), ``dynamic_sampling/zero_std_after`` (in the batch trained on), and with refills
  ``dynamic_sampling/extra_rounds`` and ``dynamic_sampling/extra_prompts``, without them
  ``dynamic_sampling/groups_trained`` (the share of the batch's groups the loss saw). The completions TRL logs
  (``log_completions``) include every draw's.
  Evaluation batches pass through unchanged.
- One process only (:func:`rlkit.trainers.grpo.check_sampling` refuses several): with more, every rank would
  have to draw the same refills and split the groups between them.

Importing this module does not import TRL: the subclass is built on first use.
"""

from __future__ import annotations

import functools
import math
import random
from typing import Any

PREFIX = "dynamic_sampling/"
# Keys of TRL's generation output, by how a batch of them is padded to one width: (side, value; None: the pad token).
_PADDED = {"prompt_ids": ("left", None), "prompt_mask": ("left", 0), "completion_ids": ("right", None),
           "completion_mask": ("right", 0), "tool_mask": ("right", 1), "old_per_token_logps": ("right", 0.0),
           "ref_per_token_logps": ("right", 0.0), "sampling_per_token_logps": ("right", 0.0),
           "importance_sampling_ratio": ("right", 1.0)}
_PER_ROW = ("advantages",)


def zero_variance(rewards_per_func: Any, weights: Any, group: int) -> Any:
    """Per group of ``group`` consecutive rows, whether its scorable completions' weighted total rewards are all
    equal (within ``torch.isclose``; fewer than two scorable completions count as equal). Rows whose every reward
    is NaN (TRL's unscorable completions, advantage 0) do not count."""
    import torch

    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    totals = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1).view(-1, group)
    unscorable = unscorable.view(-1, group)
    high = totals.masked_fill(unscorable, -math.inf).max(dim=1).values
    low = totals.masked_fill(unscorable, math.inf).min(dim=1).values
    few = (~unscorable).sum(dim=1) < 2
    return few | torch.isclose(high, low)


def merge(draws: list[dict[str, Any]], picks: list[tuple[int, int]], group: int, pad_token_id: int) -> dict[str, Any]:
    """One generation batch from the groups ``picks`` (draw index, group index) of TRL's outputs ``draws``: each
    padded tensor padded again, on its side, to the widest of the draws it takes groups from; rows in ``picks``
    order; ``num_items_in_batch`` counted again as TRL counts it (loss tokens: completion mask times tool mask)."""
    import torch
    import torch.nn.functional as F

    used = sorted({d for d, _ in picks})  # only the draws a group is taken from set the widths
    offsets = {d: sum(len(draws[u]["advantages"]) for u in used if u < d) for d in used}
    index = torch.tensor([offsets[d] + g * group + j for d, g in picks for j in range(group)],
                         device=draws[0]["advantages"].device)
    draws = [draws[d] for d in used]
    out: dict[str, Any] = {}
    for key in draws[0]:
        if key == "num_items_in_batch":
            continue
        if key not in _PADDED and key not in _PER_ROW:
            raise NotImplementedError(f"dynamic sampling cannot merge TRL's generation output {key!r} "
                                      "(multimodal inputs are not supported)")
        parts = [draw[key] for draw in draws]
        if key in _PADDED:
            side, value = _PADDED[key]
            value = pad_token_id if value is None else value
            width = max(p.shape[1] for p in parts)
            parts = [F.pad(p, (width - p.shape[1], 0) if side == "left" else (0, width - p.shape[1]), value=value)
                     for p in parts]
        out[key] = torch.cat(parts)[index]
    loss_mask = out["completion_mask"] * out["tool_mask"] if "tool_mask" in out else out["completion_mask"]
    out["num_items_in_batch"] = loss_mask.sum()
    return out


def choose(masks: list[list[bool]], need: int) -> list[tuple[int, int]]:
    """``need`` groups: those with signal in draw order, then zero-variance ones (the first draw's first)."""
    signal = [(d, g) for d, mask in enumerate(masks) for g, zero in enumerate(mask) if not zero]
    dropped = [(d, g) for d, mask in enumerate(masks) for g, zero in enumerate(mask) if zero]
    return (signal + dropped)[:need]


def trained_groups(mask: list[bool], chunks: int) -> int:
    """Without refills (``sampling.refill: false``): the groups with signal, at least one, rounded up to a multiple of
    ``chunks`` (TRL splits a generation batch into ``steps_per_generation`` equal parts), at most the batch."""
    return min(len(mask), math.ceil(max(1, mask.count(False)) / chunks) * chunks)


def refill_size(masks: list[list[bool]], need: int) -> int:
    """Prompts to draw next: the shortfall divided by the share of groups with signal so far, at most ``need``."""
    seen = sum(len(m) for m in masks)
    useful = sum(not z for m in masks for z in m)
    short = need - useful
    if useful == 0:
        return need
    return min(need, max(short, math.ceil(short * seen / useful)))


def draw_rows(dataset: Any, n: int, group: int, seed: str) -> list[dict[str, Any]]:
    """``n`` rows of ``dataset`` drawn without replacement (with it only past the dataset's size), each repeated
    ``group`` times in a row, as TRL's RepeatSampler lays out a generation batch."""
    rng = random.Random(seed)
    indices: list[int] = []
    while len(indices) < n:
        indices += rng.sample(range(len(dataset)), min(len(dataset), n - len(indices)))
    rows = dataset.select(indices).to_list()
    return [row for row in rows for _ in range(group)]


@functools.cache
def trainer_class() -> type:
    """``GRPOTrainer`` with dynamic sampling (built on first use: importing rlkit does not import TRL)."""
    from trl import GRPOTrainer

    class DynamicSamplingGRPOTrainer(GRPOTrainer):
        def __init__(self, *args: Any, max_rounds: int, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.max_rounds = max_rounds
            self._last_rewards = None
            self._calls: dict[int, int] = {}  # generation calls per global step (a refill seed's part)

        def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Any:
            self._last_rewards = super()._calculate_rewards(*args, **kwargs)
            return self._last_rewards

        def _draw(self, inputs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[bool]]:
            output = super()._generate_and_score_completions(inputs)
            mask = zero_variance(self._last_rewards, self.reward_weights, self.num_generations)
            return output, mask.tolist()

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            if not self.model.training:
                return super()._generate_and_score_completions(inputs)
            group, step = self.num_generations, self.state.global_step
            self._calls = {step: self._calls.get(step, -1) + 1}
            call = self._calls[step]
            need = len(inputs) // group
            output, mask = self._draw(inputs)
            metrics = self._metrics["train"]
            first = {key: len(values) for key, values in metrics.items()}
            draws, masks, drawn = [output], [mask], 0
            while sum(not z for m in masks for z in m) < need and len(draws) <= self.max_rounds:
                n = refill_size(masks, need)
                rows = draw_rows(self.train_dataset, n, group, f"rlkit-dynamic-sampling/{self.args.seed}/{step}/"
                                                               f"{call}/{len(draws)}")
                output, mask = self._draw(rows)
                draws.append(output)
                masks.append(mask)
                drawn += n
            for key in list(metrics):  # TRL's metrics describe the first draw, as they would without refills
                if key in first:
                    del metrics[key][first[key]:]
                else:
                    del metrics[key]
            picks = choose(masks, need if self.max_rounds else trained_groups(masks[0], self.args.steps_per_generation))
            metrics[PREFIX + "zero_std_before"].append(sum(masks[0]) / need)
            metrics[PREFIX + "zero_std_after"].append(sum(masks[d][g] for d, g in picks) / len(picks))
            if self.max_rounds:
                metrics[PREFIX + "extra_rounds"].append(len(draws) - 1)
                metrics[PREFIX + "extra_prompts"].append(drawn)
            else:  # sampling.refill: false
                metrics[PREFIX + "groups_trained"].append(len(picks) / need)
            if picks == [(0, g) for g in range(need)]:  # TRL's batch as it was (all signal, or nothing better)
                return draws[0]
            return merge(draws, picks, group, self._tokenizer.pad_token_id)

    return DynamicSamplingGRPOTrainer
