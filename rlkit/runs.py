"""The run directory: what a run was (resolved recipe + provenance), what it logged, what it made.

    RUN/recipe.resolved.yaml   recipe after overrides/smoke, model as loaded, versions, git sha
    RUN/trainer_config.json    the TRL config the trainer ran with (every field, secrets masked)
    RUN/metrics.jsonl          one JSON object per logging step, with `step`
    RUN/pool.json              GRPO's prompt pool: each probed prompt's pass rate (``sampling.pool``)
    RUN/checkpoints/           TRL checkpoints; a complete one holds COMPLETE (written after the save)
    RUN/adapter/               the final PEFT adapter + tokenizer
    RUN/plots/, RUN/report.md  charts and summary (``rlkit report``)
    RUN/wandb/, RUN/tensorboard/  tracker logs, when ``trainer.report_to`` names them

merge, eval and analyze read this directory instead of asking the user again.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from rlkit import storage
from rlkit.errors import UserError

log = logging.getLogger("rlkit")

RESOLVED = "recipe.resolved.yaml"
METRICS = "metrics.jsonl"
COMPLETE = "rlkit-complete.json"
TRAINER_CONFIG = "trainer_config.json"
POOL = "pool.json"
# What a run writes before its first checkpoint: a directory holding only these was never worth keeping.
_SETUP_FILES = {RESOLVED, METRICS, TRAINER_CONFIG, POOL, "checkpoints", "wandb", "tensorboard", "plots", "report.md"}
# Recipe keys that may change when a run resumes; anything else would make it a different run.
RESUMABLE_CHANGES = ("trainer.max_steps", "trainer.num_train_epochs", "trainer.save_steps", "trainer.logging_steps",
                     "trainer.save_total_limit", "trainer.report_to",
                     # what `rlkit eval --ifeval` reads after training; a run started before rlkit had it lacks them
                     "eval.ifeval.limit", "eval.ifeval.max_new_tokens", "eval.ifeval.tolerance")
_PACKAGES = ("rlkit", "trl", "transformers", "peft", "torch", "accelerate", "datasets", "bitsandbytes",
             "unsloth", "vllm")


def prepare(run_dir: Path, overwrite: bool, main: bool = True, inputs: tuple[Path, ...] = ()) -> Path:
    """Create an empty run directory; refuse to mix a new run into an old one.

    A run that stopped before its first checkpoint (killed while loading, say) left nothing worth
    keeping, so it is replaced without ``--overwrite``: it never blocks a retry. Either way only a
    directory rlkit owns is deleted (see rlkit.safety), never the cwd, $HOME, a repository or ``inputs``.
    With several processes every rank checks (they all refuse alike) and only the ``main`` one deletes
    and creates.
    """
    from rlkit import safety

    safety.check_target(run_dir, "--output-dir", inputs)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--output-dir {run_dir}: exists and is not a directory")
    if run_dir.exists() and _contents(run_dir):
        if overwrite or _nothing_to_keep(run_dir):
            if main and not overwrite:
                log.warning("%s: replacing an unfinished run that has no checkpoint", run_dir)
            safety.remove(run_dir, "--output-dir", inputs, safety.RUN_FILES, delete=main)
        elif checkpoints(run_dir) and not (run_dir / "adapter").exists():
            raise UserError(f"{run_dir}: holds an unfinished run (last complete checkpoint: "
                            f"{checkpoints(run_dir)[-1].name}); pass --resume to continue it, --overwrite to start "
                            "again, or --output-dir to write elsewhere")
        else:
            raise UserError(f"{run_dir}: run directory is not empty; pass --overwrite to replace it "
                            "or --output-dir to write elsewhere")
    if main:
        safety.make_dir(run_dir, "run")
    return run_dir


def _contents(run_dir: Path) -> set[str]:
    from rlkit.safety import MARKER

    return {p.name for p in run_dir.iterdir()} - {MARKER}


def _nothing_to_keep(run_dir: Path) -> bool:
    names = _contents(run_dir)
    return RESOLVED in names and names <= _SETUP_FILES and not checkpoints(run_dir)


def checkpoints(run_dir: Path) -> list[Path]:
    """The complete checkpoints of a run, oldest first (a half-written one has no COMPLETE file)."""
    return sorted((p for p in (run_dir / "checkpoints").glob("checkpoint-*") if (p / COMPLETE).is_file()),
                  key=_step_of)


def _step_of(path: Path) -> int:
    try:
        return int(path.name.rpartition("-")[2])
    except ValueError:
        return -1


def resume_point(run_dir: Path, recipe: dict[str, Any], main: bool = True) -> Path:
    """The checkpoint to continue from; the ``main`` process removes half-written checkpoints and the
    metrics logged after it."""
    if not is_run_dir(run_dir):
        raise UserError(f"{run_dir}: no run to resume there; drop --resume to start one")
    complete = checkpoints(run_dir)
    if not complete:
        raise UserError(f"{run_dir}: no complete checkpoint to resume from (one is saved every trainer.save_steps "
                        "steps); pass --overwrite instead of --resume to start again")
    _check_same_run(run_dir, recipe)
    latest = complete[-1]
    if not main:
        return latest
    for partial in (run_dir / "checkpoints").glob("checkpoint-*"):
        if partial not in complete:
            log.warning("%s: half-written checkpoint, removed", partial)
            shutil.rmtree(partial)
    step = _step_of(latest)
    rows = [r for r in read_metrics(run_dir) if r.get("step", 0) <= step and "train_runtime" not in r]
    write_jsonl(rows, run_dir / METRICS)  # the resumed run logs the later steps again
    return latest


def _check_same_run(run_dir: Path, recipe: dict[str, Any]) -> None:
    from rlkit.secrets import scrub

    old = {k: v for k, v in read_resolved(run_dir).items() if k != "provenance"}
    changed = [k for k in sorted(set(_flatten(old)) | set(_flatten(scrub(recipe))))
               if _flatten(old).get(k) != _flatten(scrub(recipe)).get(k) and k not in RESUMABLE_CHANGES]
    if changed:
        raise UserError(f"{run_dir}: the recipe changed since this run started ({', '.join(changed[:5])}); "
                        f"resume with the same recipe and --set flags, or start a new run with --output-dir")


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): value}


def checkpoint_callback(keep: int | None = None) -> Any:
    """A TrainerCallback writing COMPLETE into each checkpoint once everything in it is saved, then
    keeping the newest ``keep`` complete checkpoints (``trainer.save_total_limit``).

    rlkit rotates instead of transformers: transformers deletes old checkpoints inside the save, before
    this mark, so a kill in between left no complete checkpoint at all. Here an old checkpoint goes only
    once a newer one is marked complete. ``build_trainer`` hands TRL ``save_total_limit=None`` for this.
    """
    from transformers import TrainerCallback

    class MarkComplete(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if not state.is_world_process_zero:
                return
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if path.is_dir():
                with storage.writing("the checkpoint's completion mark", path / COMPLETE):
                    (path / COMPLETE).write_text(json.dumps({"step": state.global_step, "max_steps": state.max_steps}))
            if keep:
                best = Path(state.best_model_checkpoint).resolve() if state.best_model_checkpoint else None
                complete = checkpoints(Path(args.output_dir).parent)
                for old in complete[:-keep]:
                    if old.resolve() != best:
                        shutil.rmtree(old)

    return MarkComplete()


def time_limit_callback(minutes: float) -> Any:
    """A TrainerCallback (``rlkit train --max-minutes``) ending training at the first step that finishes ``minutes``
    after training began."""
    from transformers import TrainerCallback

    class TimeLimit(TrainerCallback):
        began = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            self.began = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            if time.monotonic() - self.began >= minutes * 60 and not control.should_training_stop:
                log.info("time limit: %.2f min reached after step %d of %d; training ends here", minutes,
                         state.global_step, state.max_steps)
                control.should_training_stop = True

    return TimeLimit()


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_sha() -> str | None:
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() or None


def write_resolved(run_dir: Path, recipe: dict[str, Any], provenance: dict[str, Any],
                   write: bool = True) -> dict[str, Any]:
    """What the run is (secrets masked), written to the run directory when ``write``; returns the document."""
    from rlkit.secrets import scrub

    doc = scrub({**recipe, "provenance": {**provenance, "versions": versions(), "git_sha": git_sha()}})
    if write:
        with storage.writing("the resolved recipe", run_dir / RESOLVED):
            (run_dir / RESOLVED).write_text(yaml.safe_dump(doc, sort_keys=False))
    return doc


def write_trainer_config(run_dir: Path, args: Any) -> dict[str, Any]:
    """The TRL config as the trainer holds it (``args.to_dict()``, after every backend's changes), secrets
    masked: what ran, field by field, where the recipe shows only what was asked."""
    from rlkit.secrets import redact, scrub

    doc = scrub(json.loads(json.dumps(args.to_dict(), default=str)))
    with storage.writing("the trainer config", run_dir / TRAINER_CONFIG):
        (run_dir / TRAINER_CONFIG).write_text(redact(json.dumps(doc, indent=2, sort_keys=True)) + "\n")
    return doc


def read_resolved(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / RESOLVED
    if not path.is_file():
        raise UserError(f"{run_dir}: not a run directory (no {RESOLVED})")
    return yaml.safe_load(path.read_text())


def is_run_dir(path: str | Path) -> bool:
    return (Path(path) / RESOLVED).is_file()


def adapter_dir(path: str | Path) -> Path:
    """The adapter directory of a run directory (``RUN/adapter``) or an adapter directory itself."""
    path = Path(path)
    for candidate in (path, path / "adapter"):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    raise UserError(f"{path}: not a run directory or adapter directory (no adapter_config.json); "
                    "train one first or point at RUN_DIR/adapter")


def holds_adapter(path: str | Path) -> bool:
    """A run directory or an adapter directory (as opposed to a model id or a merged model)."""
    return is_run_dir(path) or (Path(path) / "adapter_config.json").is_file()


def write_jsonl(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Write JSON lines atomically: a reader never sees half a file. Known secrets are masked, and model
    text is kept whole (rlkit.safety.dumps)."""
    from rlkit import safety

    path = Path(path)
    safety.make_parent(path, "output")
    safety.write_text(path, "".join(safety.dumps(row) + "\n" for row in rows))


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The logged rows; a half-written last line (SIGKILL, a full disk) is dropped, not an error."""
    from rlkit.jsonl import read_records

    return read_records(Path(run_dir) / METRICS, torn_tail="drop", missing_ok=True)


def metrics_callback(run_dir: Path):
    """A TrainerCallback appending each of TRL's log dicts to ``metrics.jsonl``, a line whole or not at all."""
    from transformers import TrainerCallback

    from rlkit.jsonl import append_whole

    path = run_dir / METRICS

    class MetricsJsonl(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs:
                return
            if state.is_world_process_zero:
                row = {"step": state.global_step, "epoch": state.epoch,
                       **{k: _jsonable(v) for k, v in logs.items()}}
                with storage.writing("the metrics log", path):
                    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
                    try:
                        append_whole(fd, (json.dumps(row) + "\n").encode())
                    finally:
                        os.close(fd)
            _stop_on_non_finite(logs, state.global_step)  # every rank: they stop together

    return MetricsJsonl()


def _stop_on_non_finite(logs: dict[str, Any], step: int) -> None:
    """Stop the run with one line when the loss logged at ``step`` is NaN or infinite, or the gradient norm
    is NaN (an infinite one is fp16's loss scaler skipping a step, which is normal).

    The log comes before the step's checkpoint is saved, so the run keeps its last good checkpoint.
    Rewards are checked where they are computed (rlkit.rewards), naming the reward function.
    """
    for key, value in logs.items():
        if key not in ("loss", "train_loss", "grad_norm") or not isinstance(value, int | float):
            continue
        if math.isnan(value) or (key != "grad_norm" and not math.isfinite(value)):
            raise UserError(f"step {step}: {key} is {value}; training stopped (the numbers went non-finite: lower "
                            "trainer.learning_rate or check the data and rewards); the last complete checkpoint "
                            "is kept")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
