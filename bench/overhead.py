"""rlkit's overhead: the same tiny GRPO and SFT runs through `rlkit.train.train` and through a hand-written
TRL script (same model, rows, LoRA, seed, TrainingArguments, steps). Target: wall-time ratio <= 1.05, equal loss.

The runs are `recipes/tiny_arith_grpo.yaml` and `recipes/tiny_arith_sft.yaml` with `--smoke` (the tiny
model, 32 generated problems, CPU settings) and `trainer.max_steps` = `trainer.save_steps`, at two lengths: 8 steps
(about a second of training, where rlkit's fixed costs show most) and a long run of at least 60 s of training
on an idle 2-core machine (3600 SFT steps, 1200 GRPO steps), where they should vanish. A random
model never earns the recipe's GSM8K rewards, so every GRPO advantage would be 0 and the loss 0 on both
sides whatever they did; the GRPO run therefore adds a third reward that varies on random text
(`has_digit`, below, through rlkit's `package.module:function` escape hatch), so that the loss and
the LoRA update are real and comparable. A right answer always earns it, so `rlkit train`'s pre-launch doctor
accepts the rewards (a reward that paid a wrong answer more than a right one would be a no-go).

The rlkit side starts as the `rlkit` command does: torch's huge pages for large tensors switched on
(`rlkit.compat.torch_huge_pages`) before anything else, since rlkit's CPU training pins glibc's heap threshold
(`rlkit.cpu_memory`), which without them costs a page fault per 4 KiB of every large tensor.

Each run is a fresh process. torch, transformers, trl, peft and datasets are imported before the clock
starts on both sides; everything after that counts (rlkit's own imports, recipe validation, data, model
load, trainer, training, saving, rlkit's run report). The sides alternate, `REPEAT` times for the short runs
and `LONG_REPEAT` times for the long ones; the median of the per-repetition ratios is reported. Equivalence
is checked three ways: the TrainingArguments both sides saved, every logged metric at every step, and the
saved adapters' tensors.

    .venv/bin/python bench/overhead.py
    .venv/bin/python bench/overhead.py --long-repeat 0   # the short runs only (about a minute)
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import PYTHON, ROOT, figure, median, offline_env, table, write

STEPS = 8
REPEAT = 3
# Steps for at least 60 s of training on an idle 2-core machine (measured: about 18 ms per SFT step, 55 ms per
# GRPO step).
LONG_STEPS = {"grpo": 1200, "sft": 3600}
LONG_REPEAT = 1
TARGET = 1.05
SEED = 0
RECIPES = {"grpo": ROOT / "recipes" / "tiny_arith_grpo.yaml", "sft": ROOT / "recipes" / "tiny_arith_sft.yaml"}
# The GRPO rewards: the recipe's two plus one with signal on a random model (see the module docstring).
REWARDS = [("gsm8k_correct", 1.0), ("answer_format", 0.2), ("overhead:has_digit", 1.0)]


def overrides(algorithm: str, steps: int) -> list[str]:
    extra = ["rewards=[" + ", ".join(f'{{name: "{n}", weight: {w}}}' for n, w in REWARDS) + "]"]
    return [f"trainer.max_steps={steps}", f"trainer.save_steps={steps}", *(extra if algorithm == "grpo" else [])]
# Logged values that measure time, not training: they differ between any two runs.
_TIMING_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "step_time", "epoch"}
_RESULT = "BENCH_RESULT "


def has_digit(completions: list, **kwargs) -> list[float]:
    """1 for a completion with a digit in it: every right answer has one, and a random model's samples differ."""
    from rlkit.rewards.text import completion_text

    return [float(any(ch.isdigit() for ch in completion_text(c))) for c in completions]


# ---------------------------------------------------------------------------------------------
# The two sides (each runs in its own process)


def run_rlkit(algorithm: str, out: Path, steps: int) -> tuple[list[dict[str, Any]], float]:
    """(logged metrics, seconds spent writing the end-of-run report), the report timed by wrapping it unchanged."""
    from rlkit import runs
    from rlkit.train import train

    spent: list[float] = []
    report = importlib.import_module("rlkit.report") if importlib.util.find_spec("rlkit.report") else None
    if report is not None and hasattr(report, "write_report"):
        write_report = report.write_report

        def timed_report(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return write_report(*args, **kwargs)
            finally:
                spent.append(time.perf_counter() - started)

        report.write_report = timed_report  # train() looks it up in the module when the run ends
    run_dir = train(RECIPES[algorithm], overrides(algorithm, steps), smoke=True, output_dir=out, overwrite=True)
    return runs.read_metrics(run_dir), sum(spent)


def run_trl(algorithm: str, out: Path, steps: int) -> tuple[list[dict[str, Any]], float]:
    """What a TRL user writes for the same run. The rows come from rlkit's generator so that the data match."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed

    from rlkit.data import gsm8k
    from rlkit.tiny import tiny_model_path

    model_path = str(tiny_model_path("tiny"))
    shared = {"output_dir": str(out / "checkpoints"), "use_cpu": True, "bf16": False, "fp16": False, "seed": SEED,
              "max_steps": steps, "save_steps": steps, "logging_steps": 1, "report_to": "none", "warmup_steps": 0,
              "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "gradient_checkpointing": False,
              "dataloader_num_workers": 0, "run_name": out.name}
    if algorithm == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        from rlkit.rewards.math import answer_format, gsm8k_correct

        rows = gsm8k.grpo_rows(gsm8k.generate(32, seed=0))
        args = GRPOConfig(**shared, learning_rate=1e-5, num_generations=4, max_completion_length=24, temperature=0.7,
                          use_vllm=False, log_completions=False, reward_weights=[w for _, w in REWARDS])
    else:
        from trl import SFTConfig, SFTTrainer

        rows = gsm8k.sft_rows(gsm8k.generate(32, seed=0))
        args = SFTConfig(**shared, learning_rate=3e-3, lr_scheduler_type="cosine", max_length=256, packing=False)
    set_seed(SEED)  # before the trainer wraps the model in its LoRA (the LoRA init draws random numbers)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                      modules_to_save=["embed_tokens", "lm_head"], bias="none", task_type="CAUSAL_LM")
    if algorithm == "grpo":
        trainer = GRPOTrainer(model=model, reward_funcs=[gsm8k_correct, answer_format, has_digit], args=args,
                              train_dataset=rows, processing_class=tokenizer, peft_config=lora)
    else:
        trainer = SFTTrainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer, peft_config=lora)
    trainer.train()
    trainer.save_model(str(out / "adapter"))
    tokenizer.save_pretrained(str(out / "adapter"))
    return trainer.state.log_history, 0.0


def child(side: str, algorithm: str, out: Path, steps: int) -> None:
    """One timed run; prints its result as one JSON line."""
    if side == "rlkit":  # what the `rlkit` command does first, before any tensor exists (rlkit/cli main)
        from rlkit.compat import torch_huge_pages

        torch_huge_pages()
    import datasets  # noqa: F401  (the heavy imports both sides share happen before the clock starts)
    import peft  # noqa: F401
    import torch
    import transformers  # noqa: F401
    import trl  # noqa: F401
    from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer  # noqa: F401

    started = time.perf_counter()
    log, report_seconds = (run_rlkit if side == "rlkit" else run_trl)(algorithm, out, steps)
    seconds = time.perf_counter() - started
    checkpoint = out / "checkpoints" / f"checkpoint-{steps}" / "training_args.bin"
    args = torch.load(checkpoint, weights_only=False).to_dict()
    result = {"seconds": seconds, "report_seconds": report_seconds, "log": log, "args": args}
    print(_RESULT + json.dumps(result, default=str), flush=True)


# ---------------------------------------------------------------------------------------------
# The comparison (the parent process)


def spawn(side: str, algorithm: str, out: Path, steps: int) -> dict[str, Any]:
    done = subprocess.run([PYTHON, __file__, "--child", side, algorithm, str(out), str(steps)], cwd=ROOT,
                          env=offline_env(),
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-5000:])
        raise SystemExit(f"the {side} {algorithm} run failed (exit {done.returncode})")
    line = next(line for line in reversed(done.stdout.splitlines()) if line.startswith(_RESULT))
    result = json.loads(line.removeprefix(_RESULT))
    result["adapter"] = _adapter_tensors(out / "adapter")
    result["train_runtime"] = next((row["train_runtime"] for row in reversed(result["log"]) if "train_runtime" in row),
                                   None)
    return result


def _adapter_tensors(adapter: Path) -> dict[str, Any]:
    from safetensors.numpy import load_file

    return load_file(adapter / "adapter_model.safetensors")


def compare_logs(a: list[dict], b: list[dict]) -> tuple[int, float, list[str]]:
    """(numbers compared, largest |difference|, keys logged by one side only or unequal as text), row by row."""
    if len(a) != len(b):
        raise SystemExit(f"the two sides logged {len(a)} and {len(b)} rows: they did not run the same steps")
    compared, worst, mismatched = 0, 0.0, set()
    for row_a, row_b in zip(a, b, strict=True):
        for key in (row_a.keys() | row_b.keys()) - _TIMING_KEYS:
            x, y = row_a.get(key), row_b.get(key)
            if isinstance(x, int | float) and isinstance(y, int | float):
                compared += 1
                worst = max(worst, abs(x - y))
            elif key not in row_a or key not in row_b or x != y:
                mismatched.add(key)
    return compared, worst, sorted(mismatched)


def compare_adapters(a: dict, b: dict) -> float:
    import numpy as np

    if a.keys() != b.keys():
        raise SystemExit(f"the adapters hold different tensors: {sorted(a.keys() ^ b.keys())[:5]}")
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def args_differ(a: dict, b: dict) -> list[str]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def last(log: list[dict], key: str) -> float:
    return next(row[key] for row in reversed(log) if key in row)


def compare(algorithm: str, steps: int, repeat: int, tmp: Path) -> dict[str, Any]:
    """Run both sides ``repeat`` times, alternating which goes first; the timings and the equivalence checks."""
    results: dict[str, list[dict]] = {"rlkit": [], "trl": []}
    for rep in range(repeat):
        for side in ("rlkit", "trl") if rep % 2 == 0 else ("trl", "rlkit"):
            out = tmp / f"{algorithm}-{steps}-{side}-{rep}"
            results[side].append(spawn(side, algorithm, out, steps))
            shutil.rmtree(out)
            print(f"{algorithm} {steps} steps, {side} #{rep + 1}: {results[side][-1]['seconds']:.2f}s", flush=True)
    mine, theirs = results["rlkit"], results["trl"]
    compared, worst, mismatched = compare_logs(mine[0]["log"], theirs[0]["log"])
    return {
        "steps": steps,
        **{key: {"rlkit": [m[key] for m in mine], "trl": [t[key] for t in theirs]}
           for key in ("seconds", "train_runtime", "report_seconds")},
        "ratios": [m["seconds"] / t["seconds"] for m, t in zip(mine, theirs, strict=True)],
        "ratios_without_report": [(m["seconds"] - m["report_seconds"]) / t["seconds"]
                                  for m, t in zip(mine, theirs, strict=True)],
        **{key: {"rlkit": last(mine[0]["log"], name), "trl": last(theirs[0]["log"], name)}
           for key, name in (("final_loss", "loss"), ("train_loss", "train_loss"))},
        "logged_values_compared": compared, "largest_logged_difference": worst, "mismatched_keys": mismatched,
        "adapter_max_abs_difference": compare_adapters(mine[0]["adapter"], theirs[0]["adapter"]),
        "adapter_max_abs_difference_across_all_runs": max(compare_adapters(mine[0]["adapter"], r["adapter"])
                                                          for r in mine + theirs),
        "training_arguments_that_differ": args_differ(mine[0]["args"], theirs[0]["args"]),
        "overrides": overrides(algorithm, steps),
    }


def report_rows(run: str, d: dict[str, Any]) -> tuple[list[Any], list[Any], list[dict[str, Any]]]:
    """(wall-time row, equivalence row, figures) of one ``compare`` result."""
    med = {key: {side: median(values) for side, values in d[key].items()}
           for key in ("seconds", "train_runtime", "report_seconds")}
    ratio, no_report = median(d["ratios"]), median(d["ratios_without_report"])
    timing = [run, d["steps"], len(d["ratios"]), med["seconds"]["rlkit"], med["seconds"]["trl"], ratio,
              med["seconds"]["rlkit"] - med["seconds"]["trl"], med["report_seconds"]["rlkit"], no_report,
              med["train_runtime"]["rlkit"], med["train_runtime"]["trl"]]
    same = [run, f"{d['final_loss']['rlkit']:.6g} / {d['final_loss']['trl']:.6g}",
            f"{d['train_loss']['rlkit']:.6g} / {d['train_loss']['trl']:.6g}",
            f"{d['logged_values_compared']} values, max |diff| {d['largest_logged_difference']:.3g}",
            f"{d['adapter_max_abs_difference']:.3g}", ", ".join(d["training_arguments_that_differ"])]
    figures = [
        figure(f"{run}: rlkit / TRL script wall time", ratio, "x", at_most=TARGET, digits=3,
               note=f"{d['steps']} steps: {med['seconds']['rlkit']:.2f}s vs {med['seconds']['trl']:.2f}s"),
        figure(f"{run}: same, without rlkit's end-of-run report", no_report, "x", digits=3,
               note=f"the report took {med['report_seconds']['rlkit']:.2f}s"),
        figure(f"{run}: final loss, largest |rlkit - TRL| over every logged value", d["largest_logged_difference"],
               "", at_most=1e-6, digits=9, note=f"final loss {d['final_loss']['rlkit']:.6g} vs "
               f"{d['final_loss']['trl']:.6g}; train_loss {d['train_loss']['rlkit']:.6g} vs "
               f"{d['train_loss']['trl']:.6g}; adapters max |diff| {d['adapter_max_abs_difference']:.3g}"),
    ]
    return timing, same, figures


def main(long_repeat: int = LONG_REPEAT) -> None:
    from rlkit.tiny import tiny_model_path

    tiny_model_path("tiny")  # built once (seconds) before any timing, if this machine has not built it yet
    lengths = [("", STEPS, REPEAT)] + ([(" long", None, long_repeat)] if long_repeat else [])
    details: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="rlkit-bench-overhead-") as tmp:
        for suffix, steps, repeat in lengths:
            for algorithm in RECIPES:
                details[algorithm + suffix] = compare(algorithm, steps or LONG_STEPS[algorithm], repeat, Path(tmp))
    timing_rows, same_rows, figures = [], [], []
    for run, d in details.items():
        timing, same, figs = report_rows(run, d)
        timing_rows.append(timing)
        same_rows.append(same)
        figures += figs
    notes = [f"{run}: {d['logged_values_compared']} logged values compared step by step (loss, grad norm, "
             "learning rate and, for GRPO, rewards, entropy, completion lengths, ...); metrics logged by one side "
             f"only or unequal as text: {', '.join(d['mismatched_keys']) or 'none'}; the adapters of all "
             f"{2 * len(d['ratios'])} runs differ by at most {d['adapter_max_abs_difference_across_all_runs']:.3g}."
             for run, d in details.items()]
    notes.append("The TRL script's rows come from rlkit's GSM8K generator (the data must match); everything else in it "
                 "is plain transformers + peft + TRL.")
    notes.append(f"The long runs ({LONG_STEPS['sft']} SFT and {LONG_STEPS['grpo']} GRPO steps, at least 60 s of "
                 "training each on an idle 2-core machine) show what a fixed cost is worth next to real training; "
                 "the 8-step runs show the fixed costs themselves.")
    write("overhead", "rlkit overhead vs a hand-written TRL script", figures,
          [table("Wall time, median of alternating fresh-process runs (seconds)",
                 ["run", "steps", "runs per side", "rlkit", "TRL script", "ratio", "rlkit extra (s)",
                  "rlkit report (s)", "ratio without report", "rlkit train()", "TRL train()"], timing_rows),
           table("Do both train the same?",
                 ["run", "final loss rlkit / TRL", "train_loss rlkit / TRL", "every logged value",
                  "adapter max |diff|", "TrainingArguments that differ"], same_rows)],
          what="The same tiny GRPO and SFT runs through `rlkit.train.train` (`--smoke` recipes) and through a "
               "hand-written TRL script, 8 steps and a long run: wall time after the shared heavy imports, and "
               "whether both train the same.",
          details=details, notes=notes)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], Path(sys.argv[4]), int(sys.argv[5]))
    elif sys.argv[1:2] == ["--long-repeat"]:
        main(int(sys.argv[2]))
    else:
        main()
