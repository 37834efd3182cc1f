"""One case of the GPU check, in its own process: build a random Qwen3 of a size, or train one case and print
its result line. `bench/gpu.py` (the parent) plans the cases, spawns this side and writes the results; the
settings below are what every case shares."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from common import median

STEPS = 6
PROMPTS_PER_STEP = 2
NUM_GENERATIONS = 8
MAX_COMPLETION_LENGTH = 256
SFT_BATCH = 8
MERGE_STEPS = 3
LORA_R = 16
# The public config.json of Qwen/Qwen3-0.6B and Qwen/Qwen3-1.7B (architecture fields).
QWEN3 = dict(vocab_size=151936, max_position_embeddings=40960, rope_theta=1_000_000, rms_norm_eps=1e-6,
             hidden_act="silu", attention_bias=False, attention_dropout=0.0, tie_word_embeddings=True)
SIZES = {
    "0.6b": dict(QWEN3, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                 intermediate_size=3072, head_dim=128),
    "1.7b": dict(QWEN3, hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                 intermediate_size=6144, head_dim=128),
}
# case -> (algorithm, backend, 4-bit base, colocated vLLM)
CASES = {
    "grpo-hf-bf16-lora": ("grpo", "hf", False, False),
    "grpo-hf-qlora-nf4": ("grpo", "hf", True, False),
    "grpo-unsloth-qlora": ("grpo", "unsloth", True, False),
    "grpo-hf-bf16-lora-vllm": ("grpo", "hf", False, True),
    "grpo-unsloth-qlora-vllm": ("grpo", "unsloth", True, True),
    "grpo-hf-qlora-nf4-vllm": ("grpo", "hf", True, True),
    "sft-hf-bf16-lora": ("sft", "hf", False, False),
    "sft-hf-qlora-nf4": ("sft", "hf", True, False),
    "sft-unsloth-qlora": ("sft", "unsloth", True, False),
    "merge-hf-qlora-nf4": ("merge", "hf", True, False),
}
# Cases refused before any GPU time is spent, with the reason (still open in TRL: trl#4973, its fix trl#6922 unmerged).
REFUSED = {
    "grpo-hf-qlora-nf4-vllm": "not run: TRL's colocated vLLM cannot take a 4-bit base's weights (trl#4973: the merged "
                              "LoRA is pushed dequantized into vLLM's packed 4-bit parameters), and `rlkit train` "
                              "refuses it; a 4-bit base generates with Unsloth's engine (grpo-unsloth-qlora-vllm)",
}
_RESULT = "BENCH_RESULT "



def build_model(size: str, directory: Path) -> None:
    """A random Qwen3 of `size` with rlkit's tiny tokenizer, saved in bf16."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from rlkit.tiny import tiny_model_path

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path("tiny"))
    config = Qwen3Config(**{**SIZES[size], "vocab_size": len(tokenizer)}, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    torch.manual_seed(0)
    with torch.device("cuda"):  # initialising 1.7B parameters on the CPU takes minutes
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "parameters.json").write_text(json.dumps(sum(p.numel() for p in model.parameters())))


def recipe(case: str, model_dir: Path) -> dict[str, Any]:
    algorithm, backend, four_bit, vllm = CASES[case]
    model = {"name_or_path": str(model_dir), "backend": backend, "load_in_4bit": four_bit, "dtype": "bfloat16",
             "max_seq_length": 1024, "gpu_memory_utilization": 0.3}
    common = {"learning_rate": 5e-6, "bf16": True, "gradient_checkpointing": True, "logging_steps": 1,
              "save_strategy": "no", "report_to": "none", "seed": 0}
    lora = {"r": LORA_R, "alpha": 2 * LORA_R, "target_modules": "all-linear"}
    if algorithm == "grpo":
        trainer = {**common, "max_steps": STEPS, "num_generations": NUM_GENERATIONS,
                   "per_device_train_batch_size": PROMPTS_PER_STEP * NUM_GENERATIONS, "gradient_accumulation_steps": 1,
                   "max_completion_length": MAX_COMPLETION_LENGTH, "temperature": 1.0, "use_vllm": vllm}
        if vllm and backend == "hf":
            trainer.update(vllm_mode="colocate", vllm_gpu_memory_utilization=0.3)
        return {"name": f"bench_gpu_{case}", "algorithm": "grpo", "model": model, "lora": lora,
                "data": {"task": "gsm8k", "train": {"synthetic": 4 * STEPS * PROMPTS_PER_STEP, "seed": 0}},
                "rewards": [{"name": "gsm8k_correct", "weight": 1.0}, {"name": "answer_format", "weight": 0.2}],
                "trainer": trainer}
    steps = MERGE_STEPS if algorithm == "merge" else STEPS
    trainer = {**common, "max_steps": steps, "per_device_train_batch_size": SFT_BATCH, "max_length": 512,
               "include_num_input_tokens_seen": "non_padding"}
    if algorithm == "merge":
        trainer["learning_rate"] = 2e-3  # an adapter that changes the logits visibly, so the check means something
    return {"name": f"bench_gpu_{case}", "algorithm": "sft", "model": model, "lora": lora,
            "data": {"task": "gsm8k", "train": {"synthetic": 2 * steps * SFT_BATCH, "seed": 0}}, "trainer": trainer}


def child(case: str, model_dir: Path, run_dir: Path) -> None:
    from rlkit import backends

    backends.choose(CASES[case][1])  # Unsloth, where it is the backend, is imported before trl & co.
    import torch
    from transformers import TrainerCallback

    from rlkit.recipe import validate
    from rlkit.train import build_trainer

    algorithm = CASES[case][0]
    cuda = torch.cuda.is_available()  # the CPU test runs the training cases on the tiny model

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def peak_gib() -> float | None:
        return torch.cuda.max_memory_allocated() / 2**30 if cuda else None

    state: dict[str, Any] = {"step": 0, "started": 0.0, "steps": [], "lengths": {}, "tokens": []}
    timers: dict[str, list[tuple[int, float]]] = defaultdict(list)
    if algorithm == "grpo":
        from trl.extras import profiling

        # TRL times its generation call with ProfilingContext but reports the timings only to W&B/MLflow/
        # Trackio; keep them here, by step, as well.
        original = profiling.ProfilingContext._log_metrics

        def keep(self, duration: float) -> None:
            timers[self.name].append((state["step"], duration))
            original(self, duration)

        profiling.ProfilingContext._log_metrics = keep

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, s, control, **kwargs):
            sync()
            state["step"], state["started"] = s.global_step + 1, time.perf_counter()

        def on_step_end(self, args, s, control, **kwargs):
            sync()
            state["steps"].append(time.perf_counter() - state["started"])
            state["tokens"].append(s.num_input_tokens_seen)

        def on_log(self, args, s, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                state["lengths"][s.global_step] = logs["completions/mean_length"]

    spec = validate(recipe(case, model_dir), source=f"bench/gpu.py {case}")
    run_dir.mkdir(parents=True)  # what `rlkit train` does before building the trainer
    trainer, tokenizer = build_trainer(spec, run_dir)
    trainer.add_callback(StepTimer())
    probe = None
    if algorithm == "grpo":  # the step, phase by phase (generation, log-probs, loss, backward, ...)
        import stepprobe

        probe, wrapped = stepprobe.attach(trainer, cuda=cuda)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    timed = state["steps"][1:]
    peak = peak_gib()
    if probe is not None and cuda:  # the probe resets the peak at each phase boundary and keeps the maximum
        peak = max(peak, probe.peak / 2**30)
    result: dict[str, Any] = {"step_seconds": median(timed), "all_step_seconds": state["steps"],
                              "peak_allocated_gib": peak}
    if probe is not None:
        result.update(phases=stepprobe.summary(probe), phase_memory="cuda allocated" if cuda else "process RSS",
                      wrapped=wrapped, trainer_class=f"{type(trainer).__module__}.{type(trainer).__name__}")
    if algorithm == "grpo":
        generation = {name: t for name, t in timers.items() if "generate" in name}
        counted = range(2, STEPS + 1)  # step 1 is the warm-up
        gen_seconds = sum(d for t in generation.values() for step, d in t if step in counted)
        completions = trainer.args.generation_batch_size
        tokens = sum(state["lengths"].get(step, 0.0) * completions for step in counted)
        result.update(tokens_per_second=tokens / gen_seconds if gen_seconds else None,
                      tokens_measure="generated", generation_timer=sorted(generation),
                      completions_per_step=completions)
    else:
        seen = state["tokens"]
        trained = seen[-1] - seen[0] if len(seen) > 1 else 0
        result.update(tokens_per_second=trained / sum(timed) if timed and trained else None, tokens_measure="trained")
    if algorithm == "merge":
        from rlkit.merge import merge
        from rlkit.storage import save_adapter

        save_adapter(trainer, tokenizer, run_dir / "adapter")
        del trainer
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        report = merge(run_dir, run_dir.parent / "merged", show_progress=False)
        m = report["metrics"]
        keys = ("max_abs_logit_diff", "mean_abs_logit_diff", "top1_agreement", "mean_kl", "greedy_match",
                "adapter_effect_max_abs_logit", "decided_flips", "mean_kl_units", "beyond_rounding")
        result = {"merge_seconds": report["seconds"]["total"], "peak_allocated_gib": peak_gib(),
                  **{k: m[k] for k in keys}, "base_mode": report["base_mode"], "dtype": report["dtype"]}
    result["gpu"] = torch.cuda.get_device_name() if cuda else None
    print(_RESULT + json.dumps(result), flush=True)
