"""Seconds and peak resident memory per phase of TRL's GRPO step, measured from outside TRL.

`install()` wraps GRPOTrainer's own methods (class attributes, before the trainer is built) so that each
call is a phase; a phase's time and peak RSS exclude the phases nested inside it. The peak is the kernel's
high-water mark (`VmHWM`), reset at every phase boundary through `/proc/self/clear_refs` (Linux), so no
sampling thread can miss a short spike. Steps are delimited by a trainer callback (`probe.callback()`).
`attach(trainer, cuda=True)` does the same to one trainer already built, on the instance (Unsloth's GRPO trainer
is its own class, compiled from TRL's source, so wrapping TRL's class would miss it), measuring GPU memory instead:
`torch.cuda.max_memory_allocated`, reset at each boundary, with a synchronize so a phase's seconds are its
kernels' and not the next phase's.

Phases (GRPOTrainer method -> name):
- `_generate_single_turn`: generation (every model turn, the tool loop's included)
- `_tool_call_loop`: tool turns, less their generation: env calls, re-templating, tokenizing results
- `_generate`: prompt templating, tokenizing, padding around generation
- `_calculate_rewards`: rewards
- `_get_per_token_logps_and_entropies` without grad: old/reference log-probs; with grad: the loss forward
- `_generate_and_score_completions`, `compute_loss`: the rest of scoring (advantages) and of the loss
- `Accelerator.backward`: backward; the optimizer callbacks: optimizer step
- anything else inside a step: rlkit and TRL bookkeeping (callbacks, logging, metrics)
"""

from __future__ import annotations

import functools
import time
from typing import Any

OTHER = "other (callbacks, logging, rlkit bookkeeping)"
NAMES = {"_generate_single_turn": "generation", "_tool_call_loop": "tool turns less generation (env calls)",
         "_generate": "templating + padding around generation", "_calculate_rewards": "rewards",
         "_generate_and_score_completions": "scoring rest (advantages, masks)", "compute_loss": "loss rest",
         "backward": "backward", "optimizer": "optimizer step"}
LOGPS = "_get_per_token_logps_and_entropies"
NO_GRAD, WITH_GRAD = "old/ref log-probs (no grad)", "loss forward (log-probs with grad)"
ORDER = [NAMES["_generate_single_turn"], NAMES["_tool_call_loop"], NAMES["_generate"], NAMES["_calculate_rewards"],
         NO_GRAD, NAMES["_generate_and_score_completions"], WITH_GRAD, NAMES["compute_loss"], NAMES["backward"],
         NAMES["optimizer"], OTHER]


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _cuda_peak() -> int:
    import torch

    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def _cuda_reset() -> None:
    import torch

    torch.cuda.reset_peak_memory_stats()


def _cuda_now() -> int:
    import torch

    return torch.cuda.memory_allocated()


# (peak since the last reset, reset the peak, bytes held now)
RSS = (lambda: _status("VmHWM"), _reset_peak, lambda: _status("VmRSS"))
CUDA = (_cuda_peak, _cuda_reset, _cuda_now)
TRAINER_METHODS = ("_generate_single_turn", "_tool_call_loop", "_generate", "_calculate_rewards",
                   "_generate_and_score_completions", "compute_loss")


class Probe:
    def __init__(self, meter: tuple = RSS) -> None:
        self.read_peak, self.reset_peak, self.read_now = meter
        self.steps: list[dict[str, dict[str, float]]] = []
        self.stack: list[str] = []
        self.last = time.perf_counter()
        self.peak = 0
        self.in_step = False
        self.lengths: list[dict[str, object]] = []  # per step: the scored batch's token counts

    def record_lengths(self, batch: dict[str, Any]) -> None:
        """Token counts of a scored batch: padded widths (what the loss forward allocates) and per sequence
        the prompt and completion tokens (completion_mask counts tool-result tokens too: they are forwarded)."""
        if not self.in_step:
            return
        prompts, completions = batch["prompt_mask"].sum(1).tolist(), batch["completion_mask"].sum(1).tolist()
        self.lengths.append({"step": len(self.steps), "batch": len(prompts),
                             "prompt_width": batch["prompt_ids"].shape[1],
                             "completion_width": batch["completion_ids"].shape[1],
                             "prompt_tokens": prompts, "completion_tokens": completions})

    def _mark(self) -> None:
        """Charge the time and peak since the last boundary to the innermost open phase."""
        hwm = self.read_peak()
        now = time.perf_counter()
        self.peak = max(self.peak, hwm)
        if self.in_step:
            name = self.stack[-1] if self.stack else OTHER
            slot = self.steps[-1].setdefault(name, {"seconds": 0.0, "peak_bytes": 0, "calls": 0})
            slot["seconds"] += now - self.last
            slot["peak_bytes"] = max(slot["peak_bytes"], hwm)
        self.reset_peak()
        self.last = time.perf_counter()

    def enter(self, name: str) -> None:
        self._mark()
        self.stack.append(name)

    def exit(self) -> None:
        self._mark()
        name = self.stack.pop()
        if self.in_step:
            self.steps[-1][name]["calls"] += 1

    def step_begin(self) -> None:
        self._mark()
        self.steps.append({"_begin": {"seconds": 0.0, "peak_bytes": self.read_now(), "calls": 0}})
        self.started = time.perf_counter()
        self.in_step = True

    def step_end(self) -> None:
        self._mark()
        self.in_step = False
        peak = max(v["peak_bytes"] for k, v in self.steps[-1].items() if k != "_begin")
        self.steps[-1]["_step"] = {"seconds": time.perf_counter() - self.started, "peak_bytes": peak, "calls": 1}

    def wrap(self, owner: Any, attr: str, name: str | None) -> None:
        original = getattr(owner, attr)

        @functools.wraps(original)
        def wrapped(*args, **kwargs):
            import torch

            self.enter(name or (WITH_GRAD if torch.is_grad_enabled() else NO_GRAD))
            try:
                result = original(*args, **kwargs)
            finally:
                self.exit()
            if attr == "_generate_and_score_completions":
                self.record_lengths(result)
            return result

        setattr(owner, attr, wrapped)

    def callback(self):
        from transformers import TrainerCallback

        probe = self

        class StepProbe(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                probe.step_begin()

            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                probe.enter(NAMES["optimizer"])

            def on_optimizer_step(self, args, state, control, **kwargs):
                probe.exit()

            def on_step_end(self, args, state, control, **kwargs):
                probe.step_end()

        return StepProbe()


def install() -> Probe:
    """Wrap GRPOTrainer's phases and add the step callback to every GRPOTrainer built after this call."""
    from accelerate import Accelerator
    from trl import GRPOTrainer

    probe = Probe()
    for attr in TRAINER_METHODS:
        probe.wrap(GRPOTrainer, attr, NAMES[attr])
    probe.wrap(GRPOTrainer, LOGPS, None)
    probe.wrap(Accelerator, "backward", NAMES["backward"])
    init = GRPOTrainer.__init__

    @functools.wraps(init)
    def init_with_probe(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.add_callback(probe.callback())

    GRPOTrainer.__init__ = init_with_probe
    return probe


def attach(trainer: Any, cuda: bool = False) -> tuple[Probe, list[str]]:
    """Wrap the phases of a GRPO trainer already built, on the instance (its class, TRL's or Unsloth's compiled
    copy, and accelerate's `Accelerator` stay as they are), and add the step callback. Returns the probe and the
    trainer methods found (a phase whose method the trainer lacks is counted in "other")."""
    probe = Probe(CUDA if cuda else RSS)
    found = [attr for attr in (*TRAINER_METHODS, LOGPS) if callable(getattr(trainer, attr, None))]
    for attr in found:
        probe.wrap(trainer, attr, None if attr == LOGPS else NAMES[attr])
    probe.wrap(trainer.accelerator, "backward", NAMES["backward"])
    trainer.add_callback(probe.callback())
    return probe, found


def summary(probe: Probe, skip: int = 1) -> dict[str, dict[str, float]]:
    """Per phase over the steps after the first `skip`: median seconds, max peak bytes, calls per step."""
    from statistics import median

    steps = probe.steps[skip:] or probe.steps
    names = [n for n in [*ORDER, "_step"] if any(n in s for s in steps)]
    return {n: {"seconds": median(s[n]["seconds"] if n in s else 0.0 for s in steps),
                "peak_bytes": max(s[n]["peak_bytes"] for s in steps if n in s),
                "calls": median(s[n]["calls"] if n in s else 0 for s in steps)} for n in names}
