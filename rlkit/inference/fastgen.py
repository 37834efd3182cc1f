"""Faster generation on CPU for rlkit's own inference paths (eval, rollouts, chat, pairs).

What rlkit does, and why (measured with SmolLM2-135M at batch 32 on a 2-core AVX512-BF16 CPU; see the
README's Performance section and bench/generation.py):

- bf16 weights where the CPU has native bf16 (AVX512-BF16 / AMX: oneDNN's bf16 GEMMs): 1.4-1.6x fp32 in
  CPU time; elsewhere bf16 is emulated and slower, so the model stays as loaded;
- a LoRA adapter merged into an unquantized base (PEFT's ``merge_and_unload``): each adapted linear is one
  GEMM again instead of three GEMMs and an add;
- prompts batched by length (``length_order``), so a batch pads to similar lengths.

A static KV cache measured no faster (slower in fp32), so none is set. It applies only to models loaded for
inference with ``model.dtype: auto``; an explicit dtype is kept. Training (and TRL's own generation inside
GRPO) is not touched here.
"""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU runs bf16 matmuls natively (oneDNN's check: AVX512-BF16 or AMX)."""
    from rlkit.compat import cpu_supports_bf16

    return cpu_supports_bf16()


def for_generation(model: Any, dtype_setting: str = "auto") -> Any:
    """The model as rlkit generates with it on this machine; may return a different object (merged)."""
    import torch

    if getattr(model, "_rlkit_generation_ready", False):
        return model
    device = next(model.parameters()).device
    quantized = getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False) or (
        getattr(getattr(model, "base_model", None), "model", None) is not None
        and getattr(model.base_model.model, "is_loaded_in_4bit", False))
    if device.type == "cpu" and dtype_setting == "auto" and not quantized:
        if hasattr(model, "merge_and_unload"):  # a PeftModel for inference: fold the LoRA into the weights
            model = model.merge_and_unload()
        if cpu_has_native_bf16() and model.dtype == torch.float32:
            model = model.to(torch.bfloat16)
    model._rlkit_generation_ready = True
    return model


def length_order(lengths: list[int]) -> list[int]:
    """Indices that put prompts of similar length together (longest first: the first batch shows the peak
    memory); results are put back in input order by the caller."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])
