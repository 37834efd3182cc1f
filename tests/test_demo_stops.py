"""A demo stopped in any stage, by SIGTERM or Ctrl-C (SIGINT), ends with one line naming the stage and the signal and
exits 128 + the signal's number (143, 130), with no traceback; a training stage keeps its how-to-resume message behind
the stage's name, and a stage process killed from outside is named too. A real `rlkit demo` process (its demo swapped
for one short stage) gets a real signal."""

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals, Linux process groups")

DEMO = """
import signal, sys
# As at a terminal: a test worker (or a background job) starts with SIGINT ignored, and Python keeps it so.
signal.signal(signal.SIGINT, signal.default_int_handler)
import rlkit.demos.tiny
from rlkit.cli import main

name, where, code, out = sys.argv[1:5]

def one_stage(output_dir):
    from rich.console import Console
    from rlkit.demos.stages import Stages
    stages = Stages(Console())
    if where == "here":
        stages.run(name, lambda: exec(code))
    else:
        stages.run_fresh(name, exec, code)  # a builtin: it pickles into the fresh process

rlkit.demos.tiny.run_demo = one_stage
sys.argv = ["rlkit", "demo", "--tiny", "--output-dir", out]
main()
"""
WAIT = "open({ready!r}, 'w').close(); import time; time.sleep(120)"
# What rlkit.train does on a signal (test_resume runs the real one): finish the step, checkpoint, say how to resume.
TRAIN = ("import signal, time\nfrom rlkit.errors import Interrupted\n"
         "def stop(signum, frame):\n"
         "    raise Interrupted(f'{{signal.Signals(signum).name}}: stopped at step 3/40; checkpoint saved in "
         "runs/demo/sft/checkpoints/checkpoint-3; resume with: rlkit train smol_arith_sft.yaml --resume', 128 + signum)\n"
         "signal.signal(signal.SIGTERM, stop)\nopen({ready!r}, 'w').close()\ntime.sleep(120)")


def _stop(tmp_path, stage, where, code, signum):
    """Run the demo until its stage is under way, send ``signum`` (None: none), return (exit code, stderr)."""
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", DEMO, stage, where, code.format(ready=str(ready)), str(tmp_path)],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    deadline = time.time() + 240
    while not ready.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    if signum is not None and proc.poll() is None:
        os.kill(proc.pid, signum)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, err


@pytest.mark.parametrize(("where", "signum", "code"), [
    ("here", signal.SIGTERM, 143), ("here", signal.SIGINT, 130),
    ("fresh", signal.SIGTERM, 143), ("fresh", signal.SIGINT, 130)])
def test_a_stopped_stage_is_one_line_with_the_signal_s_exit_code(tmp_path, where, signum, code):
    returncode, err = _stop(tmp_path, "GRPO eval", where, WAIT, signum)
    name = signal.Signals(signum).name
    assert returncode == code, err
    assert err.strip().splitlines()[-1] == f"rlkit: GRPO eval: stopped by {name} before it finished"
    assert "Traceback" not in err and "partial" not in err and err.count("rlkit: ") == 1


def test_a_stopped_training_stage_says_how_to_resume_behind_its_name(tmp_path):
    returncode, err = _stop(tmp_path, "SFT training", "fresh", TRAIN, signal.SIGTERM)
    assert returncode == 143, err
    assert err.strip().splitlines()[-1] == (
        "rlkit: SFT training: SIGTERM: stopped at step 3/40; checkpoint saved in runs/demo/sft/checkpoints/"
        "checkpoint-3; resume with: rlkit train smol_arith_sft.yaml --resume")
    assert "Traceback" not in err


def test_a_stage_process_killed_from_outside_is_named(tmp_path):
    """SIGKILL, as the out-of-memory killer sends it: the stage's process ends without a word."""
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    returncode, err = _stop(tmp_path, "GRPO training", "fresh", kill, None)
    assert returncode == 137, err
    assert err.strip().splitlines()[-1] == ("rlkit: GRPO training: its process was killed by SIGKILL before it "
                                            "finished (most often the out-of-memory killer: see `dmesg`)")
    assert "Traceback" not in err
