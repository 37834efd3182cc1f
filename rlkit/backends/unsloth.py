"""Unsloth: 4-bit kernels and a colocated vLLM engine (``fast_inference``). CUDA machines only.

This is the only module that imports unsloth, and :func:`rlkit.backends.choose` imports it before
trl/transformers/peft are touched. What it is given is worked out in :mod:`rlkit.backends.unsloth_args`.
"""

from __future__ import annotations

import logging

import unsloth  # noqa: F401  -- must precede trl/transformers/peft
from unsloth import FastLanguageModel

from rlkit.backends.unsloth_args import from_pretrained_kwargs, peft_kwargs
from rlkit.compat import is_peft_adapter_parameter
from rlkit.recipe import LoraSpec, ModelSpec

log = logging.getLogger("rlkit")


def load(spec: ModelSpec, lora: LoraSpec | None, init_from: str | None, *, fast_inference: bool, seed: int = 0):
    kwargs = from_pretrained_kwargs(spec, lora, init_from, fast_inference=fast_inference)
    if "attn_implementation" in kwargs:
        # Unsloth's fast Llama/Qwen path picks its own attention kernel; other architectures honour it.
        log.info("model.attn_implementation %s is passed to Unsloth, whose fast Llama/Qwen models choose "
                 "their own attention kernel", kwargs["attn_implementation"])
    model, tokenizer = FastLanguageModel.from_pretrained(**kwargs)
    if init_from:
        # A loaded adapter dir is already a PeftModel; get_peft_model again would raise
        # "Your model already has LoRA adapters". Make its LoRA weights trainable instead.
        for pname, param in model.named_parameters():
            if is_peft_adapter_parameter(pname):
                param.requires_grad_(True)
        return model, tokenizer
    if lora is not None:
        model = FastLanguageModel.get_peft_model(model, **peft_kwargs(lora, seed))
    return model, tokenizer
