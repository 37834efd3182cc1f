"""GRPO on a GPU: time per step, generated tokens/s and peak GPU memory for each backend rlkit offers.

No downloads: the models are random-initialised Qwen3s with the layer sizes of Qwen3-0.6B and Qwen3-1.7B
(from their public configs), built from `transformers.Qwen3Config`, with rlkit's tiny tokenizer (its
1024-token vocabulary, so the embedding and LM head are far smaller than the real models'; the
transformer body, where the time goes, is the real size). A random model writes random tokens, so
every completion runs to `max_completion_length`: the throughput is that of full-length generation.

Cases, each a fresh process (Unsloth must be imported before trl/transformers/peft, and each peak
memory figure is then that case's alone), each built by rlkit itself (`rlkit.train.build_trainer`
on a recipe):

- `hf-bf16-lora`: transformers + peft, bf16 base, LoRA, HF `generate`
- `hf-qlora-nf4`: bitsandbytes nf4 (double quant) base, LoRA, HF `generate`
- `unsloth-qlora`: Unsloth 4-bit, Unsloth's LoRA, HF `generate` (only where unsloth imports)
- `hf-bf16-lora-vllm`: TRL's colocated vLLM (only where vllm is installed; TRL cannot sync a 4-bit base)
- `unsloth-qlora-vllm`: Unsloth's own colocated vLLM engine, `fast_inference` (only with unsloth and vllm)

Per case: `STEPS` GRPO steps; the first is a warm-up and is not counted. Step time is the median of the
rest; generated tokens/s is the tokens the policy generated divided by the time TRL spent in its
generation call (TRL's profiling timers); peak memory is `torch.cuda.max_memory_allocated` (PyTorch
allocations, vLLM's KV cache included when vLLM allocates it through PyTorch) and the device's memory
in use at the end (`torch.cuda.mem_get_info`, every allocator).

    python bench/gpu.py                 # on a CUDA machine, with `pip install -e ".[gpu]"` for unsloth and vLLM
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from common import PYTHON, ROOT, figure, median, offline_env, table, write

STEPS = 6
PROMPTS_PER_STEP = 2
NUM_GENERATIONS = 8
MAX_COMPLETION_LENGTH = 256
LORA_R = 16
TIMEOUT_S = 1800
# Layer sizes from the public Qwen/Qwen3-0.6B and Qwen/Qwen3-1.7B config.json files.
SIZES = {
    "qwen3-0.6b-sized": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                             intermediate_size=3072, head_dim=128, tie_word_embeddings=True),
    "qwen3-1.7b-sized": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                             intermediate_size=6144, head_dim=128, tie_word_embeddings=True),
}
# case -> (backend, 4-bit base, colocated vLLM generation)
CASES = {
    "hf-bf16-lora": ("hf", False, False),
    "hf-qlora-nf4": ("hf", True, False),
    "unsloth-qlora": ("unsloth", True, False),
    "hf-bf16-lora-vllm": ("hf", False, True),
    "unsloth-qlora-vllm": ("unsloth", True, True),
}
_RESULT = "BENCH_RESULT "


def unavailable(case: str) -> str | None:
    """Why `case` cannot run on this machine, or None."""
    backend, _, vllm = CASES[case]
    if backend == "unsloth" and importlib.util.find_spec("unsloth") is None:
        return "unsloth is not installed"
    if vllm and importlib.util.find_spec("vllm") is None:
        return "vllm is not installed"
    return None


def build_model(size: str, directory: Path) -> int:
    """A random Qwen3 of `size` with rlkit's tiny tokenizer, saved in bf16; returns its parameter count."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from rlkit.tiny import VOCAB_SIZE, tiny_model_path

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path("tiny"))
    if len(tokenizer) != VOCAB_SIZE:
        raise SystemExit(f"the tiny tokenizer has {len(tokenizer)} tokens, the model would have {VOCAB_SIZE}")
    config = Qwen3Config(vocab_size=VOCAB_SIZE, max_position_embeddings=40960, rope_theta=1_000_000, rms_norm_eps=1e-6,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None, **SIZES[size])
    torch.manual_seed(0)
    with torch.device("cuda"):  # initialising 1.7B parameters on the CPU takes minutes
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    parameters = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.empty_cache()
    return parameters


def recipe(case: str, model_dir: Path) -> dict[str, Any]:
    backend, four_bit, vllm = CASES[case]
    trainer: dict[str, Any] = {
        "max_steps": STEPS, "learning_rate": 5e-6, "num_generations": NUM_GENERATIONS,
        "per_device_train_batch_size": PROMPTS_PER_STEP * NUM_GENERATIONS, "gradient_accumulation_steps": 1,
        "max_completion_length": MAX_COMPLETION_LENGTH, "temperature": 1.0, "bf16": True,
        "gradient_checkpointing": True, "logging_steps": 1, "save_strategy": "no", "report_to": "none", "seed": 0,
        "use_vllm": vllm,
    }
    if vllm and backend == "hf":
        trainer.update(vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, vllm_max_model_length=1024)
    return {
        "name": f"bench_gpu_{case}", "algorithm": "grpo",
        "model": {"name_or_path": str(model_dir), "backend": backend, "load_in_4bit": four_bit, "dtype": "bfloat16",
                  "max_seq_length": 1024, "gpu_memory_utilization": 0.3},
        "lora": {"r": LORA_R, "alpha": 2 * LORA_R, "target_modules": "all-linear"},
        "data": {"task": "gsm8k", "train": {"synthetic": 4 * STEPS * PROMPTS_PER_STEP, "seed": 0}},
        "rewards": [{"name": "gsm8k_correct", "weight": 1.0}, {"name": "answer_format", "weight": 0.2}],
        "trainer": trainer,
    }


# ---------------------------------------------------------------------------------------------
# One case (child process)


def child(case: str, model_dir: Path, run_dir: Path) -> None:
    from rlkit import backends

    backends.choose(CASES[case][0])  # Unsloth, where it is the backend, is imported before trl & co.
    import torch
    from transformers import TrainerCallback
    from trl.extras import profiling

    from rlkit.recipe import validate
    from rlkit.train import build_trainer

    state: dict[str, Any] = {"step": 0, "started": 0.0, "steps": [], "lengths": {}}
    # TRL times its generation call (and rewards, weight syncs) with ProfilingContext but reports the timings
    # only to W&B/MLflow/Trackio; keep them here, by step, as well.
    timers: dict[str, list[tuple[int, float]]] = defaultdict(list)
    original = profiling.ProfilingContext._log_metrics

    def keep(self, duration: float) -> None:
        timers[self.name].append((state["step"], duration))
        original(self, duration)

    profiling.ProfilingContext._log_metrics = keep

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, s, control, **kwargs):
            torch.cuda.synchronize()
            state["step"], state["started"] = s.global_step + 1, time.perf_counter()

        def on_step_end(self, args, s, control, **kwargs):
            torch.cuda.synchronize()
            state["steps"].append(time.perf_counter() - state["started"])

        def on_log(self, args, s, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                state["lengths"][s.global_step] = logs["completions/mean_length"]

    spec = validate(recipe(case, model_dir), source=f"bench/gpu.py {case}")
    run_dir.mkdir(parents=True)  # what `rlkit train` does before building the trainer
    trainer, _ = build_trainer(spec, run_dir)
    trainer.add_callback(StepTimer())
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    free, total = torch.cuda.mem_get_info()

    generation = {name: t for name, t in timers.items() if "generate" in name}
    counted = range(2, STEPS + 1)  # step 1 is the warm-up
    gen_seconds = sum(d for t in generation.values() for step, d in t if step in counted)
    completions = trainer.args.generation_batch_size
    tokens = sum(state["lengths"].get(step, 0.0) * completions for step in counted)
    result = {
        "case": case, "step_seconds": median(state["steps"][1:]), "all_step_seconds": state["steps"],
        "generated_tokens_per_second": tokens / gen_seconds if gen_seconds else None,
        "generation_timer": sorted(generation), "generation_seconds_per_step": gen_seconds / len(counted),
        "completions_per_step": completions, "mean_completion_length": tokens / completions / len(counted),
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "device_in_use_gib": (total - free) / 2**30, "gpu": torch.cuda.get_device_name(),
    }
    print(_RESULT + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------------------------
# All cases (parent process)


def spawn(case: str, model_dir: Path, run_dir: Path) -> dict[str, Any]:
    try:
        done = subprocess.run([PYTHON, __file__, "--child", case, str(model_dir), str(run_dir)], cwd=ROOT,
                              env=offline_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"case": case, "error": f"timed out after {TIMEOUT_S}s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith(_RESULT)]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        sys.stderr.write(done.stderr[-4000:])
        return {"case": case, "error": f"exit {done.returncode}: {tail[0][:300]}"}
    return json.loads(lines[-1].removeprefix(_RESULT))


def main() -> None:
    import torch

    if not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA GPU on this machine, nothing measured (run it where `torch.cuda.is_available()`)")
        return
    results: dict[str, list[dict[str, Any]]] = {}
    parameters: dict[str, int] = {}
    skipped = {case: why for case in CASES if (why := unavailable(case))}
    with tempfile.TemporaryDirectory(prefix="rlkit-bench-gpu-") as tmp:
        for size in SIZES:
            model_dir = Path(tmp) / size
            parameters[size] = build_model(size, model_dir)
            results[size] = []
            for case in CASES:
                if case in skipped:
                    continue
                run_dir = Path(tmp) / f"run-{size}-{case}"
                results[size].append(spawn(case, model_dir, run_dir))
                shutil.rmtree(run_dir, ignore_errors=True)
                print(f"{size} {case}: {results[size][-1]}", flush=True)
            shutil.rmtree(model_dir)
    gpu = next((r["gpu"] for cases in results.values() for r in cases if "gpu" in r), torch.cuda.get_device_name())
    report(results, parameters, skipped, gpu)


def report(results: dict[str, list[dict[str, Any]]], parameters: dict[str, int], skipped: dict[str, str],
           gpu: str) -> None:
    """Write `results/gpu.{json,md}` from the cases' results (a failed case is a row with its error)."""
    rows, figures = [], []
    for size, cases in results.items():
        for r in cases:
            if "error" in r:
                rows.append([size, r["case"], "-", "-", "-", "-", r["error"]])
                continue
            tokens_per_second = r["generated_tokens_per_second"]  # None where TRL's generation timer was not seen
            rows.append([size, r["case"], r["step_seconds"], "-" if tokens_per_second is None else tokens_per_second,
                         r["peak_allocated_gib"], r["device_in_use_gib"], ""])
            figures.append(figure(f"{size} {r['case']}: GRPO step", r["step_seconds"], "s", digits=2))
            if tokens_per_second is not None:
                figures.append(figure(f"{size} {r['case']}: generated tokens/s", tokens_per_second, "tokens/s",
                                      digits=0))
            figures.append(figure(f"{size} {r['case']}: peak GPU memory", r["peak_allocated_gib"], "GiB", digits=2))
    write("gpu", f"GRPO on a GPU ({gpu})", figures,
          [table(f"{STEPS - 1} timed GRPO steps after a warm-up; {PROMPTS_PER_STEP} prompts x {NUM_GENERATIONS} "
                 f"generations of {MAX_COMPLETION_LENGTH} tokens per step; LoRA r={LORA_R}",
                 ["model", "case", "step s (median)", "generated tokens/s", "peak allocated GiB",
                  "device in use GiB", "error"], rows)],
          what="GRPO step time, generated tokens/s and peak GPU memory for rlkit's backends on random-initialised "
               "Qwen3-0.6B- and 1.7B-sized models (the tiny tokenizer's 1024-token vocabulary).",
          details={"gpu": gpu, "parameters": parameters, "results": results, "skipped": skipped},
          notes=[f"skipped {case}: {why}" for case, why in skipped.items()]
          + [f"{size}: {n / 1e6:.0f}M parameters (1024-token vocabulary)" for size, n in parameters.items()],
          reproduce="Reproduce: `python bench/gpu.py` on a CUDA machine (`pip install -e \".[gpu]\"` adds unsloth "
                    "and vLLM).")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
    else:
        main()
