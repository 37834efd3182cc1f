"""A reward and no worked answers: GRPO against rejection-sampling fine-tuning (RFT) given the same minutes (issue 48).

Where worked answers exist, SFT on them beat GRPO's minutes on every demo (README). This asks the question for
what is left, a task with problems and a checker but no answer to imitate: `make demo`'s arithmetic pool with its
two worked turns in the prompt (``data.prompt: short``, the base's few-shot form), from the base model, no SFT.

- GRPO: ``smol_arith_grpo`` from the base (``--steps`` steps of 8 prompts x 4 completions at ``--lr``), rewarded
  by the right final number, as the demo.
- RFT, the SFT a user without worked answers can run (STaR / expert iteration; one round unless ``--rft-rounds``):
  ``rlkit eval --samples 4 --temperature 0.8`` on as many pool problems as GRPO saw (``--steps`` x 8), the same
  completion budget; every distinct right completion becomes an SFT row; ``smol_arith_sft`` on those rows, at its
  learning rate held constant, for GRPO's training minutes less the sampling's (``rlkit train --max-minutes``).
  The sampling is seeded by ``rlkit eval`` (torch seed 0): ``--seed`` changes GRPO's and the SFT's seeds, not
  RFT's rows. ``--rft-rounds R``: expert iteration in R rounds within the same minutes, sampling included: each
  round samples its share of the problems (fresh ones from the same generator) from the model so far and continues
  the SFT on every right completion so far. ``--grpo-from DIR`` compares with the GRPO run of an earlier
  ``--out``. ``--prompt FORM`` gives both arms another prompt form (``mix``: short, short-zero or bare per
  problem, so replies without worked turns earn rewards too; RFT's rows are prompted as they were sampled).
- Both evaluated on every set of the ``arith`` suite (``rlkit eval RUN --suite arith``), beside the base.

    python bench/reward_only.py --out /tmp/reward-only              # 12 GRPO steps at lr 1.5e-4, seed 0
    python bench/reward_only.py --out /tmp/ro-s1 --seed 1 --steps 36
    python bench/reward_only.py --out /tmp/ro-s1-r3 --grpo-from /tmp/ro-s1 --rft-rounds 3   # the same GRPO run
    python bench/reward_only.py --out /tmp/ro-2d --pool '{"synthetic": 2000, "seed": 7, "generator": {"min_value": 10,
        "max_value": 99, "max_steps": 1}}'                       # two-digit + and -: rarer right answers

Every stage is an ``rlkit`` command in a process of its own, as a user would type it (in float32 on a CPU without
bf16 matmul units, as the demos run there); ``table.md`` in ``--out`` holds the per-set accuracies and the paired
differences (GRPO - base, RFT - base, GRPO - RFT; exact McNemar p).
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]  # rlkit from the checkout, installed or not

from common import machine, machine_line, others_cpu_share  # noqa: E402  (after the path is set)
from gpu_smol import GPU_MODEL  # noqa: E402

from rlkit.demos.stages import control_overrides, machine_overrides, train_minutes  # noqa: E402
from rlkit.runs import read_metrics  # noqa: E402

GRPO, SFT = "recipes/smol_arith_grpo.yaml", "recipes/smol_arith_sft.yaml"
POOL = {"synthetic": 2000, "seed": 7, "generator": {"max_value": 50, "ops": "+-*", "max_factor": 12, "max_steps": 1}}
PROMPTS_PER_STEP, SAMPLES, TEMPERATURE = 8, 4, 0.8  # the GRPO recipe's 8 prompts x 4 completions at 0.8


def grpo_overrides(steps: int, lr: float, seed: int, pool: dict | None = None, prompt: str = "short") -> list[str]:
    return [f"data.prompt={prompt}", f"trainer.learning_rate={lr}", f"trainer.max_steps={steps}",
            f"trainer.seed={seed}", *([f"data.train={json.dumps(pool)}"] if pool else [])]


def sampling_overrides(pool: dict | None = None, prompt: str = "short") -> list[str]:
    return [f"data.prompt={prompt}", f"data.eval={json.dumps(pool or POOL)}"]


def rft_overrides(rows: Path, seed: int, adapter: Path | None = None, prompt: str = "short") -> list[str]:
    """``smol_arith_sft`` on the right samples (from ``adapter``, else the base), trained as the demos' equal-time
    control is: lr constant until ``--max-minutes``."""
    return control_overrides([f"data.prompt={prompt}", f"trainer.seed={seed}"], adapter, {"path": str(rows)})


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


@functools.cache
def machine_sets(grpo: bool = False) -> tuple[str, ...]:
    """``--set model.dtype=float32`` on a CPU without bf16 matmul units, as the demos choose (their bf16 is emulated
    there, 5-20x slower: 36 GRPO steps would take hours); nothing on a CPU whose bf16 runs natively; on a GPU what
    ``bench/gpu_smol.py`` sets: SDPA attention, and for GRPO's training (``grpo``) no static cache, which is for a
    CPU's eager attention."""
    from rich.console import Console

    from rlkit.backends import cuda_available

    if cuda_available():
        overrides = GPU_MODEL + (["trainer.cache_implementation=null"] if grpo else [])
    elif grpo:
        return machine_sets(False)  # a CPU's are every stage's (and its line is printed once)
    else:
        overrides = machine_overrides(Console(stderr=True))
    return tuple(a for o in overrides for a in ("--set", o))


def rlkit(*args: str, log: Path, grpo: bool = False) -> None:
    """``rlkit ARGS`` (with :func:`machine_sets`; ``grpo``: GRPO's training), its output in ``log``; a stage that
    fails ends the bench with one line: the stage, its last line of output (rlkit's own one-line error for a bad
    setting) and the log."""
    with log.open("w", encoding="utf-8") as f:
        done = subprocess.run([sys.executable, "-m", "rlkit", *args, *machine_sets(grpo)], cwd=ROOT, stdout=f,
                              stderr=subprocess.STDOUT)
    if done.returncode:
        lines = log.read_text(encoding="utf-8").strip().splitlines() or ["(no output)"]
        print(f"rlkit {args[0]} failed (exit {done.returncode}): {lines[-1].strip()}  [{log}]", file=sys.stderr)
        raise SystemExit(done.returncode)


def table(out: Path, grpo_evals: Path | None = None) -> str:
    """The per-set table from the suite evals (``rlkit compare``'s pairing): GRPO's (and the base's) in
    ``grpo_evals`` (default ``out/eval-grpo``), RFT's in ``out/eval-rft``."""
    from rlkit.evaluate.suite import compare_suites
    from rlkit.stats import show_diff

    grpo_evals = grpo_evals or out / "eval-grpo"
    arms = [f"base={grpo_evals}:base", f"GRPO={grpo_evals}", f"RFT={out / 'eval-rft'}"]
    from_base, from_rft = compare_suites(arms)["rows"], compare_suites([arms[2], arms[1]])["rows"]
    lines = ["| set | base | GRPO | RFT | GRPO - base | RFT - base | GRPO - RFT |", "|---|---|---|---|---|---|---|"]
    for i, (row, other) in enumerate(zip(from_base, from_rft, strict=True)):
        pooled = i == len(from_base) - 1
        accuracies = [f"{row['accuracy'][k]['accuracy']:.{3 if pooled else 2}f}" for k in ("base", "GRPO", "RFT")]
        diffs = [row["diff"]["GRPO - base"], row["diff"]["RFT - base"], other["diff"]["GRPO - RFT"]]
        lines.append(f"| {'all, pooled' if pooled else row['set']} | " + " | ".join(accuracies) + " | "
                     + " | ".join(show_diff(d) for d in diffs) + " |")
    return "\n".join(lines) + "\n"


def round_pool(pool: dict, k: int) -> dict:
    """Round ``k``'s problems (1-based): round 1 samples the pool itself, each later round fresh problems from the
    same generator (the pool's seed moved on by ``k - 1``)."""
    return pool if k == 1 else {**pool, "seed": pool.get("seed", 0) + k - 1}


def rft(out: Path, summary: dict, minutes: float, rounds: int, seed: int, pool: dict, prompt: str = "short") -> None:
    """RFT in ``rounds`` rounds within ``minutes`` (sampling included; the greedy pass ``rlkit eval --samples`` also
    makes is not): each round samples its share of the problems from the model so far (the base, then the last
    round's adapter), adds the distinct right completions to the rows and trains the last adapter on all the rows so
    far (a fresh optimizer) for its share of the minutes left (``sft_budget_minutes``; ``sft_minutes`` is what the
    loop took, stopped at the first step past the budget)."""
    n = summary["steps"] * PROMPTS_PER_STEP // rounds
    rows: list[dict[str, str]] = []
    used, summary["rft_rounds"] = 0.0, []
    for k in range(1, rounds + 1):
        name = "rft" if k == rounds else f"rft-round{k}"
        before = [] if k == 1 else ["--model", str(out / f"rft-round{k - 1}")]
        sets = [a for o in sampling_overrides(round_pool(pool, k), prompt) for a in ("--set", o)]
        rlkit("eval", GRPO, *before, *sets,
              "--limit", str(n), "--samples", str(SAMPLES), "--temperature", str(TEMPERATURE),
              "--out", str(out / f"samples-{k}.json"), log=out / f"samples-{k}.log")
        sampled = json.loads((out / f"samples-{k}.json").read_text())["samples"]
        records = [json.loads(line) for line in Path(sampled["samples"]).read_text().splitlines()]
        new = [r for r in right_rows(records) if r not in rows]
        rows += new
        (out / f"rft-{k}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        share = (minutes - used) / (rounds - k + 1) - sampled["seconds"] / 60
        if share < 0.01:
            raise SystemExit(f"round {k}'s sampling took {sampled['seconds']:.0f} s, leaving its SFT no minutes of "
                             f"GRPO's {minutes * 60:.0f} s: give GRPO more --steps or RFT fewer --rft-rounds")
        adapter = None if k == 1 else out / f"rft-round{k - 1}"
        sets = [a for o in rft_overrides(out / f"rft-{k}.jsonl", seed, adapter, prompt) for a in ("--set", o)]
        rlkit("train", SFT, *sets,
              "--max-minutes", f"{share:.3f}", "--output-dir", str(out / name), "--overwrite", "--no-doctor",
              log=out / f"{name}.log")
        steps = next(r["step"] for r in reversed(read_metrics(out / name)) if "train_runtime" in r)
        trained = train_minutes(out / name)
        used += sampled["seconds"] / 60 + trained
        summary["rft_rounds"].append({"problems": n, "sampling_s": sampled["seconds"], "new_rows": len(new),
                                      "rows": len(rows), "sft_budget_minutes": round(share, 3),
                                      "sft_minutes": round(trained, 3), "sft_steps": steps,
                                      "problems_right": sum(any(s["correct"] for s in r["samples"]) for r in records)})
    summary.update(rows=len(rows), rft_minutes_used=round(used, 3),
                   rft_sft_steps=sum(r["sft_steps"] for r in summary["rft_rounds"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default 12)")
    parser.add_argument("--lr", type=float, default=None, help="GRPO's learning rate (default 1.5e-4)")
    parser.add_argument("--seed", type=int, default=None, help="GRPO's and the SFT's seed (default 0)")
    parser.add_argument("--pool", type=json.loads, default=None,
                        help='both arms\' problems, a data source as JSON (default: the GRPO recipe\'s own), e.g. '
                             '\'{"synthetic": 2000, "seed": 7, "generator": {"min_value": 10, "max_value": 99}}\'')
    parser.add_argument("--prompt", default=None,
                        help="both arms' prompt form, data.prompt (default short: the demo's system line and two "
                             "worked turns; mix: short, short-zero or bare per problem)")
    parser.add_argument("--rft-rounds", type=int, default=1, choices=range(1, 9), metavar="{1..8}",
                        help="RFT in this many rounds, each sampling from the last round's model (default 1)")
    parser.add_argument("--grpo-from", type=Path, default=None,
                        help="an earlier bench --out whose GRPO run and evals to compare with (its steps, lr, seed "
                             "and pool; no GRPO trained here)")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    earlier = args.grpo_from.resolve() if args.grpo_from else None
    if earlier is not None and not (earlier / "summary.json").is_file():
        parser.error(f"--grpo-from {args.grpo_from}: no summary.json there; give the --out of a finished bench run")
    if earlier == out:
        parser.error("--grpo-from is the --out folder; give a new --out")
    given = [f"--{k}" for k in ("steps", "lr", "seed", "pool", "prompt") if getattr(args, k) is not None]
    if earlier is not None and given:
        parser.error(f"--grpo-from takes GRPO's steps, lr, seed and pool from that run; drop {', '.join(given)}")
    then: dict = {}
    if earlier is not None:
        try:
            then = json.loads((earlier / "summary.json").read_text())
            then.setdefault("pool", POOL)  # a run from before summary.json named its pool trained on the default
            then.setdefault("prompt", "short")  # ... and before --prompt, on the demo's prompt form
            then = {**{k: then[k] for k in ("steps", "lr", "seed", "pool", "prompt", "grpo_minutes", "grpo_wall_s")},
                    "machine": then.get("machine")}
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            parser.error(f"--grpo-from {args.grpo_from}: its summary.json is not a finished bench run's ({e!r})")
    steps, lr, seed = (12 if args.steps is None else args.steps, 1.5e-4 if args.lr is None else args.lr,
                       0 if args.seed is None else args.seed)
    out.mkdir(parents=True, exist_ok=True)
    started_on = machine()  # the commit and machine, as the run starts
    summary: dict = {"steps": steps, "lr": lr, "seed": seed, "pool": args.pool or POOL,
                     "prompt": args.prompt or "short"}
    if earlier is None:
        started = time.time()
        sets = [a for o in grpo_overrides(steps, lr, seed, args.pool, summary["prompt"]) for a in ("--set", o)]
        rlkit("train", GRPO, *sets,
              "--output-dir", str(out / "grpo"), "--overwrite", "--no-doctor", log=out / "grpo.log", grpo=True)
        summary["grpo_minutes"] = train_minutes(out / "grpo")
        summary["grpo_wall_s"] = round(time.time() - started, 1)
    else:
        summary = {k: v for k, v in then.items() if k != "machine"}
        summary["grpo_from"] = {"out": str(earlier), "machine": then.get("machine")}
        print(f"GRPO from {earlier}: {summary['steps']} steps, lr {summary['lr']}, seed {summary['seed']}, "
              f"{summary['grpo_minutes']:.2f} min", flush=True)

    # This run's (GRPO's own: its training's); GRPO's from --grpo-from ran with that run's.
    summary["machine_sets"] = list(machine_sets(False))
    summary["grpo_machine_sets"] = list(machine_sets(True))
    rft(out, summary, summary["grpo_minutes"], args.rft_rounds, summary["seed"], summary["pool"], summary["prompt"])
    grpo_evals = out / "eval-grpo"
    if earlier is None:
        rlkit("eval", str(out / "grpo"), "--suite", "arith", "--out", str(grpo_evals), log=out / "eval-grpo.log")
    else:
        grpo_evals = earlier / "eval-grpo"
    rlkit("eval", str(out / "rft"), "--suite", "arith", "--no-base", "--out", str(out / "eval-rft"),
          log=out / "eval-rft.log")
    (out / "table.md").write_text(table(out, grpo_evals), encoding="utf-8")
    # Where and on what it ran, and whether other processes shared the CPUs (an equal-time comparison then is not).
    summary["machine"] = {**started_on, "others_cpu_share": others_cpu_share()}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(machine_line(summary["machine"]))
    print(json.dumps(summary, indent=2))
    print((out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
