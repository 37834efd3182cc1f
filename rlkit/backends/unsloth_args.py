"""What rlkit passes to Unsloth, worked out without importing it (so it is checked on any machine).

Every recipe field the hf backend honours reaches Unsloth too: the tiny pseudo ids resolve to their
local build (not a Hub lookup), ``dtype`` and ``attn_implementation`` are passed on, and
``lora.modules_to_save`` goes to ``get_peft_model``. vLLM's LoRA kernels exist for a fixed set of
ranks, so the engine's ``max_lora_rank`` is the smallest of them that holds the recipe's ``r``.
"""

from __future__ import annotations

from typing import Any

from rlkit.compat import VLLM_LORA_RANKS
from rlkit.errors import UserError
from rlkit.recipe import LoraSpec, ModelSpec

# Unsloth wants explicit module names; these are the linear layers of Qwen/Llama-style models.
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def vllm_lora_rank(r: int) -> int:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that serves a LoRA of rank ``r``."""
    for rank in VLLM_LORA_RANKS:
        if rank >= r:
            return rank
    raise UserError(f"lora.r {r}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}; lower it or generate "
                    "without vLLM")


def from_pretrained_kwargs(spec: ModelSpec, lora: LoraSpec | None, init_from: str | None, *,
                           fast_inference: bool) -> dict[str, Any]:
    """Keyword arguments for ``FastLanguageModel.from_pretrained``."""
    from rlkit.backends.hf import torch_dtype
    from rlkit.runs import adapter_dir
    from rlkit.tiny import resolve_model_id

    name = str(adapter_dir(init_from)) if init_from else resolve_model_id(spec.name_or_path)
    kwargs: dict[str, Any] = dict(model_name=name, max_seq_length=spec.max_seq_length,
                                  load_in_4bit=spec.load_in_4bit, fast_inference=fast_inference,
                                  gpu_memory_utilization=spec.gpu_memory_utilization)
    if spec.dtype != "auto":
        kwargs["dtype"] = torch_dtype(spec.dtype)  # None (Unsloth's own pick) is what `auto` means there
    if spec.attn_implementation:
        kwargs["attn_implementation"] = spec.attn_implementation
    if lora is not None:
        kwargs["max_lora_rank"] = vllm_lora_rank(lora.r) if fast_inference else lora.r
    return kwargs


def peft_kwargs(lora: LoraSpec, seed: int) -> dict[str, Any]:
    """Keyword arguments for ``FastLanguageModel.get_peft_model``."""
    targets = ALL_LINEAR if lora.target_modules == "all-linear" else lora.target_modules
    kwargs: dict[str, Any] = dict(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets,
                                  bias="none", use_gradient_checkpointing="unsloth", random_state=seed)
    if lora.modules_to_save:
        kwargs["modules_to_save"] = list(lora.modules_to_save)
    return kwargs
