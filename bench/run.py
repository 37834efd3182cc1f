"""Run the CPU benchmarks (what `make bench` does) and write `bench/results/README.md`: every figure next to
its target, and the machine it was measured on.

    .venv/bin/python bench/run.py                 # all of them, about 5 minutes on an idle 2-core machine
    .venv/bin/python bench/run.py retrieval help  # some of them; the summary still lists every result on disk

Each benchmark runs as its own process and writes `results/<name>.json` and `results/<name>.md`.
`bench/gpu.py` is not run here (it needs CUDA and takes longer); its results, when present, are listed too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from common import BENCH, PYTHON, RESULTS, ROOT, busy, figures_table, machine_line, markdown, offline_env, show, table

CPU_BENCHMARKS = ("help", "rewards", "retrieval", "rollout", "overhead", "generation", "mcp_tools", "soak_search",
                  "grpo_step", "bf16_units")


def summary(seconds: dict[str, float]) -> str:
    # The benchmarks' own results only: other JSON there (bench/rss_trace.py's traces) has no figures.
    docs = [json.loads(p.read_text()) for name in (*CPU_BENCHMARKS, "gpu") if (p := RESULTS / f"{name}.json").is_file()]
    figures = [{**f, "bench": f"[{d['name']}]({d['name']}.md)"} for d in docs for f in d["figures"]]
    machines = sorted({machine_line(d["machine"], when=False) for d in docs})
    runs = table("When each ran", ["benchmark", "date (UTC)", "git", "CPU share used by other processes"],
                 [[d["name"], d["machine"]["date"], d["machine"]["git"] or "?", _share(d["machine"])] for d in docs])
    targets = [f for f in figures if f["target"]]
    met = sum(bool(f["met"]) for f in targets)
    parts = ["# Benchmark results",
             f"{met} of {len(targets)} targets met. Each benchmark's page has its measurements, method and notes.",
             markdown(figures_table(figures, with_bench=True)),
             "## Machine" + ("s" if len(machines) > 1 else ""), "\n".join(f"- {m}" for m in machines),
             markdown(runs)]
    if any(busy(d["machine"]) for d in docs):
        parts.append("**Some benchmarks ran on a busy machine** (other processes used more than a quarter of the "
                     "CPUs): their timings are not trustworthy; re-run `make bench` on an idle machine.")
    if seconds:
        took = ", ".join(f"{name} {s:.0f} s" for name, s in seconds.items())
        parts.append(f"This run of `bench/run.py` took {sum(seconds.values()):.0f} s ({took}).")
    parts.append("Reproduce: `make bench` (CPU benchmarks, offline); `python bench/gpu.py` on a CUDA machine.")
    return "\n\n".join(parts) + "\n"


def _share(m: dict) -> str:
    share = m.get("others_cpu_share")
    return "?" if share is None else f"{share:.0%}" + (" (busy)" if busy(m) else "")


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in CPU_BENCHMARKS]
    if unknown:
        print(f"bench/run.py: unknown benchmark {unknown[0]!r}; valid: {', '.join(CPU_BENCHMARKS)}", file=sys.stderr)
        return 2
    seconds, failed = {}, []
    for name in names or CPU_BENCHMARKS:
        print(f"== {name}", flush=True)
        started = time.perf_counter()
        done = subprocess.run([PYTHON, str(BENCH / f"{name}.py")], cwd=ROOT, env=offline_env())
        seconds[name] = time.perf_counter() - started
        if done.returncode != 0:
            failed.append(name)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "README.md").write_text(summary(seconds))
    docs = [json.loads((RESULTS / f"{n}.json").read_text()) for n in seconds if (RESULTS / f"{n}.json").exists()]
    show(figures_table([{**f, "bench": d["name"]} for d in docs for f in d["figures"]], with_bench=True))
    print(f"wrote {(RESULTS / 'README.md').relative_to(ROOT)} ({sum(seconds.values()):.0f} s)")
    if failed:
        print(f"bench/run.py: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
