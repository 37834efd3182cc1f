"""Resident memory across a whole `rlkit train` run, step by step: does the process grow as it trains?

Runs the command given after `--` and samples its RSS (`/proc/PID/status`, VmRSS) every `--every` seconds,
reading the run's `metrics.jsonl` at each sample to know which step is under way. Per step it prints the highest
sample (the peak; a sampler can miss a short spike, so `/usr/bin/time -v`'s maximum is worth taking too) and the
lowest (what stays between steps), then the last step's peak against step 3's: issue 31's bound is 5%.

    .venv/bin/python bench/rss_trace.py --run runs/calc12 --out bench/results/rss_calc12.json -- \
        .venv/bin/rlkit train recipes/smol_calc_grpo.yaml --set trainer.max_steps=12 --output-dir runs/calc12

The run's `trainer.logging_steps` must be 1 (every shipped smol recipe's), so that each step logs a row.
`--tree` samples the command's whole process tree instead (a demo that runs stages in processes of their own): the
sum of its processes' RSS, and the largest one process, which is what `time -v` reports. Without `--run` every
sample is step 0's (a command with no metrics.jsonl):

    .venv/bin/python bench/rss_trace.py --tree --out runs/demo-search-rss.json -- .venv/bin/rlkit demo --search
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it, now (``/proc/PID/task/TID/children``)."""
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        for task in Path(f"/proc/{found[-1]}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue
    return found


def tree_rss_bytes(pid: int) -> tuple[int, int] | None:
    """(the sum, the largest) of the resident sizes of ``pid`` and its descendants; None once ``pid`` is gone.
    The sum counts a shared page once per process that maps it: an upper bound on what they hold together."""
    sizes = [r for r in map(rss_bytes, descendants(pid)) if r is not None]
    return (sum(sizes), max(sizes)) if sizes else None


def logged_steps(metrics: Path | None) -> int:
    """The highest step with a training row (a `loss`) in metrics.jsonl; 0 before the first."""
    if metrics is None or not metrics.is_file():
        return 0
    steps = [0]
    for line in metrics.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a row being written
            continue
        if "loss" in row:
            steps.append(int(row["step"]))
    return max(steps)


def per_step(samples: list[tuple[float, int, int]]) -> list[dict[str, float]]:
    """(seconds, rss, steps logged) samples -> per step under way: its peak and lowest RSS in GB."""
    out: dict[int, list[int]] = {}
    for _, rss, done in samples:
        out.setdefault(done + 1, []).append(rss)
    return [{"step": step, "peak_gb": round(max(v) / 1e9, 3), "low_gb": round(min(v) / 1e9, 3), "samples": len(v)}
            for step, v in sorted(out.items())]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="the run directory the command writes (its metrics.jsonl: steps)")
    parser.add_argument("--tree", action="store_true", help="sum the RSS of the command and every process under it")
    parser.add_argument("--every", type=float, default=3.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, help="JSON with every sample and the per-step table")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to trace after --")
    started = time.time()
    try:
        child = subprocess.Popen(command)
    except OSError as e:
        parser.error(f"cannot start {command[0]!r}: {e.strerror}; give the command to trace after --")
    samples: list[tuple[float, int, int]] = []
    largest = 0  # with --tree: the largest one process seen
    metrics = args.run / "metrics.jsonl" if args.run else None
    while child.poll() is None:
        # The step count read before and after the RSS: a sample taken while a step ended (the row written between
        # the reads, the memory of the step before maybe still held) belongs to neither step, so it is dropped.
        before = logged_steps(metrics)
        sizes = tree_rss_bytes(child.pid) if args.tree else (rss_bytes(child.pid),) * 2
        if sizes is not None and sizes[0] is not None and logged_steps(metrics) == before:
            samples.append((round(time.time() - started, 1), sizes[0], before))
            largest = max(largest, sizes[1])
        time.sleep(args.every)
    steps = [s for s in per_step(samples) if s["step"] <= logged_steps(metrics)]
    for s in steps:
        print(f"step {s['step']:3d}: peak {s['peak_gb']:.2f} GB, lowest {s['low_gb']:.2f} GB ({s['samples']} samples)")
    if len(steps) >= 3:
        third, last = steps[2]["peak_gb"], steps[-1]["peak_gb"]
        print(f"last step's peak {last:.2f} GB vs step 3's {third:.2f} GB: {100 * (last / third - 1):+.1f}% "
              f"(bound +5%); highest step peak {max(s['peak_gb'] for s in steps):.2f} GB")
    peak = max((rss for _, rss, _ in samples), default=0)
    if args.tree:
        print(f"peak of the process tree's sum {peak / 1e9:.2f} GB; largest one process {largest / 1e9:.2f} GB "
              f"({len(samples)} samples, every {args.every:g} s)")
    if args.out:
        args.out.write_text(json.dumps({"command": command, "every_s": args.every, "exit": child.returncode,
                                        "seconds": round(time.time() - started, 1), "tree": args.tree,
                                        "peak_gb": round(peak / 1e9, 3), "largest_process_gb": round(largest / 1e9, 3),
                                        "steps": steps, "samples": samples}, indent=1) + "\n")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
