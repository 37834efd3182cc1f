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
- prompts batched by length (``length_order``), so a batch pads to similar lengths;
- in float32, grouped-query heads (SmolLM2: 9 query heads share 3 key/value heads) are not copied: on CPU
  transformers copies every key/value head once per query head, in eager attention always and in SDPA whenever
  a padded batch has a mask. rlkit's attention (:func:`sdpa_gqa`: torch's ``enable_gqa``; :func:`eager_gqa`: a
  key/value head times its group of queries at once) computes the same numbers (tests/test_fastgen.py). At
  batch 16 with 700 cached tokens the copies were half of a decoding step on 2 cores (SmolLM2, 0.35 s -> 0.18 s).

Training keeps its model, with one exception: GRPO's float32 CPU model, which generates inside training, attends
with :func:`sdpa_gqa` where the recipe names no attention (``rlkit.train``). A bf16 CPU recipe asks for
eager and a static cache for TRL's own generation inside GRPO (``model.attn_implementation: eager``,
``trainer.cache_implementation: static``); in float32 the search demo drops both (``rlkit.demos.search``).
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
    an explicit choice is kept (an explicit ``eager`` in float32 runs as :func:`eager_gqa`: the same numbers).
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
        grouped_heads_uncopied(model, attn_setting)
    model._rlkit_generation_ready = True
    return model


def grouped_heads_uncopied(model: Any, attn_setting: str | None = None) -> None:
    """A float32 model on CPU attends without copying grouped-query heads: :func:`sdpa_gqa` for transformers' default
    SDPA (not for an explicit ``sdpa``), :func:`eager_gqa` for eager; the same numbers. Also GRPO's model, which
    generates inside training, where the recipe leaves the attention to transformers (``rlkit.train``):
    the gradients agree to float32 summation order."""
    import torch

    if model.dtype != torch.float32 or not _grouped(model.config):
        return
    implementation = model.config._attn_implementation
    if implementation == "sdpa" and attn_setting is None:
        model.set_attn_implementation(_registered(SDPA_GQA))
    elif implementation == "eager" and model.config.model_type in EAGER_GQA_MODELS:
        model.set_attn_implementation(_registered(EAGER_GQA))


SDPA_GQA, EAGER_GQA = "rlkit_sdpa_gqa", "rlkit_eager_gqa"
# Models whose own eager attention is exactly softmax(QK^T * scaling + mask) V (no soft-capping, sinks or windows).
EAGER_GQA_MODELS = ("llama", "qwen2", "qwen3")


def sdpa_gqa(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
             scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any) -> tuple[Any, None]:
    """transformers' SDPA attention, grouped-query heads left to torch (``enable_gqa``) rather than copied; a causal
    prompt pass over a longer cache without a mask, which needs transformers' own handling, goes to it."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_length, kv_length = query.shape[2], key.shape[2]
    if (attention_mask is None and 1 < q_length != kv_length) or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    causal = q_length > 1 and attention_mask is None and (getattr(module, "is_causal", True) if is_causal is None
                                                          else is_causal)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=causal,
                                                           enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def eager_gqa(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float,
              dropout: float = 0.0, **kwargs: Any) -> tuple[Any, Any]:
    """The eager attention of :data:`EAGER_GQA_MODELS`, each key/value head multiplied with its group of query heads
    at once (queries ``[batch, kv_heads, group x queries, dim]``) instead of copied once per query head."""
    import torch

    batch, heads, queries, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    group = heads // kv_heads
    weights = torch.matmul(query.reshape(batch, kv_heads, group * queries, dim), key.transpose(2, 3)) * scaling
    if attention_mask is not None:  # [batch, 1, queries, length]: the same for every head
        mask = attention_mask[:, :, :, :length]
        weights = (weights.view(batch, kv_heads, group, queries, length) + mask[:, :, None]).view(
            batch, kv_heads, group * queries, length)
    weights = torch.nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
    out = torch.matmul(weights, value).view(batch, heads, queries, dim)
    return out.transpose(1, 2).contiguous(), weights.view(batch, heads, queries, length)


@cache
def _registered(name: str) -> str:
    """:func:`sdpa_gqa` or :func:`eager_gqa` registered with transformers (attention, mask) as ``name``."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask, sdpa_mask

    AttentionInterface.register(name, sdpa_gqa if name == SDPA_GQA else eager_gqa)
    AttentionMaskInterface.register(name, sdpa_mask if name == SDPA_GQA else eager_mask)
    return name


def _grouped(config: Any) -> bool:
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    return bool(heads and kv_heads and kv_heads < heads)


def length_order(lengths: list[int]) -> list[int]:
    """Indices that put prompts of similar length together (longest first: the first batch shows the peak
    memory); results are put back in input order by the caller."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])
