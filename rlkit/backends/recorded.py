"""The base a run really trained on, as ``rlkit train`` recorded it, for merge, eval and rollouts.

A recipe names the model it asks for; the backend may load another (Unsloth swaps a ``load_in_4bit``
request for its pre-quantized ``unsloth/...-bnb-4bit`` checkpoint, with its own choice of modules kept
16-bit). The run directory's provenance holds ``base_model``: the checkpoint loaded, its quantization
config and dtype (:func:`rlkit.backends.hf.loaded_base`). Everything that loads an adapter again
starts from that, never from the recipe's name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_DTYPES = ("bfloat16", "float16", "float32")


def trained_base(spec: Any, run_dir: str | Path | None) -> tuple[Any, dict[str, Any] | None]:
    """``(spec, quantization)``: ``spec`` pointed at the base the run loaded, and that base's recorded
    bitsandbytes config (None: 16-bit, or a run recorded before rlkit kept it)."""
    from rlkit import runs

    if run_dir is None or not runs.is_run_dir(run_dir):
        return spec, None
    provenance = runs.read_resolved(run_dir).get("provenance") or {}
    base = provenance.get("base_model")
    if not isinstance(base, dict) or not base.get("name_or_path"):
        return spec, None
    update: dict[str, Any] = {"name_or_path": base["name_or_path"]}
    if spec.dtype == "auto" and base.get("dtype") in _DTYPES:
        update["dtype"] = base["dtype"]  # `auto` resolves per machine: use what training used
    quantization = base.get("quantization") or None
    if quantization is not None and quantization.get("quant_method") not in (None, "bitsandbytes"):
        quantization = None  # only bitsandbytes configs are rebuilt; others come from the checkpoint itself
    update["load_in_4bit"] = bool(quantization and quantization.get("load_in_4bit"))
    return spec.model_copy(update=update), quantization

