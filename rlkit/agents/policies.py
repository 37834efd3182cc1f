"""Choosing the policy: an endpoint, vLLM on this GPU, or a local hf model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.errors import UserError

if TYPE_CHECKING:
    from rlkit.recipe import Recipe


def make_policy(recipe: Recipe, run_dir: Path | None, *, model: str | None = None, endpoint: str | None = None,
                api_key: str | None = None, served_model: str | None = None, backend: str = "hf",
                temperature: float = 0.0, max_new_tokens: int | None = None, timeout: float = 120.0,
                retries: int = 2) -> tuple[Any, str]:
    """(policy, label) for an endpoint, vLLM on this GPU, or a local hf model (run dir, adapter, merged or base)."""
    max_new_tokens = max_new_tokens or recipe.eval.max_new_tokens
    if endpoint:
        return endpoint_policy(endpoint, api_key=api_key, served_model=served_model, max_new_tokens=max_new_tokens,
                               temperature=temperature, timeout=timeout, retries=retries)
    if backend == "vllm":
        return vllm_policy(recipe, run_dir, model, max_new_tokens=max_new_tokens, temperature=temperature)
    if backend != "hf":
        raise UserError(f"--backend {backend!r}: use hf or vllm")
    from rlkit.agents.hf import HFPolicy
    from rlkit.inference.load import load_for_generation

    lm, tokenizer, label = load_for_generation(recipe, run_dir, model)
    return HFPolicy(lm, tokenizer, chat_template_kwargs=recipe.model.chat_template_kwargs,
                    max_new_tokens=max_new_tokens, temperature=temperature, batch_size=recipe.eval.batch_size), label


def endpoint_policy(endpoint: str, *, api_key: str | None, served_model: str | None, max_new_tokens: int,
                    temperature: float, timeout: float, retries: int) -> tuple[Any, str]:
    """The endpoint, checked by one preflight request; labelled with the served model, not host:port."""
    from rlkit import secrets
    from rlkit.agents.endpoint import EndpointPolicy

    key = api_key or os.environ.get("OPENAI_API_KEY")  # read, never written anywhere
    secrets.register(key)  # masked in logs, errors and trajectories from here on
    # The recipe's chat_template_kwargs are the student's; a teacher endpoint gets its own defaults.
    policy = EndpointPolicy(endpoint, api_key=key, served_model=served_model, max_new_tokens=max_new_tokens,
                            temperature=temperature, timeout=timeout, max_retries=retries)
    return policy, policy.preflight()


def vllm_setup(recipe: Recipe, run_dir: Path | None, model: str | None) -> tuple[dict[str, Any], Any, str]:
    """(``engine`` kwargs, tokenizer, label) for vLLM on this GPU: a base or merged model, or the base the run
    recorded with the adapter as a LoRA, in the dtype the hf backend loads it in. The label says vLLM, so its
    results never replace the hf backend's."""
    from rlkit.agents.vllm import require_vllm
    from rlkit.backends import hf
    from rlkit.inference.reference import model_ref
    from rlkit.tiny import resolve_model_id

    require_vllm()
    ref = model_ref(recipe, run_dir, model)
    base = ref.spec.name_or_path if ref.plain else resolve_model_id(ref.spec.name_or_path)
    tokenizer = hf.load_tokenizer(str(ref.adapter) if ref.adapter else base)
    # A QLoRA adapter is served on a bitsandbytes 4-bit base, as it was trained (vLLM quantizes a 16-bit
    # checkpoint itself and reads a pre-quantized one's config).
    four_bit = ref.spec.load_in_4bit or ref.quantization is not None
    kwargs = {"model_path": base, "adapter": str(ref.adapter) if ref.adapter else None,
              "max_lora_rank": recipe.lora.r if recipe.lora else 16, "max_model_len": recipe.model.max_seq_length,
              "quantization": "bitsandbytes" if four_bit else None, "dtype": hf.torch_dtype(ref.spec.dtype)}
    return kwargs, tokenizer, f"{ref.label}@vllm"


def vllm_policy(recipe: Recipe, run_dir: Path | None, model: str | None, *, max_new_tokens: int,
                temperature: float) -> tuple[Any, str]:
    """vLLM on this GPU as the agent's policy."""
    from rlkit.agents.vllm import VLLMPolicy

    kwargs, tokenizer, label = vllm_setup(recipe, run_dir, model)
    base = kwargs.pop("model_path")
    policy = VLLMPolicy(base, tokenizer, chat_template_kwargs=recipe.model.chat_template_kwargs,
                        max_new_tokens=max_new_tokens, temperature=temperature, **kwargs)
    return policy, label
