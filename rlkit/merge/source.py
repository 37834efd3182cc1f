"""Where an adapter came from: the adapter directory, its run directory, and the base it was trained on."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.errors import UserError

if TYPE_CHECKING:
    from rlkit.recipe import ModelSpec


@dataclass
class Source:
    """What the adapter was trained on, read from the run directory (or the adapter's own config)."""

    adapter: Path
    run_dir: Path | None
    spec: ModelSpec  # how training loaded the base (and prompted the model)
    notes: list[str] = field(default_factory=list)
    # The bitsandbytes config the base was trained under, as recorded (None: rlkit's nf4 or 16-bit).
    quantization: dict[str, Any] | None = None
    # The recipe's model (the 16-bit original that `--base original` merges into).
    recipe_model: str | None = None


def read_source(source: str | Path, base_model: str | None = None) -> Source:
    """The adapter and its training base: from ``recipe.resolved.yaml`` when there is a run directory."""
    from rlkit import runs
    from rlkit.backends.recorded import trained_base
    from rlkit.inference.reference import run_dir_of
    from rlkit.recipe import ModelSpec

    adapter = runs.adapter_dir(source)
    trained_on = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    # RUN, RUN/adapter or RUN/checkpoints/checkpoint-N: the run directory knows whether the base was 4-bit.
    run_dir = run_dir_of(adapter)
    if run_dir is not None:
        resolved = runs.read_resolved(run_dir)
        provenance = resolved.pop("provenance", None) or {}
        spec = _model_spec(ModelSpec, resolved.get("model"), run_dir / runs.RESOLVED)
        if spec.dtype == "auto" and provenance.get("dtype") in ("bfloat16", "float16", "float32"):
            # `auto` resolves per machine: load the base in the dtype training actually used.
            spec = spec.model_copy(update={"dtype": provenance["dtype"]})
        recipe_model = spec.name_or_path
        # The checkpoint training really loaded (Unsloth swaps in its pre-quantized repo) and its quantization.
        spec, quantization = trained_base(spec, run_dir)
        known = [recipe_model, spec.name_or_path, provenance.get("model_loaded"), trained_on]
        notes = []
    else:
        if not trained_on and not base_model:
            raise UserError(f"{adapter}: adapter_config.json names no base model; pass --base-model")
        spec = ModelSpec(name_or_path=trained_on or base_model)
        recipe_model, quantization = spec.name_or_path, None
        known = [trained_on] if trained_on else []
        notes = ["no run directory: base model from adapter_config.json, assumed 16-bit; "
                 "merge a QLoRA adapter from its run directory"]
    if base_model is not None and known and not same_model(base_model, known):
        raise UserError(f"--base-model {base_model!r}: the adapter was trained on {known[0]!r}; merging onto "
                        "another base gives a different model (omit --base-model to use the recorded one)")
    if base_model is not None:
        spec = spec.model_copy(update={"name_or_path": base_model})
    return Source(adapter=adapter, run_dir=run_dir, spec=spec, notes=notes, quantization=quantization,
                  recipe_model=recipe_model)


def _model_spec(cls: type, data: Any, source: Path) -> Any:
    # Only `model:` matters here: a run whose rewards or data cannot be resolved today still merges.
    from pydantic import ValidationError

    try:
        return cls.model_validate(data or {})
    except ValidationError as e:
        err = e.errors()[0]
        raise UserError(f"{source}: model.{'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def same_model(name: str, known: list[str | None]) -> bool:
    """Whether ``name`` is one of the ``known`` names of a model (pseudo ids and paths resolved)."""
    return canonical(name) in {canonical(k) for k in known if k}


def canonical(name: str) -> str:
    """A model name as loaded: a pseudo id's cached build, a local path made absolute."""
    from rlkit.tiny import resolve_model_id

    resolved = resolve_model_id(name)
    path = Path(resolved).expanduser()
    return str(path.resolve()) if path.exists() else resolved

