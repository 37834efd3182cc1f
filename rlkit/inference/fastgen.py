"""Faster generation on CPU for rlkit's own inference paths (eval, rollouts, chat, pairs).

What rlkit does, and why (measured with SmolLM2-135M at batch 32 on a 2-core AVX512-BF16 CPU; see the
README's Performance section and bench/generation.py):

- bf16 weights where the CPU has native bf16 (AVX512-BF16 / AMX: oneDNN's bf16 GEMMs), for
  ``model.dtype: auto``; elsewhere bf16 is emulated and slower, so the model stays as loaded;
- a LoRA adapter merged into an unquantized fp32 base (PEFT's ``merge_and_unload``): each adapted linear is
  one GEMM again instead of three GEMMs and an add. Never into bf16 weights: their rounding step is larger
  than most of a short run's update, so the merged model forgets what it learned (``make demo``'s GRPO
  adapter: 0.55 held-out unmerged, 0.51 merged into bf16, base 0.44). In bf16 the adapter stays beside the
  weights, as it was trained;
- in bf16, eager attention (unless the recipe names ``model.attn_implementation``) and with it a static KV
  cache: torch's CPU SDPA kernel takes half of a bf16 decoding step at batch 32, and the eager
  softmax(QK^T)V plus a preallocated cache cut the step to about half. Measured at batch 32, 64 new
  tokens, on 2 idle cores: plain fp32 127 tokens/s, bf16 SDPA 200, bf16 eager 287, bf16 eager + static
  cache 352; a compiled decoding step added nothing on top (and cost 30 s of compilation). In fp32 neither
  helps, so they are bf16-only;
- prompts batched by length (``length_order``), so a batch pads to similar lengths.

Training is not touched here: a CPU recipe asks for the same two settings for TRL's own generation inside
GRPO (``model.attn_implementation: eager``, ``trainer.cache_implementation: static``).
"""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU runs bf16 matmuls natively: AVX512-BF16 or AMX, allowed to oneDNN (compat.cpu_supports_bf16)."""
    from rlkit.compat import cpu_supports_bf16

    return cpu_supports_bf16()


def for_generation(model: Any, dtype_setting: str = "auto", attn_setting: str | None = None) -> Any:
    """The model as rlkit generates with it on this machine; may return a different object (merged).

    ``dtype_setting`` and ``attn_setting`` are the recipe's ``model.dtype`` and ``model.attn_implementation``:
    an explicit choice is kept.
    """
    import torch

    if getattr(model, "_rlkit_generation_ready", False):
        return model
    device = next(model.parameters()).device
    quantized = getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False) or (
        getattr(getattr(model, "base_model", None), "model", None) is not None
        and getattr(model.base_model.model, "is_loaded_in_4bit", False))
    if device.type == "cpu" and not quantized:
        to_bf16 = dtype_setting == "auto" and cpu_has_native_bf16() and model.dtype == torch.float32
        if hasattr(model, "merge_and_unload") and model.dtype == torch.float32 and not to_bf16:
            model = model.merge_and_unload()  # a PeftModel for inference: fold the LoRA into fp32 weights
        if to_bf16:
            model = model.to(torch.bfloat16)
        if model.dtype == torch.bfloat16 and cpu_has_native_bf16():  # emulated bf16 (AVX2): eager rounds further
            if attn_setting is None:  # from fp32 than SDPA (tests/test_fastgen.py), and the speed is not there
                model.set_attn_implementation("eager")
            if model.config._attn_implementation == "eager" and model.generation_config.cache_implementation is None:
                model.generation_config.cache_implementation = "static"
    model._rlkit_generation_ready = True
    return model


def length_order(lengths: list[int]) -> list[int]:
    """Indices that put prompts of similar length together (longest first: the first batch shows the peak
    memory); results are put back in input order by the caller."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])
