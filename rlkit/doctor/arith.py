"""Config arithmetic: TRL's batch rules, steps per epoch, generations and tokens per step, time per step.

TRL's own config class judges divisibility (a refusal is shown verbatim); the rest is arithmetic on the
settings it resolved. The time per step comes from rlkit's bench figures (``bench/results``) where one
matches this recipe's shape, scaled linearly by tokens per step; otherwise it says so.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rlkit.doctor import Check, Context

F = "config"
BENCH_DIR = Path(__file__).resolve().parent.parent.parent / "bench" / "results"


def checks(ctx: Context) -> list[Check]:
    cfg, why = ctx.config
    if cfg is None:
        return [Check(F, "trl config", "fail", why, _fix(why))]
    algo = ctx.recipe.algorithm
    out = [Check(F, "trl config", "ok", f"{type(cfg).__name__} accepts the trainer block")]
    if algo == "grpo":
        out += _grpo(ctx, cfg)
    elif algo in ("sft", "dpo", "reward"):
        out += _supervised(ctx, cfg)
    elif algo == "ppo":
        out.append(Check(F, "batch", "ok", f"{cfg.total_episodes or '?'} episodes, batch "
                         f"{cfg.per_device_train_batch_size} x {cfg.gradient_accumulation_steps} accumulation, "
                         f"{cfg.num_ppo_epochs} PPO epochs per batch"))
    return out


def _fix(why: str) -> str:
    if "num_generations" in why or "generation_batch_size" in why:
        return ("make per_device_train_batch_size x gradient_accumulation_steps x processes a multiple of "
                "num_generations (per_device_train_batch_size counts completions)")
    return "see TRL's message; the key is under `trainer:`"


def _steps(cfg: Any, per_epoch: int) -> int:
    if cfg.max_steps and cfg.max_steps > 0:
        return cfg.max_steps
    return math.ceil(per_epoch * cfg.num_train_epochs)


def _dataset_size(ctx: Context) -> int | None:
    return len(ctx.raw_rows)


def _grpo(ctx: Context, cfg: Any) -> list[Check]:
    procs = cfg.world_size
    per_micro = cfg.per_device_train_batch_size * procs
    per_opt = per_micro * cfg.gradient_accumulation_steps  # completions per optimizer step
    gen_batch = cfg.generation_batch_size
    prompts_per_gen = gen_batch // cfg.num_generations
    prompts_per_opt = per_opt / cfg.num_generations
    n = _dataset_size(ctx)
    per_epoch = math.ceil(n / prompts_per_opt) if n else 0
    steps = _steps(cfg, per_epoch)
    epochs = steps / per_epoch if per_epoch else 0.0
    from rlkit.doctor.lengths import mean_prompt_tokens

    prompt_tokens = mean_prompt_tokens(ctx)
    completion = cfg.max_completion_length
    tokens = per_opt * ((prompt_tokens or 0) + completion)
    data = {"processes": procs, "completions_per_step": per_opt, "prompts_per_step": prompts_per_opt,
            "generation_batch_size": gen_batch, "prompts_per_generation": prompts_per_gen,
            "steps_per_generation": cfg.steps_per_generation, "dataset_rows": n, "steps_per_epoch": per_epoch,
            "total_steps": steps, "epochs": round(epochs, 2), "mean_prompt_tokens": prompt_tokens,
            "max_tokens_per_step": tokens}
    out = [Check(F, "batch", "ok",
                 f"{per_opt} completions per optimizer step = {cfg.per_device_train_batch_size} per device x "
                 f"{cfg.gradient_accumulation_steps} accumulation x {procs} process(es) = {prompts_per_opt:g} "
                 f"prompts x "
                 f"{cfg.num_generations} generations; one generation batch of {gen_batch} ({prompts_per_gen} prompts) "
                 f"serves {cfg.steps_per_generation} step(s)", data=data)]
    if prompts_per_opt != int(prompts_per_opt):
        out[-1].verdict = "warn"
        out[-1].fix = "an optimizer step splits a prompt's group; make the step a multiple of num_generations"
    out.append(Check(F, "schedule", "warn" if epochs > 3 else "ok",
                     f"{n} prompts, {per_epoch} steps per epoch, {steps} steps = {epochs:.2f} epochs; up to "
                     f"{tokens:,} tokens per step ({per_opt} x ({prompt_tokens} prompt + {completion} completion))",
                     "more than 3 passes over the prompts invites memorizing them: add data or cut max_steps"
                     if epochs > 3 else "", data=data))
    out.append(_time(ctx, cfg, tokens, steps))
    return out


def _supervised(ctx: Context, cfg: Any) -> list[Check]:
    procs = cfg.world_size
    per_opt = cfg.per_device_train_batch_size * procs * cfg.gradient_accumulation_steps
    if ctx.recipe.algorithm == "dpo" and ctx.recipe.pairs is not None and ctx.recipe.data.train.synthetic is None:
        return [Check(F, "batch", "ok", f"{per_opt} pairs per optimizer step; pairs come from `rlkit pairs`")]
    n = _dataset_size(ctx)
    per_epoch = math.ceil(n / per_opt)
    steps = _steps(cfg, per_epoch)
    limit = getattr(cfg, "max_length", None)
    data = {"rows_per_step": per_opt, "dataset_rows": n, "steps_per_epoch": per_epoch, "total_steps": steps}
    return [Check(F, "batch", "ok", f"{per_opt} rows per optimizer step = {cfg.per_device_train_batch_size} x "
                  f"{cfg.gradient_accumulation_steps} accumulation x {procs} process(es); {n} rows, {per_epoch} steps "
                  f"per epoch, {steps} steps; up to {per_opt * (limit or 0):,} tokens per step", data=data)]



def bench_figures() -> dict[str, dict[str, Any]]:
    """Every figure in bench/results/*.json, by name (empty when the bench pages are not shipped)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(BENCH_DIR.glob("*.json")):
        page = json.loads(path.read_text())
        for fig in page.get("figures", []):
            out[fig["figure"]] = {**fig, "bench": page.get("name"), "details": page.get("details", {}),
                                  "machine": page.get("machine", {})}
    return out


# bench/gpu.py's shapes: 2 prompts x 8 generations x 256 completion tokens per step (plus ~80 prompt tokens).
_GPU_BENCH_TOKENS = 16 * (80 + 256)
_GPU_BENCH_LAYERS = {(1024, 28): "qwen3-0.6b-sized", (2048, 28): "qwen3-1.7b-sized"}


def _time(ctx: Context, cfg: Any, tokens: int, steps: int) -> Check:
    from rlkit.backends import cuda_available

    figures = bench_figures()
    if ctx.smoke and not cuda_available() and "grpo: rlkit / TRL script wall time" in figures:
        note = figures["grpo: rlkit / TRL script wall time"].get("note", "")  # "8 steps: 3.55s vs 2.07s"
        bench_steps, _, rest = note.partition(" steps: ")
        seconds = float(rest.partition("s")[0]) / int(bench_steps)
        return Check(F, "time per step", "ok", f"~{seconds:.2f}s per step, {seconds * steps:.0f}s in all "
                     "(bench/results/overhead: the --smoke GRPO recipe on 2 CPU cores)",
                     data={"seconds_per_step": round(seconds, 3)})
    from rlkit.doctor.memory import model_shape

    shape = model_shape(ctx.recipe.model.name_or_path)
    size = _GPU_BENCH_LAYERS.get((shape.get("hidden_size"), shape.get("num_hidden_layers"))) if shape else None
    case = _gpu_case(ctx, cfg)
    fig = figures.get(f"{size} {case}: GRPO step") if size else None
    if fig is None:
        return Check(F, "time per step", "skip", "no bench figure for this model size and backend "
                     "(bench/results/gpu.json from `python bench/gpu.py` on the GPU adds them)")
    seconds = fig["value"] * tokens / _GPU_BENCH_TOKENS
    return Check(F, "time per step", "ok", f"~{seconds:.1f}s per step, {seconds * steps / 3600:.1f} h in all "
                 f"(bench {size} {case}: {fig['value']}s for {_GPU_BENCH_TOKENS:,} tokens, scaled to {tokens:,})",
                 data={"seconds_per_step": round(seconds, 2)})


def _gpu_case(ctx: Context, cfg: Any) -> str:
    backend = ctx.recipe.model.backend
    four_bit = ctx.recipe.model.load_in_4bit
    vllm = bool(getattr(cfg, "use_vllm", False))
    if backend == "unsloth" or (backend == "auto" and four_bit and vllm):
        return "unsloth-qlora-vllm" if vllm else "unsloth-qlora"
    if four_bit:
        return "hf-qlora-nf4"
    return "hf-bf16-lora-vllm" if vllm else "hf-bf16-lora"
