"""Two CPU processes (gloo) through accelerate: smoke SFT and GRPO complete, both ranks take part, rank 0 alone
writes the run directory (one adapter, one metrics row per step), and the logs say which rank is which."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.recipe import recipes_dir

RLKIT = str(Path(sys.executable).parent / "rlkit")


@pytest.mark.report
@pytest.mark.parametrize(("recipe", "epoch_after_step_1"), [
    ("tiny_arith_sft.yaml", 0.25),     # 32 rows, 4 per device x 2 processes
    ("tiny_arith_grpo.yaml", 0.0625),  # 32 prompts, 1 prompt (4 completions) per device x 2 processes
])
def test_two_cpu_processes_train_once(tmp_path, recipe, epoch_after_step_1):
    out = tmp_path / "run"
    env = {**os.environ, "RLKIT_LOG_LEVEL": "INFO"}
    res = subprocess.run([RLKIT, "train", str(recipes_dir() / recipe), "--smoke", "--num-processes", "2",
                          "--output-dir", str(out), "--set", "init_from=null"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    log = res.stdout + res.stderr
    # Both ranks took part: the global batch doubled, each rank saved its RNG state, each logged its share.
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 1 and first["epoch"] == pytest.approx(epoch_after_step_1)
    checkpoint = out / "checkpoints" / "checkpoint-2"
    assert (checkpoint / "rng_state_0.pth").is_file() and (checkpoint / "rng_state_1.pth").is_file()
    assert "[rank 0/2] rank 0 of 2" in log and "[rank 1/2] rank 1 of 2" in log
    # Rank 0 alone wrote the run directory: one adapter, one metrics row per step, nothing half-written.
    adapters = sorted(p.parent.relative_to(out) for p in out.rglob("adapter_model.safetensors"))
    assert adapters == [Path("adapter"), Path("checkpoints/checkpoint-2")]
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 2]
    assert not [p for p in out.rglob("*") if ".partial" in p.name]
    assert (out / "report.md").is_file() and (out / "plots" / "loss.png").is_file()
    assert log.count("run directory:") == 1 and "Traceback" not in log
