"""The GPU check: GRPO and SFT step time, tokens/s and peak GPU memory per backend, and `rlkit merge` on CUDA.

Runs from a checkout on a bare CUDA machine (no install of rlkit, no network): the script puts the
checkout on `sys.path`. What a case needs beyond torch + transformers + peft + accelerate is checked
first, and a case that cannot run is a row saying why ("skipped: bitsandbytes not installed"). Bring
the missing wheels with `bench/gpu_wheels.py`, or vLLM with them with `bench/gpu_carry.py` (docs/gpu.md).

No downloads: the models are random-initialised Qwen3s built from the public Qwen/Qwen3-0.6B and
Qwen/Qwen3-1.7B configs (written out below) with rlkit's tiny tokenizer, so the vocabulary is 1024
tokens instead of 151936: the transformer body, where the time goes, is the real size; the embedding
and LM head are far smaller (the parameter count is in every row). A random model writes random tokens,
so every GRPO completion runs to `max_completion_length`: the throughput is full-length generation.

Cases (`--case`, repeatable; default all), each at each size (`--size`, default both):

    grpo-hf-bf16-lora        transformers + peft, bf16 base, LoRA, HF generate
    grpo-hf-qlora-nf4        bitsandbytes nf4 (double quant) base, LoRA, HF generate
    grpo-unsloth-qlora       Unsloth 4-bit, Unsloth's LoRA, HF generate
    grpo-hf-bf16-lora-vllm   TRL's colocated vLLM
    grpo-unsloth-qlora-vllm  Unsloth's colocated vLLM engine (fast_inference)
    grpo-hf-qlora-nf4-vllm   a 4-bit base with TRL's colocated vLLM: refused in one line, nothing runs (trl#4973)
    sft-hf-bf16-lora, sft-hf-qlora-nf4, sft-unsloth-qlora
    merge-hf-qlora-nf4       a few QLoRA SFT steps, then `rlkit merge` on CUDA with its fidelity report

Each case runs in a fresh process (Unsloth must be imported before trl/transformers/peft, and each peak
memory figure is then that case's alone), built by rlkit itself (`rlkit.train.build_trainer` on a
recipe). Step time is the median of the steps after the first (a warm-up); GRPO tokens/s are the
tokens generated divided by the time TRL spent in its generation call (TRL's profiling timers), SFT
tokens/s the tokens trained on per second; peak memory is `torch.cuda.max_memory_allocated`.

Results are written as each case finishes: one JSON line per case appended to `OUT/gpu.jsonl`, and
`OUT/gpu.md` (a table of the latest row per size and case) rewritten after each, so a run that is
killed keeps what it finished. Run a case per call where calls are time-limited:

    python bench/gpu.py --dry-run                       # the plan: what would run, what is skipped and why
    python bench/gpu.py --case grpo-hf-qlora-nf4 --size 0.6b
    python bench/gpu.py                                 # everything (tens of minutes)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT), str(BENCH)]  # rlkit and bench/common from the checkout, installed or not

from common import markdown, table  # noqa: E402  (after the path is set)
from gpu_case import (  # noqa: E402
    _RESULT,
    CASES,
    LORA_R,
    MAX_COMPLETION_LENGTH,
    MERGE_STEPS,
    NUM_GENERATIONS,
    PROMPTS_PER_STEP,
    REFUSED,
    SFT_BATCH,
    SIZES,
    STEPS,
)

RESULTS = BENCH / "results"
TIMEOUT_S = 540  # under a 600 s call limit, with room to write the row
BASE_NEEDS = {"torch": "torch", "transformers": "transformers", "peft": "peft", "accelerate": "accelerate",
              "trl": "trl", "datasets": "datasets", "pydantic": "pydantic", "yaml": "pyyaml", "rich": "rich"}


def needs(case: str) -> dict[str, str]:
    """Modules the case imports, beyond the standard library."""
    _, backend, four_bit, vllm = CASES[case]
    out = dict(BASE_NEEDS)
    if four_bit:
        out["bitsandbytes"] = "bitsandbytes"
    if backend == "unsloth":
        out.update(unsloth="unsloth", unsloth_zoo="unsloth_zoo")
    if vllm:
        out["vllm"] = "vllm"
    return out


def skip_reason(case: str, cuda: bool) -> str | None:
    """Why `case` cannot run here (refused whatever the machine, a missing package, else no GPU), or None."""
    if case in REFUSED:
        return REFUSED[case]
    missing = [dist for module, dist in needs(case).items() if importlib.util.find_spec(module) is None]
    if missing:
        why = f"skipped: {', '.join(missing)} not installed"
        return why + (" (carry it with bench/gpu_carry.py)" if "vllm" in missing else "")
    if not cuda:
        return "skipped: no CUDA GPU"
    return None


def cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


# ---------------------------------------------------------------------------------------------
# The parent: plan, spawn, write as each case finishes


def spawn(args: list[str], timeout: float) -> tuple[dict[str, Any] | None, str | None]:
    """(result, None) or (None, error) from a child process."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline",
           "TOKENIZERS_PARALLELISM": "false", "TRL_EXPERIMENTAL_SILENCE": "1"}
    try:
        done = subprocess.run([sys.executable, __file__, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        # What the case was doing when it was stopped (e.g. Unsloth's first torch.compile on a cold machine).
        sys.stderr.write((exc.stderr or b"").decode(errors="replace")[-4000:])  # bytes, even with text=True
        return None, f"timed out after {timeout:.0f}s"
    lines = [line for line in done.stdout.splitlines() if line.startswith(_RESULT)]
    if done.returncode != 0 or (args[0] == "--child" and not lines):
        sys.stderr.write(done.stderr[-4000:])
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"exit {done.returncode}: {tail[0][:300]}"
    return (json.loads(lines[-1].removeprefix(_RESULT)) if lines else {}), None


def stack() -> str:
    """The versions a row was measured with: Python and what `rlkit.runs.versions` finds installed."""
    from rlkit.runs import versions

    found = [f"{name} {version}" for name, version in versions().items() if version]
    return ", ".join([f"Python {sys.version.split()[0]}", *found])


def record(out: Path, row: dict[str, Any]) -> None:
    """Append ``row`` to gpu.jsonl and rewrite gpu.md from every row so far."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "gpu.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    rows = [json.loads(line) for line in (out / "gpu.jsonl").read_text().splitlines() if line.strip()]
    (out / "gpu.md").write_text(render(rows))


def render(rows: list[dict[str, Any]]) -> str:
    """The latest row per (size, case), as Markdown."""
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        latest[(row["size"], row["case"])] = row
    order = {c: i for i, c in enumerate(CASES)}
    ordered = sorted(latest.values(), key=lambda r: (r["size"], order.get(r["case"], 99)))
    # How a row was measured (a note, the stack) goes under the tables, numbered; the row's status points to it.
    footnotes: list[str] = []

    def status(row: dict[str, Any]) -> str:
        marks = []
        for text in (row.get("note"), row.get("stack") and f"Stack: {row['stack']}."):
            if text:
                if text not in footnotes:
                    footnotes.append(text)
                marks.append(f"[{footnotes.index(text) + 1}]")
        return " ".join([row.get("status", ""), *marks]).strip()

    def num(row: dict[str, Any], key: str, digits: int) -> str:
        value = row.get(key)
        return "-" if value is None else f"{value:.{digits}f}"

    train_rows = [[r["size"], r["case"], r.get("parameters_m", "-"), num(r, "step_seconds", 2),
                   num(r, "tokens_per_second", 0), r.get("tokens_measure", "-"), num(r, "peak_allocated_gib", 2),
                   status(r)] for r in ordered if not r["case"].startswith("merge")]
    merge_rows = [[r["size"], r["case"], num(r, "merge_seconds", 1), num(r, "peak_allocated_gib", 2),
                   num(r, "max_abs_logit_diff", 4), num(r, "top1_agreement", 4), num(r, "greedy_match", 2),
                   r.get("decided_flips", "-"), num(r, "adapter_effect_max_abs_logit", 3), status(r)]
                  for r in ordered if r["case"].startswith("merge")]
    profiled = [r for r in ordered if r.get("phases")]
    header = ["phase", "seconds", "share", "peak GiB", "calls"]
    phase_parts = [f"### {r['size']} {r['case']} (peak: {r.get('phase_memory', '-')})\n\n"
                   + markdown(table("phases", header, phase_rows(r["phases"]))) for r in profiled]
    gpus = sorted({r["gpu"] for r in ordered if r.get("gpu")})
    parts = ["# GPU check (`bench/gpu.py`)",
             f"GPU: {', '.join(gpus) if gpus else 'none: no case has run on a GPU'}. Latest row per size and case "
             "from `gpu.jsonl`; `status` says why a case did not run.",
             f"## Training: {STEPS - 1} timed steps after a warm-up",
             f"GRPO: {PROMPTS_PER_STEP} prompts x {NUM_GENERATIONS} generations of {MAX_COMPLETION_LENGTH} tokens "
             f"per step; SFT: {SFT_BATCH} rows per step; LoRA r={LORA_R}; random-initialised Qwen3 bodies, "
             "1024-token vocabulary.",
             markdown(table("training", ["size", "case", "params (M)", "step s (median)", "tokens/s", "tokens",
                                         "peak GiB", "status"], train_rows)),
             *([f"## GRPO step by phase: median of the {STEPS - 1} timed steps",
                "Measured by `bench/stepprobe.py` wrapping the trainer's own methods (generation, log-probs, loss, "
                "backward; the rest is callbacks, logging and rlkit's bookkeeping), with a CUDA synchronize at "
                "each boundary; a phase's peak is the memory (GPU memory allocated, on CUDA) while it, not a phase "
                "nested in it, ran. Where a trainer computes its loss inside `compute_loss` (Unsloth), the loss "
                "forward shows under \"loss rest\".",
                *phase_parts] if profiled else []),
             f"## `rlkit merge` on CUDA after {MERGE_STEPS} QLoRA SFT steps (faithful merge, bf16)",
             markdown(table("merge", ["size", "case", "seconds", "peak GiB", "max |Δlogits|", "top-1 agreement",
                                      "greedy match", "decided flips", "adapter effect", "status"], merge_rows)),
             *(["\n\n".join(f"[{i}] {text}" for i, text in enumerate(footnotes, 1))] if footnotes else []),
             "Reproduce: `python bench/gpu.py [--case CASE] [--size SIZE]` (see its --help)."]
    return "\n\n".join(parts) + "\n"


def phase_rows(phases: dict[str, dict[str, float]]) -> list[list[Any]]:
    """A GRPO row's step profile: phase, seconds, share of the step, peak GiB, calls."""
    step = phases.get("_step", {}).get("seconds") or sum(v["seconds"] for k, v in phases.items() if k != "_step")
    return [[("whole step" if name == "_step" else name), round(v["seconds"], 3),
             f"{v['seconds'] / step:.0%}" if step else "-", round(v["peak_bytes"] / 2**30, 2), v["calls"]]
            for name, v in phases.items()]


def plan(cases: list[str], sizes: list[str], cuda: bool) -> list[tuple[str, str, str | None]]:
    return [(size, case, skip_reason(case, cuda)) for size in sizes for case in cases]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu.py", description=__doc__.split("\n\n")[0],
                                     epilog="Cases: " + ", ".join(CASES) + ". Results: OUT/gpu.jsonl, OUT/gpu.md.")
    parser.add_argument("--case", action="append", choices=list(CASES), help="run this case (repeatable; default all)")
    parser.add_argument("--size", action="append", choices=list(SIZES), help="at this size (repeatable; default all)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where gpu.jsonl and gpu.md go (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per case (default %(default)s)")
    parser.add_argument("--note", help="how these rows were measured (e.g. 'beside another run on the same GPU'); "
                        "shown under the table")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan and record the cases that cannot run here; run nothing")
    args = parser.parse_args(argv)
    cases, sizes = args.case or list(CASES), args.size or list(SIZES)
    cuda = cuda_available()
    steps = plan(cases, sizes, cuda)
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    versions = stack()
    print(f"GPU check: {len(steps)} case(s); CUDA {'available' if cuda else 'not available'}")
    for size, case, why in steps:
        print(f"  {size:5} {case:24} {why or 'will run'}")
    models: dict[str, tuple[Path, int]] = {}
    with tempfile.TemporaryDirectory(prefix="rlkit-bench-gpu-") as tmp:
        for size, case, why in steps:
            row: dict[str, Any] = {"size": size, "case": case, "at": stamp, "stack": versions,
                                   **({"note": args.note} if args.note else {})}
            if why is not None or args.dry_run:
                if why is None:
                    continue  # would run: a dry run records only what cannot
                record(args.out, {**row, "status": why})
                continue
            if size not in models:
                model_dir = Path(tmp) / size
                _, error = spawn(["--build", size, str(model_dir)], args.timeout)
                if error:
                    record(args.out, {**row, "status": f"error building the model: {error}"})
                    continue
                models[size] = (model_dir, json.loads((model_dir / "parameters.json").read_text()))
            model_dir, parameters = models[size]
            run_dir = Path(tmp) / f"run-{size}-{case}" / "run"
            started = time.time()
            result, error = spawn(["--child", case, str(model_dir), str(run_dir)], args.timeout)
            shutil.rmtree(run_dir.parent, ignore_errors=True)
            row.update(parameters_m=round(parameters / 1e6), seconds=round(time.time() - started, 1),
                       status=error or "ok", **(result or {}))
            record(args.out, row)
            print(f"{size} {case}: {row['status']}", flush=True)
    print(f"results: {args.out / 'gpu.md'}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        from gpu_case import child

        child(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
    elif sys.argv[1:2] == ["--build"]:
        from gpu_case import build_model

        build_model(sys.argv[2], Path(sys.argv[3]))
    else:
        sys.exit(main())
