"""Interrupting and resuming training: SIGINT/SIGTERM save a checkpoint, SIGKILL loses only the steps since the
last complete one, and a resumed run ends where an uninterrupted one does."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlkit.errors import Interrupted, UserError
from rlkit.recipe import recipes_dir
from rlkit.train import train

SFT = recipes_dir() / "tiny_arith_sft.yaml"
RLKIT = str(Path(sys.executable).parent / "rlkit")


def steps(run_dir, key="loss"):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[key] for r in rows if key in r}


def signal_after_step(run_dir, step, signum=signal.SIGINT):
    """Send ``signum`` to this process once ``step`` shows in the run's metrics."""
    def watch():
        deadline = time.time() + 120
        while time.time() < deadline:
            path = run_dir / "metrics.jsonl"
            if path.is_file() and max(steps(run_dir), default=0) >= step:
                os.kill(os.getpid(), signum)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.report
def test_sigint_saves_a_checkpoint_and_resume_ends_where_an_uninterrupted_run_does(tmp_path):
    overrides = ["trainer.max_steps=8", "trainer.save_steps=100"]
    reference = train(SFT, overrides, smoke=True, output_dir=tmp_path / "reference")

    run_dir = tmp_path / "run"
    watcher = signal_after_step(run_dir, 2)
    with pytest.raises(Interrupted) as stopped:
        train(SFT, overrides, smoke=True, output_dir=run_dir)
    watcher.join()
    assert stopped.value.exit_code == 130
    message = str(stopped.value)
    assert message.startswith("SIGINT: stopped at step ") and "/8; checkpoint saved in " in message
    assert message.endswith(f"resume with: rlkit train {SFT} --resume --smoke --output-dir {run_dir} "
                            "--set trainer.max_steps=8 --set trainer.save_steps=100")
    stopped_at = int(message.split("step ")[1].split("/")[0])
    assert 2 <= stopped_at < 8
    # The checkpoint was saved on the signal although save_steps is 100; no final adapter yet.
    assert (run_dir / "checkpoints" / f"checkpoint-{stopped_at}" / "rlkit-complete.json").is_file()
    assert not (run_dir / "adapter").exists()
    assert (run_dir / "report.md").is_file()  # the partial run's plots and report

    with pytest.raises(UserError, match="holds an unfinished run .*pass --resume to continue it"):
        train(SFT, overrides, smoke=True, output_dir=run_dir)
    train(SFT, overrides, smoke=True, output_dir=run_dir, resume=True)

    # Same losses at every step, each step logged once, and the same final weights.
    assert sorted(steps(run_dir)) == list(range(1, 9))
    assert steps(run_dir) == pytest.approx(steps(reference), rel=1e-5)
    ours = load_file(run_dir / "adapter" / "adapter_model.safetensors")
    theirs = load_file(reference / "adapter" / "adapter_model.safetensors")
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum("train_runtime" in r for r in rows) == 1


def test_resume_refusals(tmp_path):
    with pytest.raises(UserError, match="no run to resume there; drop --resume"):
        train(SFT, smoke=True, output_dir=tmp_path / "nothing", resume=True)
    with pytest.raises(UserError, match="--resume continues .* choose one"):
        train(SFT, smoke=True, output_dir=tmp_path / "nothing", resume=True, overwrite=True)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "recipe.resolved.yaml").write_text((recipes_dir() / "tiny_arith_sft.yaml").read_text())
    with pytest.raises(UserError, match="no complete checkpoint to resume from"):
        train(SFT, smoke=True, output_dir=run_dir, resume=True)
    assert (run_dir / "recipe.resolved.yaml").is_file()  # a failed resume deletes nothing


def test_a_run_killed_before_its_first_checkpoint_never_blocks_a_retry(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "checkpoint-2").mkdir(parents=True)  # half-written: no rlkit-complete.json
    (run_dir / "recipe.resolved.yaml").write_text("name: killed\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    train(SFT, smoke=True, output_dir=run_dir)
    assert (run_dir / "adapter" / "adapter_config.json").is_file()
    assert steps(run_dir) and "killed" not in (run_dir / "recipe.resolved.yaml").read_text()
    # A directory that is not an rlkit run is never replaced.
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="not empty; pass --overwrite"):
        train(SFT, smoke=True, output_dir=other)
    assert (other / "notes.txt").read_text() == "keep me"


def test_a_second_signal_stops_at_once_with_its_exit_code_and_the_run_resumes(tmp_path):
    overrides = ["trainer.max_steps=30", "trainer.save_steps=2"]
    run_dir = tmp_path / "run"

    def both():  # SIGINT, then SIGTERM before the step that the first one lets finish has ended
        deadline = time.time() + 120
        metrics = run_dir / "metrics.jsonl"
        while time.time() < deadline and not (metrics.is_file() and max(steps(run_dir), default=0) >= 3):
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)

    watcher = threading.Thread(target=both, daemon=True)
    watcher.start()
    with pytest.raises(Interrupted) as stopped:  # before: a bare KeyboardInterrupt (the CLI: exit 130, no line)
        train(SFT, overrides, smoke=True, output_dir=run_dir)
    watcher.join()
    message = str(stopped.value)
    assert stopped.value.exit_code == 143  # the signal that stopped it: the second
    assert message.startswith("SIGINT, then SIGTERM: stopped at once after step ") and "--resume" in message
    from rlkit import runs

    saved = runs.checkpoints(run_dir)  # complete ones only; "checkpoint saved in" names the newest
    assert saved and f"checkpoint saved in {saved[-1]}" in message
    assert not (run_dir / "adapter").exists() and not (run_dir / "report.md").exists()  # at once: no report either
    train(SFT, overrides, smoke=True, output_dir=run_dir, resume=True)
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file() and max(steps(run_dir)) == 30


def _start(run_dir, *extra):
    env = {**os.environ, "RLKIT_LOG_LEVEL": "INFO"}
    return subprocess.Popen([RLKIT, "train", str(SFT), "--smoke", "--output-dir", str(run_dir),
                             "--set", "trainer.max_steps=12", "--set", "trainer.save_steps=2", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_checkpoint(run_dir, proc):
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if list((run_dir / "checkpoints").glob("checkpoint-*/rlkit-complete.json")):
            return
        time.sleep(0.02)
    raise AssertionError(f"no checkpoint appeared; rc={proc.poll()} {proc.stderr.read() if proc.stderr else ''}")


def test_sigterm_exits_143_and_sigkill_resumes_from_the_last_complete_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(run_dir)
    _wait_for_checkpoint(run_dir, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 143, err
    assert "rlkit: SIGTERM: stopped at step " in err and "--resume" in err.splitlines()[-1]

    proc = _start(run_dir, "--resume")
    _wait_for_checkpoint(run_dir, proc)
    latest_before = max(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("checkpoint-*"))
    proc.kill()  # SIGKILL: no handler runs
    proc.wait(timeout=60)
    # A checkpoint whose save was cut short: newer than any complete one, but without the completion mark.
    complete = sorted((run_dir / "checkpoints").glob("checkpoint-*/rlkit-complete.json"))
    assert complete
    half = run_dir / "checkpoints" / "checkpoint-11"
    shutil.rmtree(half, ignore_errors=True)
    half.mkdir()
    (half / "adapter_config.json").write_text("{")
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 11, "lo')  # what SIGKILL or a full disk leaves mid-line

    res = subprocess.run([RLKIT, "train", str(SFT), "--smoke", "--output-dir", str(run_dir), "--set",
                          "trainer.max_steps=12", "--set", "trainer.save_steps=2", "--resume"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"WARNING {half}: half-written checkpoint, removed" in res.stderr
    assert f"INFO resuming {run_dir} from checkpoint-" in res.stderr
    assert latest_before >= 2
    assert sorted(steps(run_dir)) == list(range(1, 13))
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert not half.exists() or (half / "rlkit-complete.json").is_file()


def test_rotation_never_leaves_no_complete_checkpoint_and_no_token_reaches_a_file(tmp_path, monkeypatch):
    from rlkit import runs

    token = "hf_sEcReT0123456789"
    run_dir = train(SFT, ["trainer.max_steps=3", "trainer.save_steps=1", "trainer.save_total_limit=1",
                          f"trainer.hub_token={token}"], smoke=True, output_dir=tmp_path / "run")
    monkeypatch.delenv("HF_TOKEN", raising=False)  # train() moved the token there, for a push
    # rlkit rotates after marking: the newest complete checkpoint alone is left.
    assert [p.name for p in (run_dir / "checkpoints").glob("checkpoint-*")] == ["checkpoint-3"]
    assert [runs._step_of(p) for p in runs.checkpoints(run_dir)] == [3]
    args = torch.load(run_dir / "adapter" / "training_args.bin", weights_only=False)
    assert args.hub_token is None and args.save_total_limit is None
    leaked = [p for p in run_dir.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert leaked == []
    assert (run_dir / "checkpoints" / "checkpoint-3" / "training_args.bin").is_file()


def test_rotation_waits_for_the_newer_checkpoint_to_be_complete(tmp_path):
    from types import SimpleNamespace

    from rlkit import runs

    ckpts = tmp_path / "checkpoints"
    for step in (1, 2):
        (ckpts / f"checkpoint-{step}").mkdir(parents=True)
    (ckpts / "checkpoint-1" / runs.COMPLETE).write_text("{}")
    callback = runs.checkpoint_callback(keep=1)
    args = SimpleNamespace(output_dir=str(ckpts))
    # A save of step 2 whose directory vanished (killed mid-save): step 1 must stay.
    shutil.rmtree(ckpts / "checkpoint-2")
    state = SimpleNamespace(is_world_process_zero=True, global_step=2, max_steps=3, best_model_checkpoint=None)
    callback.on_save(args, state, None)
    assert [p.name for p in runs.checkpoints(tmp_path)] == ["checkpoint-1"]
    (ckpts / "checkpoint-3").mkdir()
    callback.on_save(args, SimpleNamespace(**{**vars(state), "global_step": 3}), None)
    assert [p.name for p in runs.checkpoints(tmp_path)] == ["checkpoint-3"] and not (ckpts / "checkpoint-1").exists()
