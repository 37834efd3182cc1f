"""Memory plan on CPU: the peak resident memory (RSS) of `rlkit train`'s GRPO step, from measured costs.

A GRPO step on CPU alternates generation and the loss forward/backward, so the peak is the floor plus the
larger of the two phases (bench/results/grpo_step_history.md profiles them). Terms, in bytes:

- process: Python, torch, transformers, TRL, PEFT, datasets, rlkit, the tokenizer and the data
- weights in the recipe's dtype (``auto`` trains in float32 on CPU: rlkit/backends/hf.py); LoRA in float32
  with its gradient and AdamW's two moments
- generation: the KV cache of the sequences generated at once, and the prefill: eager attention's L x L
  scores (one layer at a time). With tools, the last turn prefills the episode so far (prompt + completion
  budget).
- loss forward/backward: with gradient checkpointing each layer's input (L x hidden) is kept and one layer
  at a time is recomputed in the backward; without it every layer keeps its activations (``layer_bytes``) and
  eager attention's probabilities (float32 softmax and its copy in the model's dtype). Logits: TRL keeps only
  the completion's (``logits_to_keep``, trl/trainer/grpo_trainer.py:1522 and :1536), in the model's dtype
  (transformers/models/llama/modeling_llama.py:480): the LM head's output, its copy divided by the
  temperature, and the per-row log-softmax kept for the backward (selective_log_softmax, trl/trainer/utils.py:516).
- no LM head copy: the model slices the hidden states to the logits it keeps (``hidden_states[:, -k:, :]``,
  modeling_llama.py:480), and torch's CPU matmul of that strided slice by a frozen head (``should_fold`` in
  aten/src/ATen/native/LinearAlgebra.cpp) materialised the head once per sequence (57 MB for SmolLM2 in bf16,
  0.9 GB for 16 sequences). rlkit's CPU loads make the head's input contiguous first
  (rlkit/backends/hf.py ``contiguous_head_input``), which costs the slice's own size.
- heap: rlkit pins glibc's mmap threshold (rlkit/cpu_memory.py, 4 MiB by default). Tensors below it
  come from glibc's heap, whose freed pages stay in the process while a live block sits above them.

The constants were measured on SmolLM2-135M-Instruct (bf16, eager attention, LoRA r=16 on all linears) with
bench/loss_memory.py (the loss alone, heap threshold 128 KiB) and bench/grpo_step.py (whole steps at the
default threshold); each says where it came from. tests/test_doctor_cpu_plan.py holds the plan of the CPU recipes
to their measured peaks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

GB = 1e9
# RSS after importing torch, transformers, trl, peft, datasets and rlkit.train: 0.69 GB (torch 2.13, trl 1.12);
# at the first step of smol_arith_grpo and smol_calc_grpo (1.03 and 1.04 GB, bench/grpo_step.py at 5ebeb89), less
# the weights and LoRA: 0.75 GB.
PROCESS = 0.75 * GB
# Eager attention, bytes per L x L score and head: kept without checkpointing = float32 softmax + the
# probabilities in the model's dtype (fit of bench/loss_memory.py --no-checkpointing, 2x128..2x512 + 16: 5.9);
# transient while a layer runs forward (7) and while one is recomputed and differentiated (10): 2x1024+16.
ATTN_FORWARD = 7.0
ATTN_BACKWARD = 10.0
ENTROPY_ROWS = 128  # TRL's entropy_from_logits: log-softmax, exp and product of 128 rows at a time
LOGIT_GRADS = 1.6  # logit-sized gradients alive in the backward, besides the kept log-softmax (2x256+768)
# Fitted to smol_arith_grpo at the default 4 MiB threshold (5ebeb89, 2.81 GB then): its peak less the other terms
# was 0.69 GB, 2.35 x its heap-sized activations (``heap``). Unchanged since the LM head stopped copying itself
# (3ab347c), it plans that recipe's new 1.99 GB peak at 2.00, and smol_calc_grpo at -8%, smol_search_grpo at +3%
# (tests/test_doctor_cpu_plan.py). At 128 KiB it is 0, as the 128 KiB peaks of bench/results/grpo_step_history.md say.
HEAP_KEPT = 2.35


@dataclasses.dataclass
class CpuPlan:
    shape: dict[str, Any]
    dtype_bytes: int  # 2 (bf16/fp16) or 4 (float32)
    lora_r: int | None
    lora_targets: str | list[str] = "all-linear"
    micro_batch: int = 8  # sequences per loss forward/backward
    generation_batch: int = 8  # sequences generated at once
    prompt_tokens: int = 256
    completion_tokens: int = 512
    gradient_checkpointing: bool = True
    eager: bool = True  # attention_implementation eager: L x L scores materialised
    tools: bool = False  # an environment's tool turns: the last turn prefills prompt + completion
    heap_threshold: int = 4 * 2**20

    def _targets(self) -> list[str]:
        from rlkit.doctor.memory import _LINEARS

        targets = self.lora_targets
        return list(_LINEARS) if targets == "all-linear" else [t for t in _LINEARS if t in targets]

    def layer_bytes(self) -> float:
        """Activations one decoder layer keeps for the backward, per token (the L x L scores apart).

        Counted from the tensors autograd saves in transformers' Llama layer with PEFT's LoRA (float32
        adapters): the RMSNorms' float32 inputs, q after RoPE and k, v repeated to every head, the MLP's gate,
        SiLU and up outputs, and for each adapted linear its input cast to float32 (its own copy each when the
        base is 16-bit) and the rank-r output. SmolLM2: 37,700 bytes; measured 38,700 (bench/loss_memory.py
        --no-checkpointing, the fit of the four shapes).
        """
        from rlkit.doctor.memory import linear_shapes

        s, d = self.shape, self.dtype_bytes
        h, i, q = s["hidden_size"], s["intermediate_size"], s["num_attention_heads"] * s["head_dim"]
        base = 2 * 4 * h + 3 * d * q + 3 * d * i
        shapes = linear_shapes(s)
        if self.lora_r is None:  # full fine-tune: each linear's input, in the model's dtype, once per input
            return base + d * (h + q + h + i)
        targets = self._targets()
        if d < 4:
            casts = sum(shapes[t][0] for t in targets)
        else:  # no cast: q, k and v share the normed input, gate and up theirs
            groups = [("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",)]
            casts = sum(shapes[g[0]][0] for g in groups if any(t in targets for t in g))
        return base + 4 * casts + 4 * self.lora_r * len(targets)

    def estimate(self) -> dict[str, float]:
        """GB per term; ``generation`` and ``loss`` are each phase's high-water above the floor."""
        from rlkit.doctor.memory import linear_shapes, parameter_counts

        s, d = self.shape, self.dtype_bytes
        h, layers, vocab, heads = s["hidden_size"], s["num_hidden_layers"], s["vocab_size"], s["num_attention_heads"]
        counts = parameter_counts(s)
        if self.lora_r is None:
            trainable = counts["total"] * (4 + 4 + 8)
        else:
            per_layer = sum(self.lora_r * (a + b) for n, (a, b) in linear_shapes(s).items() if n in self._targets())
            trainable = per_layer * layers * (4 + 4 + 8)  # float32 weight, gradient, AdamW's two moments

        # Generation: the last turn's prefill (with tools it re-reads the episode so far) and the KV cache.
        g, prefill_len = self.generation_batch, self.prompt_tokens + (self.completion_tokens if self.tools else 0)
        kv = g * (prefill_len + self.completion_tokens) * 2 * layers * s["num_key_value_heads"] * s["head_dim"] * d
        scores = g * heads * prefill_len ** 2 * ATTN_FORWARD if self.eager else 0.0
        generation = kv + scores

        # Loss forward and backward of one micro-batch.
        b, length = self.micro_batch, self.prompt_tokens + self.completion_tokens
        tokens, per_token = b * length, self.layer_bytes()
        logits = b * (self.completion_tokens + 1) * vocab * d
        entropy = min(ENTROPY_ROWS, b * self.completion_tokens) * vocab * 3 * d
        scores_per_layer = b * heads * length ** 2 if self.eager else 0
        head_and_logits = 3 * logits + entropy
        if self.gradient_checkpointing:
            kept = layers * tokens * h * d
            layer = tokens * per_token
            forward = kept + max(head_and_logits, layer + scores_per_layer * ATTN_FORWARD)
            backward = kept + max(logits * (1 + LOGIT_GRADS), layer + scores_per_layer * ATTN_BACKWARD)
        else:
            kept = layers * (tokens * per_token + scores_per_layer * (4 + (d if d < 4 else 0)))
            forward = kept + head_and_logits
            backward = kept + logits * (1 + LOGIT_GRADS)
        loss = max(forward, backward)

        out = {"process (Python, torch, libraries, data)": PROCESS, "weights": counts["total"] * d,
               "LoRA + AdamW" if self.lora_r else "trainable + AdamW": trainable,
               "generation": generation, "loss forward/backward": loss}
        out["heap kept by glibc"] = self.heap(tokens)
        out = {k: v / GB for k, v in out.items()}
        out["total"] = (sum(v for k, v in out.items() if k not in ("generation", "loss forward/backward"))
                        + max(out["generation"], out["loss forward/backward"]))
        return out

    def tensor_sizes(self) -> list[tuple[int, int]]:
        """(bytes per token, how many) of the tensors behind ``layer_bytes``, by kind: the size class decides
        whether glibc serves a tensor from its heap (below the mmap threshold) or maps it."""
        s, d = self.shape, self.dtype_bytes
        h, i, q = s["hidden_size"], s["intermediate_size"], s["num_attention_heads"] * s["head_dim"]
        sizes = [(4 * h, 2), (d * q, 3), (d * i, 3)]
        if self.lora_r is not None:
            from rlkit.doctor.memory import linear_shapes

            shapes = linear_shapes(s)
            sizes += [(4 * shapes[t][0], 1) for t in self._targets()] + [(4 * self.lora_r, len(self._targets()))]
        return sizes

    def heap(self, tokens: int) -> float:
        """Heap pages glibc keeps, an empirical term: HEAP_KEPT times the bytes of one loss forward's activations
        (``layer_bytes``'s tensors, every layer) whose tensors of ``tokens`` tokens fall below the mmap threshold.

        Why it exists: freed heap chunks return to the OS only from the top of the heap, and checkpointing keeps
        each layer's input (a heap-sized tensor for a small batch) above the chunks that layer freed. Measured
        directly (bench/loss_memory.py, smol_arith_grpo's 16 x 137+20 tokens, 2-3 calls each, at 5ebeb89 when
        the LM head still copied itself per sequence): the loss forward alone peaked 1.04-1.07 GB above its
        starting RSS at 128 KiB and 1.43-1.49 GB at 4 MiB, and left 0-0.07 GB against 0.48-0.60 GB in the
        process after the backward. The whole step shows the same (bench/grpo_step.py at 3ab347c): the RSS at
        the start of steps 1-3 is 0.98, 1.58, 1.75 GB at 4 MiB.
        """
        small = sum(size * n for size, n in self.tensor_sizes() if size * tokens < self.heap_threshold)
        return HEAP_KEPT * small * tokens * self.shape["num_hidden_layers"]


def plan_from(ctx: Any, gpu_plan: Any) -> CpuPlan:
    """The CPU plan of the recipe, from the GPU plan's batch and token counts and the recipe's model settings."""
    from rlkit.cpu_memory import THRESHOLD, threshold_from_env

    spec = ctx.recipe.model
    threshold = threshold_from_env()  # as `rlkit train` reads it; 0: glibc's own, not modeled
    return CpuPlan(shape=gpu_plan.shape, dtype_bytes=2 if spec.dtype in ("bfloat16", "float16") else 4,
                   lora_r=gpu_plan.lora_r, lora_targets=gpu_plan.lora_targets, micro_batch=gpu_plan.micro_batch,
                   generation_batch=gpu_plan.generation_batch, prompt_tokens=gpu_plan.prompt_tokens,
                   completion_tokens=gpu_plan.completion_tokens,
                   gradient_checkpointing=gpu_plan.gradient_checkpointing, eager=spec.attn_implementation == "eager",
                   tools=ctx.recipe.env is not None, heap_threshold=threshold or THRESHOLD)


def ram_bytes() -> float:
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def checks(ctx: Any) -> tuple[list[Any], dict[str, list[dict[str, Any]]]]:
    from rlkit.cpu_memory import threshold_from_env
    from rlkit.doctor import Check
    from rlkit.doctor.lengths import padded_prompt_tokens
    from rlkit.doctor.memory import F, model_shape, plan_for, unknown_model

    recipe = ctx.recipe
    if recipe.algorithm != "grpo" or recipe.model.load_in_4bit:
        what = "a 4-bit base" if recipe.model.load_in_4bit else f"{recipe.algorithm.upper()}"
        return [Check(F, "plan", "skip", f"no CUDA device and no --gpu; the CPU plan is measured for GRPO on a "
                      f"16/32-bit base, not {what}", "--gpu h100-80gb (or a size in GB) for the GPU plan")], {}
    shape = model_shape(recipe.model.name_or_path)
    if shape is None:
        return [unknown_model(ctx)], {}
    plan = plan_from(ctx, plan_for(ctx, shape, padded_prompt_tokens(ctx) or 256))
    est = plan.estimate()
    table = [{"term": k, "GB": round(v, 2)} for k, v in est.items()]
    ram = ram_bytes() / GB
    floor = est["total"] - max(est["generation"], est["loss forward/backward"])
    what = (f"CPU: {'bf16' if plan.dtype_bytes == 2 else 'float32'} weights, "
            f"{'LoRA r=' + str(plan.lora_r) if plan.lora_r else 'full fine-tune'}, loss on {plan.micro_batch} x "
            f"{plan.prompt_tokens}+{plan.completion_tokens} tokens "
            f"({'gradient checkpointing' if plan.gradient_checkpointing else 'no gradient checkpointing'}); "
            f"peak RSS ~{est['total']:.1f} GB (floor {floor:.2f}, generation +{est['generation']:.2f}, "
            f"loss +{est['loss forward/backward']:.2f}) of {ram:.0f} GB RAM")
    if threshold_from_env() == 0:
        what += ("; RLKIT_MMAP_THRESHOLD_KB=0 leaves glibc's heap alone, which the plan does not model (it kept "
                 "1.1 GB more than the 4 MiB default on smol_arith_grpo: bench/results/grpo_step_history.md)")
    data = {"ram_gb": round(ram, 1), "estimate": {k: round(v, 3) for k, v in est.items()}}
    if est["total"] <= 0.8 * ram:
        return [Check(F, "plan", "ok", what, data=data)], {"memory plan": table}
    fix = cpu_suggestion(plan, ram)
    verdict = "warn" if est["total"] <= ram else "fail"
    return [Check(F, "plan", verdict, what + (": tight" if verdict == "warn" else ": does not fit"),
                  fix or "a smaller model or batch, or several changes at once", data=data)], {"memory plan": table}


def cpu_suggestion(plan: CpuPlan, ram_gb: float) -> str | None:
    """The first single change that brings the plan under 80% of the RAM."""
    tries: list[tuple[str, dict[str, Any]]] = []
    if not plan.gradient_checkpointing:
        tries.append(("--set trainer.gradient_checkpointing=true", {"gradient_checkpointing": True}))
    if plan.heap_threshold > 128 * 1024:
        tries.append(("RLKIT_MMAP_THRESHOLD_KB=128 (slower steps)", {"heap_threshold": 128 * 1024}))
    if plan.micro_batch > 1:
        half = max(plan.micro_batch // 2, 1)
        tries.append((f"--set trainer.per_device_train_batch_size={half} (and double gradient_accumulation_steps)",
                      {"micro_batch": half, "generation_batch": min(plan.generation_batch, half)}))
    tries.append((f"--set trainer.max_completion_length={plan.completion_tokens // 2}",
                  {"completion_tokens": plan.completion_tokens // 2}))
    for label, change in tries:
        if dataclasses.replace(plan, **change).estimate()["total"] <= 0.8 * ram_gb:
            return label
    return None
