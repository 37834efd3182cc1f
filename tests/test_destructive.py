"""Destructive operations, as a matrix: every command that deletes or replaces an output, against every
place it must not touch (issue 16). Each refusal is one line, exit 2, and leaves the disk as it was.

An autouse guard wraps ``shutil.rmtree``/``os.remove``/``os.unlink``/``os.rmdir`` in this process: a
regression that tries to delete outside the test's temporary directory fails the test instead of
deleting. ``/`` is only ever reached through that guard.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlkit import safety
from rlkit.errors import UserError
from rlkit.jsonl import read_records
from rlkit.recipe import recipes_dir
from tests.test_bad_input import run_cli

SFT = recipes_dir() / "tiny_arith_sft.yaml"
DPO = recipes_dir() / "gsm8k_dpo.yaml"
CALCULATOR = recipes_dir() / "gsm8k_calculator_grpo.yaml"


@pytest.fixture(autouse=True)
def guard_deletes(tmp_path, monkeypatch):
    """Refuse, in this process, any deletion outside pytest's temporary directories."""
    allowed = [Path(tmp_path).resolve().parent.parent]  # pytest's base temp: this test's and the fixtures'
    from rlkit.cache import cache_dir

    allowed.append(cache_dir().resolve())  # rlkit's own cache (the tiny model build, lock files)

    def check(path, what):
        if isinstance(path, int):
            return
        target = Path(os.fsdecode(path)).absolute()
        if not any(target == a or a in target.parents for a in allowed):
            raise AssertionError(f"guard: {what}({target}) outside the test's temporary directory")

    def wrap(module, name):
        real = getattr(module, name)

        def guarded(path, *args, **kwargs):
            if kwargs.get("dir_fd") is None:  # with dir_fd: a step inside an rmtree already checked
                check(path, name)
            return real(path, *args, **kwargs)

        monkeypatch.setattr(module, name, guarded)

    real_rmtree = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        check(path, "rmtree")
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    for name in ("remove", "unlink", "rmdir"):
        wrap(os, name)


def test_the_guard_itself_refuses_to_delete_outside(tmp_path):
    with pytest.raises(AssertionError, match="guard: rmtree"):
        shutil.rmtree("/")  # the guarded test double: never reaches the real rmtree
    with pytest.raises(AssertionError, match="guard: unlink"):
        os.unlink(Path.home() / "never-deleted")


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(root.rglob("*"))}


@pytest.fixture()
def places(tmp_path, monkeypatch):
    """Where outputs must not go: the cwd, its parent, $HOME, a repo root, a folder and a file of the user's,
    a symlink to a run rlkit owns."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    from rlkit.cache import cache_dir

    monkeypatch.setenv("RLKIT_CACHE", str(cache_dir()))  # the tiny model and the locks stay where they were
    home = tmp_path / "home"
    (home / "docs").mkdir(parents=True)
    (home / "docs" / "thesis.tex").write_text("years of work")
    monkeypatch.setenv("HOME", str(home))
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "setup.py").write_text("")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    (tmp_path / "notes.txt").write_text("keep me too")
    owned = safety.make_dir(tmp_path / "owned-run", "run")
    (owned / "recipe.resolved.yaml").write_text("name: x\n")
    (tmp_path / "link").symlink_to(owned)
    monkeypatch.setenv("RLKIT_LOG_LEVEL", "WARNING")
    return {"cwd": ".", "parent of cwd": "..", "root": "/", "home": str(home), "git repo": str(repo),
            "user folder": str(mine), "user file": str(tmp_path / "notes.txt"), "symlink": str(tmp_path / "link")}


def _adapter(tmp_path: Path) -> Path:
    """The smallest thing `rlkit merge` reads as a source (it fails on --out before loading a model)."""
    src = tmp_path / "adapter-src"
    src.mkdir(exist_ok=True)
    (src / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "rlkit/tiny-qwen3"}))
    return src


# Every command that deletes or replaces what it writes, with its output flag.
COMMANDS = {
    "train --overwrite": lambda tmp, out: ["train", SFT, "--smoke", "--output-dir", out, "--overwrite"],
    "merge --overwrite": lambda tmp, out: ["merge", _adapter(tmp), "--out", out, "--overwrite"],
    "pairs --overwrite": lambda tmp, out: ["pairs", DPO, "--smoke", "--model", "rlkit/tiny-qwen3", "--out", out,
                                           "--overwrite"],
    "eval --out": lambda tmp, out: ["eval", SFT, "--smoke", "--out", out],
    "rollout --resume": lambda tmp, out: ["rollout", CALCULATOR, "--smoke", "--endpoint", "http://127.0.0.1:9/v1",
                                          "--out", out, "--resume"],
}
EXPECTED = {
    "cwd": "is the current directory or one of its parents",
    "parent of cwd": "is the current directory or one of its parents",
    "root": "is the file system root",
    "home": "is your home directory or one of its parents",
    "git repo": "is the root of a git repository",
    "symlink": "is a symbolic link",
}
# Folders and files of the user's: what each command says (directory outputs vs file outputs).
FOREIGN = {
    ("train --overwrite", "user folder"): "holds files rlkit did not write (notes.txt)",
    ("merge --overwrite", "user folder"): "holds files rlkit did not write (notes.txt)",
    ("train --overwrite", "user file"): "exists and is not a directory",
    ("merge --overwrite", "user file"): "exists and is not a directory",
    ("pairs --overwrite", "user folder"): "is a directory",
    ("pairs --overwrite", "user file"): "is not a file rlkit wrote",
    ("eval --out", "user folder"): "is a directory",
    ("eval --out", "user file"): "is not a file rlkit wrote",
    ("rollout --resume", "user folder"): "is a directory",
    ("rollout --resume", "user file"): "is not a file rlkit wrote",
}
CASES = [(c, p) for c in COMMANDS for p in (*EXPECTED, "user folder", "user file")]


@pytest.mark.parametrize("command, place", CASES, ids=[f"{c} -> {p}" for c, p in CASES])
def test_refused_with_one_line_and_nothing_touched(command, place, places, tmp_path, capsys):
    before = _snapshot(tmp_path)
    target = places[place]
    code, err = run_cli(capsys, *map(str, COMMANDS[command](tmp_path, target)))
    lines = [line for line in err.splitlines() if line.startswith("rlkit: error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert target in lines[0] and (EXPECTED.get(place) or FOREIGN[command, place]) in lines[0], lines[0]
    after = _snapshot(tmp_path)
    after.pop("adapter-src", None), after.pop("adapter-src/adapter_config.json", None)
    assert after == before


def test_what_rlkit_wrote_is_replaced_and_an_old_run_is_recognised(tmp_path):
    owned = safety.make_dir(tmp_path / "owned", "run")
    (owned / "anything.bin").write_bytes(b"x")
    safety.remove(owned, "--output-dir")
    assert not owned.exists()
    # A run directory from before markers existed: only the files a run writes.
    old = tmp_path / "old-run"
    (old / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (old / "recipe.resolved.yaml").write_text("name: old\n")
    (old / "metrics.jsonl").write_text("")
    safety.remove(old, "--output-dir", legacy=safety.RUN_FILES)
    assert not old.exists()
    # The same plus one file of the user's is not rlkit's to delete.
    (old / "checkpoints").mkdir(parents=True)
    (old / "recipe.resolved.yaml").write_text("name: old\n")
    (old / "my-notes.md").write_text("mine")
    with pytest.raises(UserError, match=r"holds files rlkit did not write \(my-notes.md\)"):
        safety.remove(old, "--output-dir", legacy=safety.RUN_FILES)
    assert (old / "my-notes.md").read_text() == "mine"


# ---------------------------------------------------------------------------------------------
# One writer: a concurrent process, and a stale lock from a dead one

_HOLDER = """
import sys, time
from rlkit import safety
with safety.hold(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def _hold_in_another_process(path: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path, capsys,
                                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    holder = _hold_in_another_process(run)
    try:
        code, err = run_cli(capsys, "train", SFT, "--smoke", "--output-dir", run)
        assert code == 2
        assert f"rlkit: error: {run}: in use by another rlkit process (pid {holder.pid})" in err
        assert not run.exists()  # the second process wrote nothing
        for out in (tmp_path / "merged", tmp_path / "pairs.jsonl"):
            other = _hold_in_another_process(out)
            with pytest.raises(UserError, match=f"in use by another rlkit process \\(pid {other.pid}\\)"), \
                    safety.hold(out):
                pass
            other.kill()
            other.wait()
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding the lock: the kernel releases it
        holder.wait()
    started = time.time()
    with safety.hold(run):
        assert safety.lock_path(run).read_text().strip() == str(os.getpid())
    assert time.time() - started < 1


# ---------------------------------------------------------------------------------------------
# Read-only and full file systems: real (small tmpfs) mounts where the machine allows them


def test_read_only_output_is_one_line(mount, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ro = mount("ro", "ro,size=64k")
    code, err = run_cli(capsys, "train", SFT, "--smoke", "--output-dir", ro / "run")
    assert code == 74 and "Traceback" not in err  # the disk's state, not the command's: exit code 74
    assert f"rlkit: error: {ro / 'run'}: cannot write: read-only file system" in err


def test_full_disk_is_one_line_and_records_written_so_far_survive(mount, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    disk = mount("disk", "size=64k")
    path = disk / "trajectories.jsonl"
    written = 0
    with pytest.raises(UserError, match="cannot write: no space left on the device"), \
            safety.JsonlAppender(path) as sink:
        for i in range(10_000):
            sink.write({"id": i, "text": "x" * 1000})
            written += 1
    assert written > 10
    # Every record written before the disk filled is there, whole; the refused one left no torn line.
    assert path.read_bytes().endswith(b"\n")
    assert [r["id"] for r in read_records(path)] == list(range(written))
    # A run directory on the full disk: one line, before any model loads.
    code, err = run_cli(capsys, "train", SFT, "--smoke", "--output-dir", disk / "run")
    assert code == 74 and "Traceback" not in err and "cannot write: no space left on the device" in err


# ---------------------------------------------------------------------------------------------
# Records: valid JSONL at every instant, a kill loses only what was in flight, lossless text

_WRITER = """
import sys
from rlkit import safety
with safety.JsonlAppender(sys.argv[1]) as sink:
    for i in range(10**9):
        sink.write({"id": i, "text": "\\ud800 lone surrogate " * 50})
        if i == 200:
            print("200", flush=True)
"""


def test_a_killed_writer_leaves_valid_jsonl_and_resume_continues_after_it(tmp_path):
    path = tmp_path / "out.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "200"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    records = read_records(path, torn_tail="drop")  # the kill may have torn the last line
    assert len(records) > 200 and [r["id"] for r in records] == list(range(len(records)))
    assert records[0]["text"].startswith("\ud800")  # the surrogate read back as written
    with open(path, "ab") as f:
        f.write(b'{"id": 99999, "te')  # what a kill in the middle of a write would leave
    with safety.JsonlAppender(path, resume=True) as sink:
        assert len(sink.done) == len(records)
        sink.write({"id": "next"})
    assert [r["id"] for r in read_records(path)][-2:] == [len(records) - 1, "next"]


def test_rollout_appends_as_it_goes_survives_a_lone_surrogate_and_resumes(tmp_path):
    from rlkit.agents.rollout import rollout
    from tests.scripted_server import ScriptedServer

    out = tmp_path / "t.jsonl"
    with ScriptedServer(lambda request: {"content": "bad \ud800 text #### 4"}) as server:
        result = rollout(CALCULATOR, endpoint=server.url, smoke=True, limit=4, out=out, show_progress=False)
    assert result["episodes"] == 4
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert records[0]["messages"][-1]["content"] == "bad \ud800 text #### 4"
    # A killed rollout: two records and half a line. --resume plays only the missing rows.
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    out.write_text("".join(lines[:2]) + lines[2][:40], encoding="utf-8")
    with ScriptedServer(lambda request: {"content": "#### 4"}) as server:
        result = rollout(CALCULATOR, endpoint=server.url, smoke=True, limit=4, out=out, show_progress=False,
                         resume=True)
    assert result["episodes"] == 4 and len(server.requests) == 2
    assert [r["id"] for r in read_records(out)] == [r["id"] for r in records]
    with pytest.raises(UserError, match="already exists; pass --resume"):
        rollout(CALCULATOR, endpoint="http://127.0.0.1:9/v1", smoke=True, limit=4, out=out)


def test_eval_writes_each_example_as_it_goes_and_resumes_after_a_kill(tmp_path, monkeypatch):
    from rlkit.evaluate import evaluate
    from rlkit.inference import generate

    generated = []  # the prompts each eval really generates for (the real generation runs)
    real_generate_ids = generate.generate_ids

    def counting(model, tokenizer, prompts, **kwargs):
        generated.append(len(prompts))
        return real_generate_ids(model, tokenizer, prompts, **kwargs)

    monkeypatch.setattr(generate, "generate_ids", counting)
    out = tmp_path / "results.json"
    one_by_one = ["eval.batch_size=1", "eval.max_new_tokens=4"]  # each example independent of its batch
    first = evaluate(SFT, limit=4, smoke=True, out=out, overrides=one_by_one, show_progress=False)
    journal = out.with_suffix(".examples.jsonl")
    lines = journal.read_text().splitlines()
    assert [json.loads(line) for line in lines] == first["examples"] and len(lines) == 4 and generated == [4]
    kept = "\n".join(lines[:2]) + "\n"
    journal.write_text(kept + lines[2][:30])  # killed while writing the third
    out.unlink()
    again = evaluate(SFT, limit=4, smoke=True, out=out, overrides=one_by_one, show_progress=False, resume=True)
    assert generated == [4, 2]  # only the two examples not written whole were generated again
    assert again["examples"] == first["examples"] and again["accuracy"] == first["accuracy"]
    assert journal.read_text().startswith(kept)  # the two kept records were not rewritten
    assert json.loads(out.read_text())["n"] == 4
