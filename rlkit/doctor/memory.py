"""Memory plan: will the recipe fit on the target GPU, and if not, which one change makes it fit.

An estimate, term by term, from the model's config (``AutoConfig``, offline; a small table of known
configs for Hub ids that are not cached) and the recipe's settings:

- weights: nf4 (double quant, ~4.13 bits) for the linear layers of a 4-bit base, 16-bit otherwise;
  embeddings and the LM head stay 16-bit (bitsandbytes does not quantize them)
- LoRA (or full) trainable parameters: fp32 weights and gradients plus AdamW's two states (8-bit with
  ``adamw_8bit``); ``modules_to_save`` copies train whole
- activations: with gradient checkpointing, each layer's input kept (Unsloth offloads these to CPU
  RAM) plus one layer recomputed; the logits of the micro-batch in fp32 with their gradient (Unsloth
  computes them in chunks); TRL's GRPO computes them for the completion only (``logits_to_keep``,
  trl/trainer/grpo_trainer.py:1522 and :1536, TRL 1.12.0)
- the reference model when ``beta > 0`` and there is no LoRA (with LoRA the reference is the base
  with the adapter disabled: no copy)
- generation: vLLM colocated reserves ``gpu_memory_utilization`` of the GPU for its weights (shared
  with the trainer under Unsloth) and a KV cache for ``generation_batch_size x (prompt + completion)``
  tokens; plain ``generate`` needs that KV cache for a micro-batch
- CUDA context and allocator slack

Checked against published figures in tests/test_doctor.py (see the README's "Before you launch").
Without a GPU (no ``--gpu``, no CUDA) the doctor plans for this machine's RAM instead: :mod:`.cpu_plan`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlkit.doctor import Check, Context

F = "memory"
GIB = 1024 ** 3
NF4_BYTES = 4.127 / 8  # nf4 with double quantization: 4 bits + 8-bit absmax per 64 + fp32 per 256 blocks
CUDA_CONTEXT_GIB = 1.0
SLACK = 1.10  # allocator fragmentation
UNSLOTH_LOGIT_CHUNK = 2048  # tokens whose logits exist at once under Unsloth's chunked loss

GPUS = {"h200-141gb": 141, "h100-80gb": 80, "h100-94gb": 94, "a100-80gb": 80, "a100-40gb": 40, "l40s-48gb": 48,
        "a6000-48gb": 48, "l4-24gb": 24, "a10g-24gb": 24, "rtx4090-24gb": 24, "rtx3090-24gb": 24,
        "rtx4080-16gb": 16, "t4-16gb": 16, "v100-16gb": 16, "v100-32gb": 32}

# Public config.json values, for Hub ids that are not cached on this machine.
_QWEN3 = dict(vocab_size=151936, num_attention_heads=16, num_key_value_heads=8, head_dim=128)
KNOWN = {
    "Qwen/Qwen3-0.6B": dict(_QWEN3, hidden_size=1024, num_hidden_layers=28, intermediate_size=3072,
                            tie_word_embeddings=True, model_type="qwen3"),
    "Qwen/Qwen3-1.7B": dict(_QWEN3, hidden_size=2048, num_hidden_layers=28, intermediate_size=6144,
                            tie_word_embeddings=True, model_type="qwen3"),
    "Qwen/Qwen3-4B": dict(_QWEN3, hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                          intermediate_size=9728, tie_word_embeddings=True, model_type="qwen3"),
    "Qwen/Qwen3-4B-Instruct-2507": dict(_QWEN3, hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                                        intermediate_size=9728, tie_word_embeddings=True, model_type="qwen3"),
    "Qwen/Qwen3-8B": dict(_QWEN3, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                          intermediate_size=12288, tie_word_embeddings=False, model_type="qwen3"),
    "Qwen/Qwen2.5-1.5B-Instruct": dict(vocab_size=151936, hidden_size=1536, num_hidden_layers=28,
                                       num_attention_heads=12, num_key_value_heads=2, head_dim=128,
                                       intermediate_size=8960, tie_word_embeddings=True, model_type="qwen2"),
    "Qwen/Qwen2.5-3B-Instruct": dict(vocab_size=151936, hidden_size=2048, num_hidden_layers=36,
                                     num_attention_heads=16, num_key_value_heads=2, head_dim=128,
                                     intermediate_size=11008, tie_word_embeddings=True, model_type="qwen2"),
    "meta-llama/Llama-3.1-8B-Instruct": dict(vocab_size=128256, hidden_size=4096, num_hidden_layers=32,
                                             num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                             intermediate_size=14336, tie_word_embeddings=False, model_type="llama"),
    "meta-llama/Llama-3.2-1B-Instruct": dict(vocab_size=128256, hidden_size=2048, num_hidden_layers=16,
                                             num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                                             intermediate_size=8192, tie_word_embeddings=True, model_type="llama"),
    "meta-llama/Llama-3.2-3B-Instruct": dict(vocab_size=128256, hidden_size=3072, num_hidden_layers=28,
                                             num_attention_heads=24, num_key_value_heads=8, head_dim=128,
                                             intermediate_size=8192, tie_word_embeddings=True, model_type="llama"),
    "HuggingFaceTB/SmolLM2-135M-Instruct": dict(vocab_size=49152, hidden_size=576, num_hidden_layers=30,
                                                num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                                                intermediate_size=1536, tie_word_embeddings=True, model_type="llama"),
}
for _base in ("Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-3B"):
    KNOWN[_base] = KNOWN[f"{_base}-Instruct"]
KNOWN["meta-llama/Meta-Llama-3.1-8B-Instruct"] = KNOWN["meta-llama/Llama-3.1-8B-Instruct"]
_SHAPE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "head_dim", "intermediate_size", "tie_word_embeddings", "model_type")


def model_shape(name: str) -> dict[str, Any] | None:
    """The layer sizes of ``name`` from its config (local, cached, or the known table); None if unknown."""
    from rlkit.tiny import resolve_model_id

    resolved = resolve_model_id(name)
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(resolved)
    except (OSError, ValueError):  # not cached / no network / not a model: the table, else unknown
        return dict(KNOWN[name]) if name in KNOWN else None
    config = getattr(config, "text_config", None) or config
    shape = {k: getattr(config, k, None) for k in _SHAPE_KEYS}
    if shape["head_dim"] is None:
        shape["head_dim"] = config.hidden_size // config.num_attention_heads
    if shape["num_key_value_heads"] is None:
        shape["num_key_value_heads"] = config.num_attention_heads
    shape["tie_word_embeddings"] = bool(shape["tie_word_embeddings"])
    return shape


_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def linear_shapes(s: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear layer in one decoder layer (Llama/Qwen layout)."""
    h, q, kv, i = s["hidden_size"], s["num_attention_heads"] * s["head_dim"], \
        s["num_key_value_heads"] * s["head_dim"], s["intermediate_size"]
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def parameter_counts(s: dict[str, Any]) -> dict[str, int]:
    """Parameters by kind: embedding, LM head (0 when tied), linear layers, norms."""
    per_layer_linear = sum(a * b for a, b in linear_shapes(s).values())
    norms = 2 * s["hidden_size"] + (2 * s["head_dim"] if s.get("model_type") == "qwen3" else 0)
    embed = s["vocab_size"] * s["hidden_size"]
    counts = {"embedding": embed, "lm_head": 0 if s["tie_word_embeddings"] else embed,
              "linear": per_layer_linear * s["num_hidden_layers"],
              "norms": norms * s["num_hidden_layers"] + s["hidden_size"]}
    counts["total"] = sum(counts.values())
    return counts


@dataclasses.dataclass
class Plan:
    """The inputs of the estimate; ``estimate`` turns them into GiB per term."""

    shape: dict[str, Any]
    load_in_4bit: bool
    lora_r: int | None
    lora_targets: str | list[str] = "all-linear"
    modules_to_save: list[str] | None = None
    optim_8bit: bool = False
    micro_batch: int = 8  # completions (GRPO) or rows per device per forward/backward
    prompt_tokens: int = 256
    completion_tokens: int = 512
    gradient_checkpointing: bool = True
    generation_batch: int = 8  # sequences generated at once
    vllm: str | None = None  # None | "unsloth" (shared weights) | "trl" (own 16-bit copy)
    vllm_share: float = 0.3
    beta: float = 0.0
    unsloth: bool = False
    completion_logits: bool = False  # TRL's GRPO: logits of the completion tokens only

    def estimate(self) -> dict[str, float]:
        s, counts = self.shape, parameter_counts(self.shape)
        h, layers, vocab = s["hidden_size"], s["num_hidden_layers"], s["vocab_size"]
        io = counts["embedding"] + counts["lm_head"]
        weights = (counts["linear"] * (NF4_BYTES if self.load_in_4bit else 2) + (io + counts["norms"]) * 2)
        state = 4 + 4 + (2 if self.optim_8bit else 8)  # fp32 weight + grad + Adam moments
        if self.lora_r is None:
            trainable = counts["total"] * (2 + 2 + (2 if self.optim_8bit else 8) + 4)  # bf16 w/g, moments, master
        else:
            targets = _LINEARS if self.lora_targets == "all-linear" else [
                t for t in _LINEARS if t in self.lora_targets]
            lora = sum(self.lora_r * (a + b) for name, (a, b) in linear_shapes(s).items() if name in targets)
            trainable = lora * layers * state
            for module in self.modules_to_save or []:
                if module in ("embed_tokens", "lm_head"):
                    trainable += counts["embedding"] * (2 + state)
        tokens = self.micro_batch * (self.prompt_tokens + self.completion_tokens)
        if self.gradient_checkpointing:
            # Unsloth's checkpointing offloads each layer's saved input to CPU RAM; plain HF keeps them on the GPU.
            kept = 0 if self.unsloth else tokens * h * 2 * layers
            acts = kept + tokens * (8 * h + 4 * s["intermediate_size"]) * 2
        else:
            acts = tokens * (16 * h + 4 * s["intermediate_size"]) * 2 * layers
        if self.unsloth:  # Unsloth's own chunked loss, as modeled before; its source was not re-read here
            logit_tokens = min(tokens, UNSLOTH_LOGIT_CHUNK)
        else:
            logit_tokens = self.micro_batch * self.completion_tokens if self.completion_logits else tokens
        logits = logit_tokens * vocab * 4 * 2  # fp32 logits and their gradient
        reference = weights if self.beta > 0 and self.lora_r is None else 0.0
        kv_per_token = 2 * layers * s["num_key_value_heads"] * s["head_dim"] * 2
        kv = self.generation_batch * (self.prompt_tokens + self.completion_tokens) * kv_per_token
        vllm_weights = 0.0 if self.vllm in (None, "unsloth") else (counts["total"] * 2)
        out = {"weights": weights, "trainable + optimizer": trainable, "activations": acts, "logits": logits,
               "reference model": reference, "vLLM weights": vllm_weights, "KV cache": kv}
        out = {k: v / GIB for k, v in out.items()}
        out["CUDA context + slack"] = CUDA_CONTEXT_GIB + (SLACK - 1) * sum(out.values())
        out["total"] = sum(out.values())
        # Training and generation alternate; with plain generate their peaks do not add up.
        train_peak = out["weights"] + out["trainable + optimizer"] + out["activations"] + out["logits"] + \
            out["reference model"]
        gen_peak = out["weights"] + out["trainable + optimizer"] + out["KV cache"]
        if self.vllm is None:
            out["total"] = max(train_peak, gen_peak) + out["CUDA context + slack"]
        out["training"] = train_peak
        out["generation"] = out["vLLM weights"] + out["KV cache"]
        return out

    def fits(self, gpu_gib: float) -> tuple[bool, str]:
        est = self.estimate()
        if self.vllm is None:
            return est["total"] <= gpu_gib, f"needs {est['total']:.1f} GiB of {gpu_gib:.0f}"
        # Colocated vLLM takes its share of the whole GPU up front; training lives in the rest.
        train_room = gpu_gib * (1 - self.vllm_share) - CUDA_CONTEXT_GIB
        vllm_room = gpu_gib * self.vllm_share
        shared = est["weights"] if self.vllm == "unsloth" else 0.0
        train_need = est["training"] * SLACK - shared  # Unsloth's engine holds the shared weights in its share
        gen_need = est["generation"] + shared
        ok = train_need <= train_room and gen_need <= vllm_room
        return ok, (f"training needs {train_need:.1f} of {train_room:.1f} GiB, vLLM {gen_need:.1f} of its "
                    f"{vllm_room:.1f} GiB ({self.vllm_share:g} of {gpu_gib:.0f})")


def parse_gpu(value: str) -> tuple[str, float]:
    from rlkit.errors import UserError

    key = value.strip().lower()
    if key in GPUS:
        return key, GPUS[key] * 0.98  # what the driver leaves to processes
    try:
        gib = float(key.removesuffix("gb").removesuffix("gib"))
    except ValueError:
        raise UserError(f"--gpu {value!r}: use a size in GB or one of {', '.join(GPUS)}") from None
    if not 0 < gib <= 4096:
        raise UserError(f"--gpu {value!r}: a size in GB between 0 and 4096")
    return f"{gib:g} GB", gib


def plan_for(ctx: Context, shape: dict[str, Any], prompt_tokens: int) -> Plan:
    recipe, algo = ctx.recipe, ctx.recipe.algorithm
    backend = recipe.model.backend
    use_vllm = bool(ctx.setting("use_vllm", False))
    unsloth = backend == "unsloth" or (backend == "auto" and recipe.model.load_in_4bit)
    vllm = None if not use_vllm else ("unsloth" if unsloth else "trl")
    if algo == "grpo":
        completion = ctx.setting("max_completion_length", 512)
    elif algo == "ppo":
        completion = ctx.setting("response_length", 53)
    else:  # supervised rows: a whole sequence of up to max_length tokens
        prompt_tokens = int(ctx.setting("max_length", None) or recipe.model.max_seq_length)
        completion = 0
    per_device = int(ctx.setting("per_device_train_batch_size", 8) or 8)
    gen_batch = int(ctx.setting("generation_batch_size", None) or per_device) if algo == "grpo" else per_device
    share = recipe.model.gpu_memory_utilization if vllm == "unsloth" else float(
        ctx.setting("vllm_gpu_memory_utilization", 0.3) or 0.3)
    return Plan(shape=shape, load_in_4bit=recipe.model.load_in_4bit, lora_r=recipe.lora.r if recipe.lora else None,
                lora_targets=recipe.lora.target_modules if recipe.lora else "all-linear",
                modules_to_save=recipe.lora.modules_to_save if recipe.lora else None,
                optim_8bit="8bit" in str(ctx.setting("optim", "adamw_torch")),
                micro_batch=per_device * (2 if algo in ("dpo", "reward") else 1),
                prompt_tokens=prompt_tokens, completion_tokens=int(completion),
                gradient_checkpointing=bool(ctx.setting("gradient_checkpointing", True)),
                generation_batch=gen_batch if algo in ("grpo", "ppo") else 0, vllm=vllm, vllm_share=share,
                beta=float(ctx.setting("beta", 0.0) or 0.0), unsloth=unsloth, completion_logits=algo == "grpo")


def suggestion(plan: Plan, gpu_gib: float) -> str | None:
    """The first single change (in the order people reach for them) that makes the plan fit."""
    tries: list[tuple[str, dict[str, Any]]] = []
    if plan.vllm is not None:
        for share in (0.4, 0.5, 0.6, 0.7, 0.8):
            if share != plan.vllm_share:
                key = ("model.gpu_memory_utilization" if plan.vllm == "unsloth"
                       else "trainer.vllm_gpu_memory_utilization")
                tries.append((f"--set {key}={share}", {"vllm_share": share}))
    if plan.micro_batch > 1:
        tries.append((f"--set trainer.per_device_train_batch_size={max(plan.micro_batch // 2, 1)} (and double "
                      "gradient_accumulation_steps)", {"micro_batch": max(plan.micro_batch // 2, 1)}))
    if plan.generation_batch > 2:
        tries.append((f"fewer generations per batch ({plan.generation_batch // 2} sequences at once: "
                      "num_generations or generation_batch_size)", {"generation_batch": plan.generation_batch // 2}))
    tries.append((f"--set trainer.max_completion_length={plan.completion_tokens // 2}",
                  {"completion_tokens": plan.completion_tokens // 2}))
    if not plan.gradient_checkpointing:
        tries.append(("--set trainer.gradient_checkpointing=true", {"gradient_checkpointing": True}))
    if not plan.load_in_4bit:
        tries.append(("--set model.load_in_4bit=true", {"load_in_4bit": True}))
    if not plan.optim_8bit:
        tries.append(("--set trainer.optim=adamw_8bit", {"optim_8bit": True}))
    for label, change in tries:
        if dataclasses.replace(plan, **change).fits(gpu_gib)[0]:
            return label
    return None


def checks(ctx: Context, gpu: str | None) -> tuple[list[Check], dict[str, list[dict[str, Any]]]]:
    shape = model_shape(ctx.recipe.model.name_or_path)
    if shape is None:
        return [unknown_model(ctx)], {}
    from rlkit.doctor.lengths import padded_prompt_tokens

    plan = plan_for(ctx, shape, padded_prompt_tokens(ctx) or 256)
    est = plan.estimate()
    counts = parameter_counts(shape)
    table = [{"term": k, "GiB": round(v, 2)} for k, v in est.items() if k not in ("training", "generation")]
    size = f"{counts['total'] / 1e9:.2f}B" if counts["total"] >= 1e9 else f"{counts['total'] / 1e6:.1f}M"
    what = (f"{size} parameters, {'nf4' if plan.load_in_4bit else '16-bit'} base, "
            f"{'LoRA r=' + str(plan.lora_r) if plan.lora_r else 'full fine-tune'}, micro-batch {plan.micro_batch} x "
            f"{plan.prompt_tokens + plan.completion_tokens} tokens"
            + (f", vLLM ({plan.vllm}) {plan.vllm_share:g} of the GPU" if plan.vllm else ""))
    if gpu is None:
        from rlkit.backends import cuda_available

        if not cuda_available():  # the doctor plans for this machine's RAM instead (cpu_plan)
            return [Check(F, "plan", "skip", f"{what}: needs ~{est['total']:.1f} GiB; no --gpu given and no CUDA "
                          "device here", "--gpu h100-80gb (or a size in GB)", data={"estimate": est})], \
                {"memory plan": table}
        import torch

        name, gib = torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory / GIB
    else:
        name, gib = parse_gpu(gpu)
    ok, how = plan.fits(gib)
    data = {"gpu": name, "gpu_gib": round(gib, 1), "estimate": {k: round(v, 3) for k, v in est.items()}}
    if ok:
        return [Check(F, "plan", "ok", f"{what}: fits {name}; {how}", data=data)], {"memory plan": table}
    fix = suggestion(plan, gib)
    return [Check(F, "plan", "fail", f"{what}: does not fit {name}; {how}",
                  fix or "a bigger GPU, a smaller model, or several changes at once", data=data)], \
        {"memory plan": table}


def unknown_model(ctx: Context) -> Check:
    return Check(F, "plan", "warn", f"unknown model {ctx.recipe.model.name_or_path!r}: not cached here and not in "
                 "rlkit's table of known configs", "run the doctor where the model is cached")


def published_check(shape_name: str, **plan: Any) -> float:
    """The plan's total (GiB) for a known model; tests compare it with published figures."""
    return Plan(shape=dict(KNOWN[shape_name]), **plan).estimate()["total"]

