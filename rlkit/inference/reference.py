"""What a model argument names, resolved once for eval, chat, pairs, rollouts and merge.

A target is a recipe file or a run directory (its recorded recipe). A model reference is one of: nothing
(the recipe's base model, or the run's adapter), a run directory, an adapter or checkpoint directory, a
merged model directory, a Hub id, or a pseudo id (``rlkit/tiny-qwen3``, ``rlkit/smollm2-135m-instruct``).
An adapter is always loaded on the base its run recorded (:func:`rlkit.backends.recorded.trained_base`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit import runs

if TYPE_CHECKING:
    from rlkit.recipe import ModelSpec, Recipe


@dataclass(frozen=True)
class ModelRef:
    """A model to load: ``spec`` (the base, as the run trained on it), optionally a LoRA ``adapter`` on it."""

    spec: ModelSpec
    label: str  # how results name the model (file names, tables)
    adapter: Path | None = None
    quantization: dict[str, Any] | None = None  # the bitsandbytes config the run recorded for its base
    plain: bool = False  # a model named by --model (merged dir, Hub id), loaded as it is, never in 4-bit


def resolve_target(target: str | Path, overrides: list[str] | None = None,
                   smoke: bool = False) -> tuple[Recipe, Path | None]:
    """(recipe, run directory or None) for a run directory or a recipe file."""
    from rlkit.recipe import apply_overrides, load_recipe, validate

    target = Path(target)
    if runs.is_run_dir(target):
        # --set applies to the recorded recipe too (e.g. another eval set).
        resolved = apply_overrides(runs.read_resolved(target), overrides or [])
        resolved.pop("provenance", None)
        return validate(resolved, source=str(target / runs.RESOLVED)), target
    return load_recipe(target, overrides, smoke=smoke), None


def model_ref(recipe: Recipe, run_dir: Path | None, model: str | None) -> ModelRef:
    """The model ``--model`` names (or, without it, the run's adapter, or the recipe's base model)."""

    if model is None:
        if run_dir is None:
            return ModelRef(recipe.model, recipe.model.name_or_path)
        return adapter_ref(recipe.model, run_dir / "adapter", f"{run_dir}/adapter")
    if runs.holds_adapter(model):
        adapter = runs.adapter_dir(model)
        return adapter_ref(recipe.model, adapter, str(adapter))
    spec = recipe.model.model_copy(update={"name_or_path": model, "load_in_4bit": False})
    return ModelRef(spec, model, plain=True)


def adapter_ref(spec: ModelSpec, adapter: Path, label: str) -> ModelRef:
    """``adapter`` on the base its run trained on, as the run recorded it (4-bit stays 4-bit, Unsloth's
    pre-quantized checkpoint stays that checkpoint)."""
    from rlkit.backends.recorded import trained_base

    base, quantization = trained_base(spec, run_dir_of(adapter))
    return ModelRef(base, label, adapter=adapter, quantization=quantization)


def run_dir_of(adapter: str | Path) -> Path | None:
    """The run directory holding ``adapter`` (RUN, RUN/adapter or RUN/checkpoints/checkpoint-N), if any."""
    path = Path(adapter)
    return next((d for d in (path, *path.parents[:3]) if runs.is_run_dir(d)), None)


def model_tag(label: str) -> str:
    """A file-name-safe tag for a model label (a path, a Hub id, a served model name or an endpoint URL)."""
    name = label.split("://", 1)[1] if "://" in label else Path(label).name  # http://host:8000/v1: host_8000_v1
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "model"
