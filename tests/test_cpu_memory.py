"""GRPO memory on CPU (issue 31): freed tensors go back to the OS, and the memory switches change no number.

The peaks themselves are measured by bench/grpo_step.py (bench/results/grpo_step.md, earlier runs in grpo_step_history.md), not here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.test_train import recipes_dir, run_two_steps

CHURN = textwrap.dedent("""
    import sys, torch
    from rlkit.cpu_memory import keep_heap_small

    def rss():
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS:"))

    if sys.argv[1] == "pin":
        assert keep_heap_small()
    big = torch.ones(4 * 2**20)  # a 16 MB block, freed: unpinned glibc raises its mmap threshold past 8 MB
    del big
    before = rss()
    blocks = [torch.ones(2 * 2**20) for _ in range(50)]  # 50 x 8 MB, like one step's activations
    del blocks[:-1]  # freed, all but the newest
    print(rss() - before)
""")


def _kept_after_free(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_tensors_leave_the_process_once_the_heap_is_kept_small():
    assert _kept_after_free("default") > 300e6  # 49 freed 8 MB blocks stay resident
    assert _kept_after_free("pin") < 30e6  # each was its own mapping, unmapped when freed


@pytest.mark.parametrize("value,threshold", [("", 4 * 2**20), ("128", 128 * 1024), ("0", 0), ("32768", 2**25)])
def test_the_mmap_threshold_comes_from_the_environment(monkeypatch, value, threshold):
    from rlkit import cpu_memory

    monkeypatch.setenv(cpu_memory.ENV, value)
    assert cpu_memory.threshold_from_env() == threshold


@pytest.mark.parametrize("value", ["-1", "4M", "40000"])
def test_a_bad_mmap_threshold_is_one_line(monkeypatch, value):
    from rlkit import cpu_memory
    from rlkit.errors import UserError

    monkeypatch.setenv(cpu_memory.ENV, value)
    with pytest.raises(UserError, match="RLKIT_MMAP_THRESHOLD_KB=.*kilobytes from 0"):
        cpu_memory.keep_heap_small()


def _two_steps(tmp_path, name, overrides):
    (tmp_path / name).mkdir()
    _, _, run_dir = run_two_steps(recipes_dir() / "gsm8k_grpo.yaml", tmp_path / name, overrides)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["loss"], r["reward"]) for r in rows if "loss" in r]


def test_gradient_checkpointing_and_the_small_heap_leave_grpo_numbers_unchanged(tmp_path):
    from rlkit.cpu_memory import keep_heap_small

    plain = _two_steps(tmp_path, "plain", ["trainer.gradient_checkpointing=false"])
    keep_heap_small()
    lean = _two_steps(tmp_path, "lean", ["trainer.gradient_checkpointing=true"])
    assert len(plain) == len(lean) == 2
    for (loss_a, reward_a), (loss_b, reward_b) in zip(plain, lean, strict=True):
        assert reward_a == reward_b
        assert loss_b == pytest.approx(loss_a, rel=1e-3, abs=1e-6)


RELAX = textwrap.dedent("""
    import sys, torch
    from rlkit.cpu_memory import small_heap

    def rss():
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS:"))

    def churn():
        before = rss()
        blocks = [torch.ones(2 * 2**20) for _ in range(50)]  # 50 x 8 MB
        del blocks[:-1]
        return rss() - before

    with small_heap() as took:
        assert took
        inside = churn()
    print(inside, churn())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_the_small_heap_holds_only_while_training():
    """Inside: freed 8 MB blocks leave the process. After: glibc's heap serves them again (no mmap per tensor,
    which made every later eval of `make demo-calc` ~3x slower), so they stay resident."""
    done = subprocess.run([sys.executable, "-c", RELAX], capture_output=True, text=True, check=True,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    inside, after = map(int, done.stdout.split()[-2:])
    assert inside < 30e6 and after > 300e6


TRIM = textwrap.dedent("""
    import torch
    from rlkit.cpu_memory import small_heap, trim_each_step

    def rss():
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS:"))

    with small_heap() as took:
        assert took
        trim = trim_each_step()  # imports transformers: before the measurement
        before = rss()
        blocks = [torch.ones(2**19) for _ in range(200)]  # 200 x 2 MB, under the 4 MiB threshold: heap blocks
        del blocks[:-1]  # freed, all but the newest, which holds the top of the heap in place
        kept = rss() - before
        trim.on_step_end(None, None, None)
        print(kept, rss() - before)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_the_step_end_trim_returns_freed_heap_pages():
    """Blocks under the mmap threshold come from the heap; freed below a live one, their pages stay resident
    (the calculator's floor between steps rose that way) until the step-end trim gives them back."""
    done = subprocess.run([sys.executable, "-c", TRIM], capture_output=True, text=True, check=True,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    kept, trimmed = map(int, done.stdout.split()[-2:])
    assert kept > 300e6 and trimmed < 30e6


SMALL_CHURN = textwrap.dedent("""
    import torch
    from rlkit import cpu_memory

    calls = []
    real = cpu_memory._libc()

    class Counted:  # the real libc, its malloc_trim calls counted
        @staticmethod
        def malloc_trim(pad):
            calls.append(pad)
            return real.malloc_trim(pad)

        mallopt = staticmethod(real.mallopt)

    cpu_memory._libc = lambda: Counted
    with cpu_memory.small_heap() as took:
        trim = cpu_memory.trim_each_step()
        start, held = len(calls), []
        for size in [16] * 6 + [100, 16]:  # MB freed per step: six like steps reusing the same pages, a big one
            blocks = [torch.ones(2**19) for _ in range(size // 2)]  # 2 MB each, under the 4 MiB threshold: heap
            held.append(blocks.pop())  # the newest stays, so the freed ones cannot fold back into the top
            del blocks
            trim.on_step_end(None, None, None)
            print(len(calls) - start, end=" ")
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_the_step_end_trim_waits_until_the_process_grew_64_mib_since_the_last():
    """A trim returns pages the next step faults back in: steps that free 16 MB each, reusing the same pages, are
    never trimmed; a step that leaves 100 MB more resident is, and the next like step is not (the floor moved)."""
    done = subprocess.run([sys.executable, "-c", SMALL_CHURN], capture_output=True, text=True, check=True,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    counts = [int(c) for c in done.stdout.split()[-8:]]
    assert counts == [0, 0, 0, 0, 0, 0, 1, 1], counts


def test_rss_trace_reports_each_steps_peak_and_floor(tmp_path):
    """bench/rss_trace.py on a real child: a Python process that logs three "steps" to metrics.jsonl, holding 200 MB
    more in step 2 than in steps 1 and 3; the trace sees step 2's peak above the others' and the last step back."""
    script = textwrap.dedent(f"""
        import json, time
        path = {str(tmp_path / "run" / "metrics.jsonl")!r}
        for step in (1, 2, 3):
            held = bytearray(200 * 2**20) if step == 2 else None
            time.sleep(1.0)
            del held  # the step's memory goes before its row is logged, as a trainer's does
            with open(path, "a") as f:
                f.write(json.dumps({{"step": step, "loss": 0.1}}) + "\\n")
    """)
    (tmp_path / "run").mkdir()
    bench = Path(__file__).resolve().parents[1] / "bench" / "rss_trace.py"
    done = subprocess.run([sys.executable, str(bench), "--run", str(tmp_path / "run"), "--every", "0.1", "--out",
                           str(tmp_path / "trace.json"), "--", sys.executable, "-c", script],
                          capture_output=True, text=True, check=True)
    steps = json.loads((tmp_path / "trace.json").read_text())["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3] and all(s["samples"] >= 3 for s in steps)
    assert steps[1]["peak_gb"] - steps[0]["peak_gb"] > 0.15 and steps[1]["peak_gb"] - steps[2]["peak_gb"] > 0.15
    assert "last step's peak" in done.stdout and "step   2: peak" in done.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_rss_trace_tree_sums_the_command_and_its_children(tmp_path):
    """--tree: a Python process holding 150 MB that runs a child holding 250 MB; the tree's peak sum covers both,
    the largest one process is the child's, and no --run is needed."""
    child = "import time; held = bytearray(250 * 2**20); time.sleep(1.5)"
    script = f"import subprocess, sys; held = bytearray(150 * 2**20); subprocess.run([sys.executable, '-c', {child!r}])"
    bench = Path(__file__).resolve().parents[1] / "bench" / "rss_trace.py"
    done = subprocess.run([sys.executable, str(bench), "--tree", "--every", "0.1", "--out", str(tmp_path / "t.json"),
                           "--", sys.executable, "-c", script], capture_output=True, text=True, check=True)
    trace = json.loads((tmp_path / "t.json").read_text())
    assert trace["tree"] and 0.26 < trace["largest_process_gb"] < 0.36 and trace["peak_gb"] > 0.41
    assert "peak of the process tree's sum" in done.stdout


@pytest.mark.cpu_only  # the heap is trimmed when training on the CPU
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_rlkit_train_trims_the_heap_after_every_step(tmp_path, monkeypatch):
    """`rlkit train` on CPU installs the step-end trim: the real callback, counted, runs once per optimizer step."""
    from rlkit import cpu_memory
    from rlkit.recipe import recipes_dir as shipped
    from rlkit.train import train

    trims, real = [], cpu_memory.trim_each_step

    def counted():
        callback = real()
        step_end = callback.on_step_end
        callback.on_step_end = lambda *a, **k: (trims.append(1), step_end(*a, **k))[1]
        return callback

    monkeypatch.setattr(cpu_memory, "trim_each_step", counted)
    run_dir = train(shipped() / "gsm8k_grpo.yaml", [], smoke=True, output_dir=tmp_path / "run")
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(trims) == max(steps) == 2


def test_rss_trace_refuses_a_command_it_cannot_start_in_one_line(tmp_path):
    bench = Path(__file__).resolve().parents[1] / "bench" / "rss_trace.py"
    done = subprocess.run([sys.executable, str(bench), "--run", str(tmp_path), "--", str(tmp_path / "no-such-command")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("rss_trace.py: error: cannot start")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_the_heap_is_trimmed_after_the_step_0_agent_eval_before_the_first_step(tmp_path, monkeypatch):
    """A GRPO run with `eval.agent_every` scores its agent before step 1; what that eval's generation freed is
    handed back before the first step starts (the search recipe's step 1 began at 1.91 GB, its others at ~1.2)."""
    import rlkit.train
    from rlkit import cpu_memory
    from rlkit.recipe import recipes_dir as shipped

    order, libc, real_eval = [], cpu_memory._libc(), rlkit.train.agent_eval_callback

    class Traced:  # the real libc; its malloc_trim calls are recorded
        mallopt = staticmethod(libc.mallopt)

        @staticmethod
        def malloc_trim(pad):
            order.append("malloc_trim")
            return libc.malloc_trim(pad)

    def traced_eval(*args, **kwargs):
        callback = real_eval(*args, **kwargs)
        for event in ("on_train_begin", "on_step_begin"):
            original = getattr(callback, event)
            setattr(callback, event, lambda *a, _o=original, _e=event, **k: (order.append(f"eval {_e}"),
                                                                             _o(*a, **k))[1])
        return callback

    if rlkit.train.cuda_available():
        pytest.skip("the heap is trimmed when training on the CPU only")
    monkeypatch.setattr(cpu_memory, "_libc", lambda: Traced)
    monkeypatch.setattr(cpu_memory, "heap_trimmer", lambda: None)  # the eval's own trims would interleave
    monkeypatch.setattr(rlkit.train, "agent_eval_callback", traced_eval)
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    rlkit.train.train(shipped() / "multihop_rag_grpo.yaml", ["trainer.max_steps=1", "eval.agent_every=1",
                                                             "eval.agent_limit=2", "eval.max_new_tokens=8"],
                      smoke=True, output_dir=tmp_path / "run", doctor=False)
    begin = order.index("eval on_train_begin")
    assert order[begin:begin + 3] == ["eval on_train_begin", "malloc_trim", "eval on_step_begin"], order


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_generation_trims_unless_told_to_leave_glibc_alone(monkeypatch):
    """RLKIT_MMAP_THRESHOLD_KB=0 turns the generation trim off as it does the training thresholds; otherwise each
    call gets a trimmer whose floor is the process's size when the call starts."""
    from rlkit import cpu_memory

    monkeypatch.setenv(cpu_memory.ENV, "0")
    assert cpu_memory.heap_trimmer() is None
    monkeypatch.setenv(cpu_memory.ENV, "")
    trimmer = cpu_memory.heap_trimmer()
    assert isinstance(trimmer, cpu_memory.HeapTrimmer)
    assert abs(trimmer.floor - cpu_memory.resident_bytes()) < 16 * 2**20


def test_a_bad_mmap_threshold_stops_any_command_before_it_starts():
    """The CLI reads RLKIT_MMAP_THRESHOLD_KB first: one line, exit 2, before a model could load."""
    done = subprocess.run([sys.executable, "-m", "rlkit", "eval", "no-such-recipe.yaml"], capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path),
                                          "RLKIT_MMAP_THRESHOLD_KB": "4M"})
    assert done.returncode == 2 and done.stderr.startswith("rlkit: error: RLKIT_MMAP_THRESHOLD_KB='4M'")
    assert len(done.stderr.strip().splitlines()) == 1
