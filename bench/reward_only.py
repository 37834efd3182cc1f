"""A reward and no worked answers: GRPO against rejection-sampling fine-tuning (RFT) given the same minutes (issue 48).

Where worked answers exist, SFT on them beat GRPO's minutes on every demo (README). This asks the question for
what is left, a task with problems and a checker but no answer to imitate: `make demo`'s arithmetic pool with its
two worked turns in the prompt (``data.prompt: short``, the base's few-shot form), from the base model, no SFT.

- GRPO: ``smol_arith_grpo`` from the base (``--steps`` steps of 8 prompts x 4 completions at ``--lr``), rewarded
  by the right final number, as the demo.
- RFT, the SFT a user without worked answers can run (STaR / expert iteration, one round): ``rlkit eval --samples
  4 --temperature 0.8`` on as many pool problems as GRPO saw (``--steps`` x 8), the same completion budget; every
  distinct right completion becomes an SFT row; ``smol_arith_sft`` on those rows, at its learning rate held
  constant, for GRPO's training minutes less the sampling's (``rlkit train --max-minutes``). The
  sampling is seeded by ``rlkit eval`` (torch seed 0): ``--seed`` changes GRPO's and the SFT's seeds, not RFT's rows.
- Both evaluated on every set of the ``arith`` suite (``rlkit eval RUN --suite arith``), beside the base.

    python bench/reward_only.py --out /tmp/reward-only              # 12 GRPO steps at lr 1.5e-4, seed 0
    python bench/reward_only.py --out /tmp/ro-s1 --seed 1 --steps 36
    python bench/reward_only.py --out /tmp/ro-2d --pool '{"synthetic": 2000, "seed": 7, "generator": {"min_value": 10,
        "max_value": 99, "max_steps": 1}}'                       # two-digit + and -: rarer right answers

Every stage is an ``rlkit`` command in a process of its own, as a user would type it; ``table.md`` in ``--out``
holds the per-set accuracies and the paired differences (GRPO - base, RFT - base, GRPO - RFT; exact McNemar p).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]  # rlkit from the checkout, installed or not

from common import machine, machine_line, others_cpu_share  # noqa: E402  (after the path is set)

GRPO, SFT = "recipes/smol_arith_grpo.yaml", "recipes/smol_arith_sft.yaml"
POOL = {"synthetic": 2000, "seed": 7, "generator": {"max_value": 50, "ops": "+-*", "max_factor": 12, "max_steps": 1}}
PROMPTS_PER_STEP, SAMPLES, TEMPERATURE = 8, 4, 0.8  # the GRPO recipe's 8 prompts x 4 completions at 0.8


def grpo_overrides(steps: int, lr: float, seed: int, pool: dict | None = None) -> list[str]:
    return ["data.prompt=short", f"trainer.learning_rate={lr}", f"trainer.max_steps={steps}", f"trainer.seed={seed}",
            *([f"data.train={json.dumps(pool)}"] if pool else [])]


def sampling_overrides(pool: dict | None = None) -> list[str]:
    return ["data.prompt=short", f"data.eval={json.dumps(pool or POOL)}"]


def rft_overrides(rows: Path, seed: int) -> list[str]:
    """``smol_arith_sft`` on the right samples, lr constant, as the demos' equal-time control trains."""
    return [f"data.train={json.dumps({'path': str(rows)})}", "data.prompt=short", "trainer.max_steps=100000",
            "trainer.lr_scheduler_type=constant", "trainer.warmup_steps=0", "trainer.save_steps=100000",
            f"trainer.seed={seed}"]


def right_rows(samples: list[dict]) -> list[dict[str, str]]:
    """SFT rows (``question``, ``answer``: the gsm8k task's columns) from ``rlkit eval --samples`` records: each
    problem's distinct right completions, in order."""
    rows = []
    for record in samples:
        kept: list[str] = []
        for s in record["samples"]:
            text = s["completion"].strip()
            if s["correct"] and text not in kept:
                kept.append(text)
        rows += [{"question": record["prompt"], "answer": text} for text in kept]
    return rows


def rlkit(*args: str, log: Path) -> None:
    """``rlkit ARGS``, its output in ``log``; a stage that fails ends the bench with one line: the stage, its last
    line of output (rlkit's own one-line error for a bad setting) and the log."""
    with log.open("w", encoding="utf-8") as f:
        done = subprocess.run([sys.executable, "-m", "rlkit", *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        lines = log.read_text(encoding="utf-8").strip().splitlines() or ["(no output)"]
        print(f"rlkit {args[0]} failed (exit {done.returncode}): {lines[-1].strip()}  [{log}]", file=sys.stderr)
        raise SystemExit(done.returncode)


def table(out: Path) -> str:
    from rlkit.evaluate.results import per_problem
    from rlkit.evaluate.suite import load_suite
    from rlkit.stats import paired, show_diff

    folders = {"base": out / "eval-grpo" / "base-smollm2-135m-instruct", "GRPO": out / "eval-grpo" / "trained-grpo",
               "RFT": out / "eval-rft" / "trained-rft"}
    pairs = [("base", "GRPO"), ("base", "RFT"), ("RFT", "GRPO")]
    lines = ["| set | base | GRPO | RFT | GRPO - base | RFT - base | GRPO - RFT |", "|---|---|---|---|---|---|---|"]
    pooled: dict[str, list[float]] = {k: [] for k in folders}
    for s in load_suite("arith").sets:
        scores = {k: per_problem(json.loads((f / f"{s.name}.json").read_text())) for k, f in folders.items()}
        for k, v in scores.items():
            pooled[k] += v
        lines.append(f"| {s.name} | " + " | ".join(f"{sum(v) / len(v):.2f}" for v in scores.values()) + " | "
                     + " | ".join(show_diff(paired(scores[a], scores[b])) for a, b in pairs) + " |")
    lines.append("| all, pooled | " + " | ".join(f"{sum(v) / len(v):.3f}" for v in pooled.values()) + " | "
                 + " | ".join(show_diff(paired(pooled[a], pooled[b])) for a, b in pairs) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from rlkit.demos.stages import train_minutes
    from rlkit.runs import read_metrics

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--lr", type=float, default=1.5e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pool", type=json.loads, default=None,
                        help='both arms\' problems, a data source as JSON (default: the GRPO recipe\'s own), e.g. '
                             '\'{"synthetic": 2000, "seed": 7, "generator": {"min_value": 10, "max_value": 99}}\'')
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started_on = machine()  # the commit and machine, as the run starts
    summary: dict = {"steps": args.steps, "lr": args.lr, "seed": args.seed, "pool": args.pool or POOL}

    started = time.time()
    rlkit("train", GRPO, *[a for o in grpo_overrides(args.steps, args.lr, args.seed, args.pool) for a in ("--set", o)],
          "--output-dir", str(out / "grpo"), "--overwrite", "--no-doctor", log=out / "grpo.log")
    summary["grpo_minutes"] = minutes = train_minutes(out / "grpo")
    summary["grpo_wall_s"] = round(time.time() - started, 1)

    n = args.steps * PROMPTS_PER_STEP
    rlkit("eval", GRPO, *[a for o in sampling_overrides(args.pool) for a in ("--set", o)], "--limit", str(n),
          "--samples", str(SAMPLES), "--temperature", str(TEMPERATURE), "--out", str(out / "samples.json"),
          log=out / "samples.log")
    sampled = json.loads((out / "samples.json").read_text())["samples"]
    records = [json.loads(line) for line in Path(sampled["samples"]).read_text().splitlines()]
    rows = right_rows(records)
    (out / "rft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    left = minutes - sampled["seconds"] / 60
    if left < 0.01:
        raise SystemExit(f"sampling took {sampled['seconds']:.0f} s, GRPO trained {minutes * 60:.0f} s: no minutes "
                         "left for RFT's SFT; give GRPO more --steps")
    summary.update(sampling_s=sampled["seconds"], problems=n, rows=len(rows), rft_sft_minutes=round(left, 3),
                   problems_right=sum(any(s["correct"] for s in r["samples"]) for r in records))
    rlkit("train", SFT, *[a for o in rft_overrides(out / "rft.jsonl", args.seed) for a in ("--set", o)],
          "--max-minutes", f"{left:.3f}", "--output-dir", str(out / "rft"), "--overwrite", "--no-doctor",
          log=out / "rft.log")
    summary["rft_sft_steps"] = next(r["step"] for r in reversed(read_metrics(out / "rft")) if "train_runtime" in r)

    rlkit("eval", str(out / "grpo"), "--suite", "arith", "--out", str(out / "eval-grpo"), log=out / "eval-grpo.log")
    rlkit("eval", str(out / "rft"), "--suite", "arith", "--no-base", "--out", str(out / "eval-rft"),
          log=out / "eval-rft.log")
    (out / "table.md").write_text(table(out), encoding="utf-8")
    # Where and on what it ran, and whether other processes shared the CPUs (an equal-time comparison then is not).
    summary["machine"] = {**started_on, "others_cpu_share": others_cpu_share()}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(machine_line(summary["machine"]))
    print(json.dumps(summary, indent=2))
    print((out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
