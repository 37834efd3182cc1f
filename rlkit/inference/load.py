"""The one loader for rlkit's own inference: a :class:`~rlkit.inference.reference.ModelRef` as a model and
tokenizer, always on the hf backend (batched ``generate``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.inference.reference import ModelRef, model_ref

if TYPE_CHECKING:
    from rlkit.recipe import ModelSpec, Recipe


def load(ref: ModelRef) -> tuple[Any, Any]:
    """(model, tokenizer) as ``ref`` names them; an adapter's tokenizer is the one its trainer saved."""
    from rlkit.backends import hf

    if ref.adapter is None:
        return hf.load(ref.spec)
    return with_adapter(ref.spec, ref.adapter, ref.quantization), hf.load_tokenizer(str(ref.adapter))


def with_adapter(spec: ModelSpec, adapter: Path, quantization: dict[str, Any] | None = None) -> Any:
    """``adapter`` (frozen) on the base ``spec`` loads, with the run's recorded ``quantization``."""
    from rlkit.backends import hf

    base, _ = hf.load(spec, quantization=quantization)
    return hf.attach_adapter(base, adapter, trainable=False)


def load_for_generation(recipe: Recipe, run_dir: Path | None, model: str | None) -> tuple[Any, Any, str]:
    """(model, tokenizer, label) for what eval, chat, pairs and rollouts generate with, made ready for fast
    generation on this machine (:mod:`rlkit.inference.fastgen`)."""
    from rlkit.inference.fastgen import for_generation

    ref = model_ref(recipe, run_dir, model)
    lm, tokenizer = load(ref)
    return for_generation(lm, recipe.model.dtype, recipe.model.attn_implementation), tokenizer, ref.label
