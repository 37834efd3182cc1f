"""Folding the adapter into its base and saving a plain transformers model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlkit.recipe import ModelSpec


def load_base(spec: ModelSpec, mode: str, *, quantization: dict[str, Any] | None = None, original: str | None = None):
    """The base in float32, as the adapter saw it (``dequantized``) or as published (``original``).

    Always on the CPU: a float32 copy takes 4 bytes per parameter (28 GB for a 7B model), more than many
    GPUs hold, and merging is a few additions per weight, not worth a GPU. A 4-bit base is loaded with an
    explicit CPU ``device_map`` (see :func:`rlkit.backends.hf.device_map`).
    """
    import torch

    from rlkit.backends import hf

    if spec.load_in_4bit and mode == "dequantized":
        # The same bitsandbytes config (recorded, or rlkit's nf4) and compute dtype as training.
        model, _ = hf.load(spec, quantization=quantization, device="cpu")
        model.dequantize(dtype=torch.float32)
        return _plain(model.to(torch.float32))
    name = original if spec.load_in_4bit and original else spec.name_or_path
    model, _ = hf.load(spec.model_copy(update={"name_or_path": name, "load_in_4bit": False, "dtype": "float32"}),
                       device="cpu")
    return model


def _plain(model: Any):
    """The same weights in a model built from its config alone.

    A model loaded from a pre-quantized checkpoint (Unsloth's ``*-bnb-4bit``) keeps the loader's weight
    conversions after ``dequantize()``, and ``save_pretrained`` then fails trying to reverse them
    (transformers 5: ``Bnb4bitDeserialize.reverse_op`` raises NotImplementedError).
    """
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), strict=True)
    plain.generation_config = copy.deepcopy(model.generation_config)
    return plain


def merge_adapter(model: Any, adapter: Path):
    """LoRA deltas folded into the weights; ``modules_to_save`` replace their modules (PEFT unties
    tied embeddings in the config when the adapter changed one side)."""
    from rlkit.backends import hf

    return hf.attach_adapter(model, adapter, trainable=False).merge_and_unload(safe_merge=True)


def save(model: Any, adapter: Path, out: Path, dtype: str) -> None:
    """Safetensors weights, config and generation config, plus the tokenizer the trainer saved."""
    from transformers import AutoTokenizer

    from rlkit.backends import hf

    model.to(hf.torch_dtype(dtype)).save_pretrained(out)  # safetensors
    AutoTokenizer.from_pretrained(str(adapter)).save_pretrained(out)

