"""Progress for long work: a rich bar on a terminal, silence on a pipe or a file.

Training is the exception to silence: without a terminal it logs one line per logging step
(step, key metrics, elapsed, time left), which is what a batch job's log wants.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("rlkit")

# (metric key, short label) shown next to the training bar and in the per-step log line.
KEY_METRICS = (("loss", "loss"), ("reward", "reward"), ("reward_std", "±"), ("kl", "kl"), ("objective/kl", "kl"),
               ("objective/scores", "score"), ("rewards/accuracies", "pref acc"), ("mean_token_accuracy", "tok acc"),
               ("completions/mean_length", "len"), ("tools/call_frequency", "tool calls"),
               ("tools/failure_frequency", "tool fails"))


def interactive() -> bool:
    """True when stdout is a terminal a person watches."""
    return sys.stdout.isatty()


@functools.lru_cache(maxsize=1)
def console() -> Any:
    """The one stderr console that log lines and progress bars share, so they never garble each other."""
    from rich.console import Console

    return Console(stderr=True)


def _columns(*extra: Any) -> tuple[Any, ...]:
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), *extra)


@contextmanager
def bar(description: str, total: int | None, *, show: bool = True) -> Iterator[Callable[[int], None]]:
    """A progress bar for ``total`` items; yields ``advance(n=1)``. Nothing is drawn off a terminal."""
    if not (show and interactive()):
        yield lambda n=1: None
        return
    from rich.progress import Progress

    with Progress(*_columns(), console=console(), transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n=1: progress.advance(task, n)


def summarize(logs: dict[str, Any]) -> str:
    parts = []
    for key, label in KEY_METRICS:
        value = logs.get(key)
        if isinstance(value, int | float):
            parts.append(f"{label} {value:.3g}" if label != "±" else f"± {value:.2g}")
    return "  ".join(parts)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def training_callback(label: str) -> Any:
    """A TrainerCallback: a bar with step, ETA and key metrics, or one log line per logging step off a terminal."""
    from transformers import TrainerCallback

    class TrainingProgress(TrainerCallback):
        def __init__(self) -> None:
            self.progress: Any = None
            self.started, self.first_step = time.time(), 0
            self.limit: float | None = None  # seconds (rlkit train --max-minutes): training ends then, not at max_steps

        def on_train_begin(self, args, state, control, **kwargs):
            if not state.is_world_process_zero:
                return
            self.started, self.first_step = time.time(), state.global_step  # a resumed run starts mid-way
            if interactive():
                from rich.progress import Progress, TextColumn

                self.progress = Progress(*_columns(TextColumn("{task.fields[metrics]}")), console=console())
                self.progress.start()
                self.task = self.progress.add_task(label, total=None if self.limit else state.max_steps,
                                                   completed=state.global_step, metrics="")

        def on_step_end(self, args, state, control, **kwargs):
            if self.progress is not None:
                self.progress.update(self.task, completed=state.global_step)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs or "train_runtime" in logs:
                return
            text = summarize(logs)
            if self.progress is not None:
                self.progress.update(self.task, metrics=text)
                return
            elapsed = time.time() - self.started
            done = state.global_step - self.first_step
            if self.limit is not None:
                log.info("step %d  %s  (%s elapsed, %s left of the %s limit)", state.global_step, text,
                         _duration(elapsed), _duration(max(self.limit - elapsed, 0.0)), _duration(self.limit))
                return
            left = elapsed / done * (state.max_steps - state.global_step) if done > 0 else 0.0
            log.info("step %d/%d  %s  (%s elapsed, %s left)", state.global_step, state.max_steps, text,
                     _duration(elapsed), _duration(left))

        def on_train_end(self, args, state, control, **kwargs):
            if self.progress is not None:
                self.progress.stop()
                self.progress = None

    return TrainingProgress()


def set_time_limit(trainer: Any, minutes: float) -> None:
    """Tell the trainer's progress callback that ``rlkit train --max-minutes`` ends the run: it counts time left
    against the limit, not against ``max_steps`` (which a time-limited run sets far out of reach)."""
    for callback in trainer.callback_handler.callbacks:
        if type(callback).__name__ == "TrainingProgress":
            callback.limit = minutes * 60
