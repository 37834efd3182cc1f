"""One GRPO step on CPU, phase by phase: seconds and peak resident memory (RSS), for the smol recipes.

Each case is `rlkit train` of a shipped recipe (a few steps, into a temporary folder) in its own process,
with `bench/stepprobe.py` wrapping TRL's GRPOTrainer methods from outside: generation, tool turns (env
calls), rewards, old/ref log-probs, the loss forward, backward, optimizer and the rest. A phase's peak is
the process's high-water RSS while that phase (not a nested one) ran; the case's peak is the process's,
as `/usr/bin/time -v` reports it (`wait4`'s max RSS). Step 1 pays one-time costs; the table shows the
last step, the growth check compares steps.

    .venv/bin/python bench/grpo_step.py                # every case, one at a time (several minutes)
    .venv/bin/python bench/grpo_step.py arith calc     # some cases
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import PYTHON, ROOT, figure, offline_env, table, write

GB = 1e9
# name: (recipe, overrides, target peak RSS in GB, what it stands for)
CASES = {
    "arith": ("smol_arith_grpo.yaml", ["trainer.max_steps=3"], 2.0,
              "smol_arith_grpo as shipped: 32 x (47-139 prompt + <= 20) tokens"),
    "calc": ("smol_calc_grpo.yaml", ["trainer.max_steps=3"], 3.0, "smol_calc_grpo as shipped: 8 x ~600 tokens"),
    "calc16": ("smol_calc_grpo.yaml", ["trainer.max_steps=2", "trainer.per_device_train_batch_size=16"], 4.0,
               "smol_calc_grpo at 16 sequences of ~600 tokens"),
    # The base model answers without searching, so its completions are forced to max_completion_length (512):
    # 8 x (~410 prompt + 512) tokens, the budget of the oracle teacher's two-search episodes with one passage per
    # search (~460 tokens of searches, results and answer after a ~410-token prompt).
    "search": ("smol_search_grpo.yaml", ["trainer.max_steps=2", "trainer.generation_kwargs={min_new_tokens: 512}"],
               4.0, "smol_search_grpo, 8 x ~920 tokens (completions forced to 512)"),
    "long8": ("smol_arith_grpo.yaml", ["trainer.max_steps=2", "trainer.per_device_train_batch_size=8",
                                       "model.max_seq_length=1100", "trainer.max_completion_length=854",
                                       "trainer.generation_kwargs={min_new_tokens: 854}"], 4.0,
              "8 episodes of 1,024 tokens (search-agent size): arith prompts, 854 sampled tokens each"),
}


def child(name: str, out: str, extra: list[str]) -> None:
    """Runs in the measured process: train the case's recipe with the probe installed."""
    from rlkit.compat import torch_huge_pages

    torch_huge_pages()  # as the rlkit CLI does, before any tensor exists
    sys.path.insert(0, str(ROOT / "bench"))
    import stepprobe

    from rlkit.runs import read_metrics
    from rlkit.train import train

    recipe, overrides, *_ = CASES[name]
    probe = stepprobe.install()
    with tempfile.TemporaryDirectory(prefix="rlkit-grpo-step-") as tmp:
        run_dir = train(ROOT / "recipes" / recipe, [*overrides, *extra], output_dir=Path(tmp) / "run", doctor=False)
        metrics = [{k: m[k] for k in ("step", "loss", "reward") if k in m} for m in read_metrics(run_dir)
                   if "loss" in m]
    Path(out).write_text(json.dumps({"steps": probe.steps, "metrics": metrics, "lengths": probe.lengths}))


def run_case(name: str, extra: list[str] = ()) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        started = time.perf_counter()
        proc = subprocess.Popen([PYTHON, __file__, "--child", name, out.name, *extra], cwd=ROOT,
                                env=offline_env(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"),
                                                PYTHONPATH=str(ROOT)))
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"bench/grpo_step.py: case {name} failed")
        doc = json.loads(Path(out.name).read_text())
    # The probe resets the kernel's high-water mark at each phase boundary, so wait4's figure is a lower bound.
    probed = max(s["_step"]["peak_bytes"] for s in doc["steps"])
    doc.update(name=name, peak_bytes=max(usage.ru_maxrss * 1024, probed), seconds=time.perf_counter() - started,
               load=os.getloadavg()[0])
    return doc


def phase_rows(doc: dict) -> list[list]:
    import stepprobe

    last = doc["steps"][-1]
    total = last["_step"]["seconds"]
    return [[phase, last[phase]["seconds"], f"{last[phase]['seconds'] / total:.0%}", last[phase]["peak_bytes"] / GB,
             last[phase]["calls"]] for phase in stepprobe.ORDER if phase in last] + \
        [["whole step", total, "100%", last["_step"]["peak_bytes"] / GB, 1]]


def dominant(name: str, doc: dict) -> str:
    """One line: which phase takes the step's time and which holds its peak (the last step)."""
    last = doc["steps"][-1]
    phases = {k: v for k, v in last.items() if not k.startswith("_")}
    slow = sorted(phases, key=lambda k: -phases[k]["seconds"])[:2]
    high = max(phases, key=lambda k: phases[k]["peak_bytes"])
    total = last["_step"]["seconds"]
    share = " and ".join(f"{k} {phases[k]['seconds'] / total:.0%}" for k in slow)
    return (f"{name}: the last step's time goes to {share} (of {total:.1f} s); its peak, "
            f"{phases[high]['peak_bytes'] / GB:.2f} GB, is in {high}")


def matmul_gflops(threads: int) -> float:
    """bf16 matmul throughput of this CPU at the model's MLP shape (4,096 tokens x 576 -> 1,536), the best a
    step's forward and backward passes could run at."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(4096, 576, dtype=torch.bfloat16), torch.randn(576, 1536, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < 2.0:
        a @ b
        calls += 1
    return 2 * 4096 * 576 * 1536 * calls / (time.perf_counter() - started) / 1e9


def body_params() -> int:
    """Weights every token is multiplied by in SmolLM2-135M's layers (attention and MLP, no embedding/head)."""
    from transformers import AutoConfig

    from rlkit.tiny import resolve_model_id

    c = AutoConfig.from_pretrained(resolve_model_id("rlkit/smollm2-135m-instruct"))
    kv = c.num_key_value_heads * getattr(c, "head_dim", c.hidden_size // c.num_attention_heads)
    return c.num_hidden_layers * (2 * c.hidden_size * c.hidden_size + 2 * c.hidden_size * kv
                                  + 3 * c.hidden_size * c.intermediate_size)


def floor_seconds(doc: dict, params: int, gflops: float) -> float:
    """The last step's matmuls at the measured bf16 rate: generation's prefill of the prompts, then the loss
    forward, its recomputation (gradient checkpointing) and the input-gradient pass over prompt + completion.
    Left out, so a lower bound: decoding, the prefill of each later tool turn, attention, the LM head and LoRA's
    own matmuls."""
    n = doc["lengths"][-1]
    tokens = n["batch"] * n["prompt_width"] + 3 * n["batch"] * (n["prompt_width"] + n["completion_width"])
    return 2 * params * tokens / (gflops * 1e9)


def main(names: list[str]) -> None:
    results = {name: run_case(name) for name in names or CASES}
    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    gflops, params = matmul_gflops(threads), body_params()
    figures, tables, notes = [figure(f"bf16 matmul, {threads} threads", gflops, "GFLOP/s", digits=0)], [], []
    for name, doc in results.items():
        _, _, target, what = CASES[name]
        peaks = [s["_step"]["peak_bytes"] / GB for s in doc["steps"]]
        seconds = doc["steps"][-1]["_step"]["seconds"]
        floor = floor_seconds(doc, params, gflops)
        figures.append(figure(f"{name}: peak RSS", doc["peak_bytes"] / GB, "GB", at_most=target, note=what))
        figures.append(figure(f"{name}: seconds per step (last)", seconds, "s", digits=1))
        if name == "arith":  # issue 31: `make demo`'s 10 GRPO steps in a minute on 2 idle cores
            figures.append(figure("arith: 10 steps at the last step's time", 10 * seconds, "s", at_most=60, digits=0))
            figures.append(figure("arith: 10 steps' matmuls at the bf16 rate (floor)", 10 * floor, "s", digits=0))
        notes.append(dominant(name, doc) + f"; its prefill and loss matmuls alone need {floor:.1f} s at the "
                                           "measured bf16 rate")
        if len(peaks) >= 3:
            figures.append(figure(f"{name}: last step's peak / step 2's", peaks[-1] / peaks[1], "x", at_most=1.05,
                                  digits=3))
        tables.append(table(f"{name}: {what}; last of {len(peaks)} steps (load {doc['load']:.1f})",
                            ["phase", "seconds", "share", "peak RSS GB", "calls"], phase_rows(doc)))
    notes.append("The floor counts generation's prefill, the loss forward, its recomputation under gradient "
                 "checkpointing and the input-gradient pass as matmuls of every token by the layers' "
                 f"{params / 1e6:.0f}M weights at the measured rate; decoding, later tool turns' prefill, attention, "
                 "the LM head and LoRA are left out. "
                 "Earlier measurements, and what changed each figure: bench/results/grpo_step_history.md.")
    write("grpo_step", "GRPO step profile on CPU: seconds and peak memory per phase", figures, tables,
          what="`rlkit train` of the smol GRPO recipes for a few steps, TRL's GRPOTrainer methods timed from outside "
               "(bench/stepprobe.py); peak RSS per phase is the process high-water mark while that phase ran.",
          details=results, notes=notes)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif sys.argv[1:2] == ["--one"]:  # one case, extra --set overrides, nothing written: for trying a change
        from common import show

        found = run_case(sys.argv[2], sys.argv[3:])
        show(table(f"{sys.argv[2]} {sys.argv[3:]}: peak {found['peak_bytes'] / GB:.2f} GB, load {found['load']:.1f}",
                   ["phase", "seconds", "share", "peak RSS GB", "calls"], phase_rows(found)))
        print(json.dumps({"peaks": [s["_step"]["peak_bytes"] / GB for s in found["steps"]],
                          "rss_at_step_begin": [s["_begin"]["peak_bytes"] / GB for s in found["steps"]],
                          "metrics": found["metrics"], "lengths": found["lengths"], "steps": found["steps"]}))
    else:
        main(sys.argv[1:])
