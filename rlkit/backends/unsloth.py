"""Unsloth: 4-bit kernels and a colocated vLLM engine (``fast_inference``). CUDA machines only.

This is the only module that imports unsloth, and :func:`rlkit.backends.choose` imports it before
trl/transformers/peft are touched.
"""

from __future__ import annotations

from typing import Any

import unsloth  # noqa: F401  -- must precede trl/transformers/peft
from unsloth import FastLanguageModel

# Unsloth wants explicit module names; these are the linear layers of Qwen/Llama-style models.
_ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def load(spec: Any, lora: Any, init_from: str | None, *, fast_inference: bool, seed: int = 0):
    name = init_from_dir(init_from) if init_from else spec.name_or_path
    kwargs = dict(max_seq_length=spec.max_seq_length, load_in_4bit=spec.load_in_4bit,
                  fast_inference=fast_inference, gpu_memory_utilization=spec.gpu_memory_utilization)
    if lora is not None:
        kwargs["max_lora_rank"] = lora.r
    model, tokenizer = FastLanguageModel.from_pretrained(model_name=name, **kwargs)
    if init_from:
        # A loaded adapter dir is already a PeftModel; get_peft_model again would raise
        # "Your model already has LoRA adapters". Make its LoRA weights trainable instead.
        for pname, param in model.named_parameters():
            if "lora_" in pname:
                param.requires_grad_(True)
        return model, tokenizer
    if lora is not None:
        targets = _ALL_LINEAR if lora.target_modules == "all-linear" else lora.target_modules
        model = FastLanguageModel.get_peft_model(
            model, r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets,
            bias="none", use_gradient_checkpointing="unsloth", random_state=seed)
    return model, tokenizer


def init_from_dir(path: str) -> str:
    from rlkit.backends.hf import adapter_dir

    return str(adapter_dir(path))
