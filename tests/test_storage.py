"""Storage faults while `rlkit train` writes (issue 49): a full disk, a disk quota, a read-only file system, an output
directory removed under the run, at each place a run writes (the resolved recipe, the metrics log, a checkpoint, the
final adapter, the report).

Each is one line naming the path, what was being written, why, the last complete checkpoint and the command that
continues the run; exit code 74; no traceback; what the run wrote before is left as it was, and `--resume` continues
once space is freed. Real small tmpfs file systems where the machine lets the test mount one (root); elsewhere an
OSError(ENOSPC) raised at the write itself (torch's, safetensors', Python's), on the same runs.
"""

import errno
import json
import os
import re
import shlex
import subprocess
import threading
import time
from pathlib import Path

import pytest

from rlkit import storage
from rlkit.errors import StorageError
from rlkit.recipe import recipes_dir
from tests.test_bad_input import run_cli

SFT = recipes_dir() / "tiny_arith_sft.yaml"
GSM8K_SFT = recipes_dir() / "gsm8k_sft.yaml"
SHORT = ["trainer.max_steps=2", "trainer.save_steps=1", "trainer.logging_steps=1"]
CODE = 74


def sets(overrides):
    return [a for o in overrides for a in ("--set", o)]


def last_line(err: str) -> str:
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def snapshot(run: Path) -> dict[str, bytes]:
    """Every file of the run's complete checkpoints, and the metrics log."""
    files = [p for c in (run / "checkpoints").glob("checkpoint-*") if (c / "rlkit-complete.json").is_file()
             for p in c.rglob("*") if p.is_file()]
    files += [run / "metrics.jsonl"] if (run / "metrics.jsonl").is_file() else []
    return {str(p.relative_to(run)): p.read_bytes() for p in files}


def metric_steps(run: Path) -> list[int]:
    text = (run / "metrics.jsonl").read_text()
    assert text.endswith("\n")  # whole lines only
    return [json.loads(line)["step"] for line in text.splitlines() if "loss" in json.loads(line)]


# ---------------------------------------------------------------------------------------------
# Real file systems


@pytest.mark.timeout(1200)  # two trainings: minutes each on a 2-core machine shared with other jobs
def test_a_full_disk_while_saving_a_checkpoint_is_one_line_and_resume_continues_once_space_is_freed(
        mount, tmp_path, capsys, monkeypatch):
    """The issue's command: `--set trainer.save_steps=1` on an 800 KiB file system. Before: exit 1 and a 30-line
    traceback ending in torch's `unexpected pos 195648 vs 195536`."""
    monkeypatch.chdir(tmp_path)
    disk = mount("disk", "size=800k")
    run, checkpoints = disk / "run", disk / "run" / "checkpoints"
    code, err = run_cli(capsys, "train", GSM8K_SFT, "--smoke", "--output-dir", run, "--set", "trainer.save_steps=1")
    command = f"rlkit train {GSM8K_SFT} --resume --smoke --output-dir {run} --set trainer.save_steps=1"
    assert code == CODE
    assert last_line(err) == (f"rlkit: error: {checkpoints / 'checkpoint-2'}: cannot write the checkpoint: no space "
                              f"left on the device; the last complete checkpoint is {checkpoints / 'checkpoint-1'}; "
                              f"free space, then continue with: {command}")
    assert sorted(p.name for p in checkpoints.glob("checkpoint-*")) == ["checkpoint-1"]  # the torn one removed
    assert metric_steps(run) == [1, 2]
    kept = snapshot(run)
    subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)  # space freed
    code, err = run_cli(capsys, *shlex.split(command)[1:])
    assert code == 0, err
    assert (run / "adapter" / "adapter_model.safetensors").is_file() and metric_steps(run) == [1, 2]
    now = snapshot(run)
    assert {k: now[k] for k in kept if k.startswith("checkpoints/")} == \
        {k: v for k, v in kept.items() if k.startswith("checkpoints/")}  # checkpoint-1 as it was


def _after_checkpoint(run: Path, step: int, then) -> threading.Thread:
    """Call ``then()`` once checkpoint ``step`` of ``run`` is complete (a fault arriving while the run goes on)."""
    def watch():
        deadline = time.time() + 600
        while time.time() < deadline and not (run / "checkpoints" / f"checkpoint-{step}" / "rlkit-complete.json").exists():
            time.sleep(0.01)
        then()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_file_system_turned_read_only_mid_run_is_one_line(mount, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    disk = mount("disk", "size=8m")
    run = disk / "run"
    watcher = _after_checkpoint(run, 1, lambda: subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True))
    code, err = run_cli(capsys, "train", SFT, "--smoke", "--output-dir", run, *sets(SHORT))
    watcher.join()
    assert code == CODE
    assert re.fullmatch(rf"rlkit: error: {re.escape(str(run))}/\S+: cannot write [a-z' ]+: read-only file system; the "
                        rf"last complete checkpoint is {re.escape(str(run / 'checkpoints' / 'checkpoint-1'))}; make "
                        rf"the file system writable, then continue with: rlkit train .* --resume .*", last_line(err))
    assert (run / "checkpoints" / "checkpoint-1" / "rlkit-complete.json").is_file()


def test_an_output_directory_removed_mid_run_is_one_line(tmp_path, capsys, monkeypatch):
    import shutil

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    watcher = _after_checkpoint(run, 1, lambda: shutil.rmtree(run))
    code, err = run_cli(capsys, "train", SFT, "--smoke", "--output-dir", run, *sets(SHORT))
    watcher.join()
    assert code == CODE
    assert re.fullmatch(rf"rlkit: error: {re.escape(str(run))}/\S+: cannot write [a-z' ]+: its directory "
                        rf"{re.escape(str(run))}\S* was removed; no complete checkpoint; leave the output directory in "
                        rf"place, then start again: rlkit train {re.escape(str(SFT))} --smoke --output-dir .*",
                        last_line(err))


# ---------------------------------------------------------------------------------------------
# The same faults raised at each write itself, on any machine


def _enospc(path, number=errno.ENOSPC):
    return OSError(number, os.strerror(number), str(path))


def _resolved(monkeypatch, run, seen):
    real = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name == "recipe.resolved.yaml":
            raise _enospc(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)


def _metrics(monkeypatch, run, seen):
    """The step-2 line: half of it reaches the disk, then the disk is full."""
    real = os.write

    def write(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("metrics.jsonl") and (seen or b'"step": 2' in bytes(data)):
            if not seen:
                seen.update(snapshot(run))
                return real(fd, bytes(data)[:len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # the rest of the line: the disk is full
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)


def _torch_short_write(monkeypatch, run, seen):
    """torch's zip writer cut short (a quota: the file system still has space), in checkpoint-2's optimizer.pt."""
    import torch

    real = torch.save

    def save(obj, f, *args, **kwargs):
        if str(f).endswith("checkpoint-2/optimizer.pt"):
            seen.update(snapshot(run))
            Path(f).write_bytes(b"PK\x03\x04" + b"\0" * 1000)
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 195648 vs 195536")
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def _safetensors(directory: str, number: int):
    def inject(monkeypatch, run, seen):
        """safetensors refusing the adapter's weights with the disk's errno (as its Rust I/O error reads)."""
        import peft.peft_model
        from safetensors import SafetensorError

        real = peft.peft_model.safe_save_file

        def save_file(tensors, filename, *args, **kwargs):
            if directory in str(filename):
                seen.update(snapshot(run))
                raise SafetensorError(f"Error while serializing: I/O error: {os.strerror(number)} (os error {number})")
            return real(tensors, filename, *args, **kwargs)

        monkeypatch.setattr(peft.peft_model, "safe_save_file", save_file)
    return inject


def _report(monkeypatch, run, seen):
    from matplotlib.figure import Figure

    monkeypatch.delenv("RLKIT_NO_REPORT", raising=False)

    def savefig(self, fname, *args, **kwargs):
        seen.update(snapshot(run))
        raise _enospc(fname)

    monkeypatch.setattr(Figure, "savefig", savefig)


CHECKPOINT_1 = "{run}/checkpoints/checkpoint-1"
CONTINUE = "free space, then continue with: rlkit train {sft} --resume --smoke --output-dir {run} {sets}"
SITES = {  # site: (inject, the error line after "rlkit: error: ", as a regular expression with {run}, {sft}, {sets})
    "resolved recipe": (_resolved, "{run}/recipe.resolved.yaml: cannot write the resolved recipe: no space left on "
                                   "the device; no complete checkpoint \\(the run directory held nothing else and was "
                                   "removed\\); free space, then start again: rlkit train {sft} --smoke --output-dir "
                                   "{run} {sets}"),
    "metrics log": (_metrics, "{run}/metrics.jsonl: cannot write the metrics log: no space left on the device; the last "
                              "complete checkpoint is " + CHECKPOINT_1 + "; " + CONTINUE),
    "checkpoint, torch": (_torch_short_write, "{run}/checkpoints/checkpoint-2: cannot write the checkpoint: the write "
                                              "was cut short with [0-9.]+ MiB free there \\(a disk quota\\?\\); the last "
                                              "complete checkpoint is " + CHECKPOINT_1 + "; " + CONTINUE),
    "checkpoint, safetensors": (_safetensors("checkpoint-2", errno.ENOSPC), "{run}/checkpoints/checkpoint-2: cannot "
                                "write the checkpoint: no space left on the device; the last complete checkpoint is "
                                + CHECKPOINT_1 + "; " + CONTINUE),
    "adapter, quota": (_safetensors(".adapter.partial", errno.EDQUOT), "{run}/.adapter.partial: cannot write the final "
                       "adapter: disk quota exceeded; the last complete checkpoint is {run}/checkpoints/checkpoint-2; "
                       "free space, then continue with: rlkit train {sft} --resume --smoke --output-dir {run} {sets}"),
    "report": (_report, "{run}/plots/\\S+\\.png: cannot write the report: no space left on the device; free space, "
                        "then draw it with: rlkit report {run} \\(the run itself is complete: its adapter is in "
                        "{run}/adapter\\)"),
}


@pytest.mark.timeout(1200)  # the adapter's case trains twice
@pytest.mark.parametrize("site", list(SITES))
def test_a_storage_fault_at_each_write_is_one_line_and_keeps_what_was_written(site, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run, seen = tmp_path / "run", {}
    inject, expected = SITES[site]
    inject(monkeypatch, run, seen)
    code, err = run_cli(capsys, "train", SFT, "--smoke", "--no-doctor", "--output-dir", run, *sets(SHORT))
    monkeypatch.undo()
    pattern = expected.format(run=re.escape(str(run)), sft=re.escape(str(SFT)), sets=re.escape(shlex.join(sets(SHORT))))
    assert code == CODE and re.fullmatch("rlkit: error: " + pattern, last_line(err)), err[-2000:]
    if site == "resolved recipe":
        assert not run.exists()  # it held nothing to keep: a new start is not refused
        return
    now = snapshot(run)
    assert seen and {k: now.get(k) for k in seen} == seen  # every file written before the fault, as it was
    assert not (run / "checkpoints" / "checkpoint-2").exists() or site.startswith(("adapter", "report"))
    assert not (run / ".adapter.partial").exists()
    if site == "adapter, quota":  # the quota lifted, --resume ends the run from its last checkpoint
        code, err = run_cli(capsys, "train", SFT, "--resume", "--smoke", "--output-dir", run, *sets(SHORT))
        assert code == 0, err
        assert (run / "adapter" / "adapter_model.safetensors").is_file() and metric_steps(run) == [1, 2]


def test_a_fault_that_is_not_the_disks_keeps_its_traceback(tmp_path):
    with pytest.raises(RuntimeError, match="a bug"), storage.writing("the checkpoint", tmp_path / "checkpoint-1"):
        raise RuntimeError("a bug")
    with pytest.raises(PermissionError), storage.writing("the metrics log", tmp_path / "metrics.jsonl"):
        raise PermissionError(errno.EACCES, "Permission denied")  # the user's to fix, not the disk's: no one line
    quota = r"checkpoint-1: cannot write the checkpoint: disk quota exceeded$"
    with pytest.raises(StorageError, match=quota), storage.writing("the checkpoint", tmp_path / "checkpoint-1"):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")


def test_a_fault_removes_only_the_folder_the_block_made(tmp_path):
    """A checkpoint folder that existed before the save (a user's, or an earlier run's) survives a full disk; the
    one the save itself created goes, and nothing beside it."""
    from rlkit import storage
    from rlkit.errors import StorageError

    old = tmp_path / "checkpoint-1"
    old.mkdir()
    (old / "notes.txt").write_text("keep")
    new = tmp_path / "checkpoint-2"

    def full_disk(path: Path, created: Path | None) -> None:
        with pytest.raises(StorageError), storage.writing("the checkpoint", path, created=created):
            path.mkdir(exist_ok=True)
            (path / "model.bin").write_bytes(b"x")
            raise OSError(errno.ENOSPC, "No space left on device", str(path / "model.bin"))

    full_disk(old, None)  # what the checkpoint guard passes for a folder that was there
    full_disk(new, new)
    assert (old / "notes.txt").read_text() == "keep" and not new.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]
