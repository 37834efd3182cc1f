"""The run directory: what a run was (resolved recipe + provenance), what it logged, what it made.

    RUN/recipe.resolved.yaml   recipe after overrides/smoke, model as loaded, versions, git sha
    RUN/metrics.jsonl          one JSON object per logging step, with `step`
    RUN/checkpoints/           TRL checkpoints
    RUN/adapter/               the final PEFT adapter + tokenizer

merge, eval and analyze read this directory instead of asking the user again.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from rlkit.errors import UserError

RESOLVED = "recipe.resolved.yaml"
METRICS = "metrics.jsonl"
_PACKAGES = ("rlkit", "trl", "transformers", "peft", "torch", "accelerate", "datasets", "bitsandbytes",
             "unsloth", "vllm")


def prepare(run_dir: Path, overwrite: bool) -> Path:
    """Create an empty run directory; refuse to mix a new run into an old one."""
    if run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise UserError(f"{run_dir}: run directory is not empty; pass --overwrite to replace it "
                            "or --output-dir to write elsewhere")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


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


def write_resolved(run_dir: Path, recipe: dict[str, Any], provenance: dict[str, Any]) -> None:
    doc = {**recipe, "provenance": {**provenance, "versions": versions(), "git_sha": git_sha()}}
    (run_dir / RESOLVED).write_text(yaml.safe_dump(doc, sort_keys=False))


def read_resolved(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / RESOLVED
    if not path.is_file():
        raise UserError(f"{run_dir}: not a run directory (no {RESOLVED})")
    return yaml.safe_load(path.read_text())


def is_run_dir(path: str | Path) -> bool:
    return (Path(path) / RESOLVED).is_file()


def holds_adapter(path: str | Path) -> bool:
    """A run directory or an adapter directory (as opposed to a model id or a merged model)."""
    return is_run_dir(path) or (Path(path) / "adapter_config.json").is_file()


def write_jsonl(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Write JSON lines atomically: a reader never sees half a file."""
    import json
    import os

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(partial, path)


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def metrics_callback(run_dir: Path):
    """A TrainerCallback appending each of TRL's log dicts to ``metrics.jsonl``."""
    from transformers import TrainerCallback

    path = run_dir / METRICS

    class MetricsJsonl(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs:
                return
            row = {"step": state.global_step, "epoch": state.epoch,
                   **{k: _jsonable(v) for k, v in logs.items()}}
            with path.open("a") as f:
                f.write(json.dumps(row) + "\n")

    return MetricsJsonl()


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
