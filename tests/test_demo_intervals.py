"""The demos' closing tables and demo.json carry 95% intervals and paired gains (scripted eval results: no model,
no training). Known values: Wilson(3, 10) = [0.108, 0.603], Wilson(0, 4) = [0, 0.490]; a constant F1 has a
zero-width bootstrap interval."""

import io
import json
import os
import re
import subprocess
import sys

import pytest
from rich.console import Console

from rlkit.demos import stages as demo_stages
from rlkit.errors import Interrupted
from rlkit.stats import bootstrap, wilson

# Ten questions, 0-5 bridge and 6-9 comparison; per stage the questions answered exactly, and the F1 of the rest.
STAGES = {"base": ((), 0.0), "sft": ((0, 1, 2), 0.5), "grpo": ((0, 1, 2, 3, 6, 7), 0.25)}


def _trajectories(tmp_path, stage):
    right, partial = STAGES[stage]
    path = tmp_path / f"{stage}.trajectories.jsonl"
    with path.open("w") as f:
        for i in range(10):
            em = float(i in right)
            f.write(json.dumps({"question_type": "bridge" if i < 6 else "comparison",
                                "metrics": {"em": em, "f1": 1.0 if em else partial}}) + "\n")
    return {"results": {"trajectories": str(path)}, "n": 10, "searches": 1.5}


def _text(renderable) -> str:
    console = Console(file=io.StringIO(), width=400)
    console.print(renderable)
    return console.file.getvalue()


def test_search_demo_rows_tables_and_plot_carry_intervals(tmp_path, monkeypatch):
    from rlkit.demos import search

    stages = [[_trajectories(tmp_path, stage)] for stage in STAGES]
    (row,) = search._rows([("held-out", "heldout", [])], *stages)
    assert row["base_f1"] == 0.0 and row["base_f1_interval"] == [0.0, 0.0]
    assert row["base_em_interval"] == pytest.approx(list(wilson(0, 10))) and row["base_em_interval"][1] == pytest.approx(0.278, abs=5e-4)
    assert row["sft_f1"] == pytest.approx(0.65) and row["sft_f1_interval"] == list(bootstrap([1.0] * 3 + [0.5] * 7))
    assert row["sft_em"] == pytest.approx(0.3) and row["sft_em_interval"] == pytest.approx([0.108, 0.603], abs=5e-4)
    assert row["grpo_em_interval"] == pytest.approx(list(wilson(6, 10)))
    assert row["grpo_minus_sft"]["diff"] == pytest.approx(0.05) and row["sft_minus_base"]["diff"] == pytest.approx(0.65)
    bridge, comparison = row["by_type"]["sft"]["bridge"], row["by_type"]["sft"]["comparison"]
    assert bridge["n"] == 6 and bridge["em_interval"] == pytest.approx(list(wilson(3, 6)))
    assert comparison["em"] == 0.0 and comparison["em_interval"] == pytest.approx([0.0, 0.490], abs=5e-4)
    assert comparison["f1"] == 0.5 and comparison["f1_interval"] == [0.5, 0.5]
    assert row["by_type"]["grpo"]["comparison"]["em_interval"] == pytest.approx(list(wilson(2, 4)))
    assert json.loads(json.dumps([row]))[0] == row  # demo.json holds the rows as they are

    lines = "".join(_text(table) for table in search._tables([row])).splitlines()  # wide: a row per set
    (line,) = [line for line in lines if line.startswith("│ held-out")]
    assert "0.650 [0.500, 0.800]" in line and "0.000 [0.000, 0.000]" in line and "p=" in line  # F1
    assert "0.000 [0.000, 0.278]" in line and "0.300 [0.108, 0.603]" in line and "0.600 [0.313, 0.832]" in line  # EM
    (bridge,) = [line for line in lines if "heldout: bridge" in line]
    assert "0.500 [0.188, 0.812]" in bridge and "0.667 [0.300, 0.903]" in bridge
    (comparison,) = [line for line in lines if "heldout: comparison" in line]
    assert "0.000 [0.000, 0.490]" in comparison and "0.500 [0.150, 0.850]" in comparison

    drawn = {}
    monkeypatch.setattr("rlkit.report.charts.save", lambda fig, title, path: drawn.update(fig=fig))
    search._plot([row], tmp_path / "f1_by_stage.png")
    (bars,) = drawn["fig"].axes[0].containers  # one line with error bars per set
    ends = [[round(float(y), 4) for y in segment[:, 1]] for segment in bars.lines[2][0].get_segments()]
    assert ends == [[round(v, 4) for v in row[f"{k}_f1_interval"]] for k in ("base", "sft", "grpo")]


def test_tiny_demo_table_and_demo_json_carry_intervals_and_paired_gains(tmp_path, monkeypatch, capsys):
    """Scripted evals of 20 problems: untrained 2 right, SFT 12 (10 gained, none lost: exact McNemar
    p = 2 * 0.5**10 = 0.002), SFT + GRPO 12 (problem 0 lost, problem 12 gained: p = 1)."""
    import rlkit.evaluate
    import rlkit.tiny
    import rlkit.train
    from rlkit.demos.tiny import run_demo

    right = {"eval-untrained.json": range(2), "eval-sft.json": range(12), "eval-grpo.json": range(1, 13)}

    def scripted(target, *, out):
        examples = [{"prompt": f"q{i}", "prediction": "1", "completion": "#### 1", "correct": i in right[out.name]}
                    for i in range(20)]
        correct = sum(e["correct"] for e in examples)
        return {"accuracy": correct / 20, "interval": list(wilson(correct, 20)), "n": 20, "examples": examples}

    monkeypatch.setattr(rlkit.evaluate, "evaluate", scripted)
    monkeypatch.setattr(rlkit.train, "train", lambda *args, **kwargs: None)
    monkeypatch.setattr(rlkit.tiny, "tiny_model_path", lambda size: "tiny")
    monkeypatch.setenv("COLUMNS", "200")
    rows = run_demo(tmp_path)
    assert rows == json.loads((tmp_path / "demo.json").read_text())
    untrained, sft, grpo = rows
    assert untrained["gain"] is None and untrained["interval"] == pytest.approx([0.028, 0.301], abs=5e-4)
    assert sft["gain"]["diff"] == pytest.approx(0.5) and sft["gain"]["p"] == pytest.approx(2 * 0.5 ** 10)
    assert sft["gain"]["significant"] and sft["gain"]["test"] == "mcnemar"
    assert grpo["gain"]["diff"] == 0.0 and grpo["gain"]["p"] == 1.0 and not grpo["gain"]["significant"]
    lines = capsys.readouterr().out.splitlines()
    (first,) = [line for line in lines if line.startswith("│ untrained")]
    assert "0.100 [0.028, 0.301]" in first and re.search(r"│\s+-\s+│", first)  # no stage before it
    (second,) = [line for line in lines if line.startswith("│ after SFT ") and "GRPO" not in line]
    assert "0.600 [0.387, 0.781]" in second and re.search(r"\+0\.500 \[\+0\.\d{3}, \+0\.\d{3}\] p=0\.002 \*", second)
    (third,) = [line for line in lines if line.startswith("│ after SFT + GRPO")]
    assert "0.600 [0.387, 0.781]" in third and re.search(r"\+0\.000 \[-0\.\d{3}, \+0\.\d{3}\] p=1 ", third)


def test_search_plot_takes_an_interval_that_rounding_puts_just_past_the_mean(tmp_path, monkeypatch):
    """Equal F1 of 0.1: summed in another order, the mean can come out one float below 0.1 (Python 3.11's sum of ten
    0.1s does; 3.12's compensated sum does not) while the bootstrap bounds are 0.1; matplotlib refuses a negative
    error bar, which would end the demo after all its training. The case is built as such, on every Python."""
    import math

    from rlkit.demos import search

    below = math.nextafter(0.1, 0.0)  # 0.1 - 1.4e-17
    row = {"slug": "heldout", "n": 10, **{f"{k}_f1": below for k in ("base", "sft", "grpo")},
           **{f"{k}_f1_interval": [0.1, 0.1] for k in ("base", "sft", "grpo")}}
    assert row["sft_f1"] < row["sft_f1_interval"][0]  # the case itself
    drawn = {}
    monkeypatch.setattr("rlkit.report.charts.save", lambda fig, title, path: drawn.update(fig=fig))
    search._plot([row], tmp_path / "f1_by_stage.png")
    (bars,) = drawn["fig"].axes[0].containers
    assert all(abs(y - 0.1) < 1e-12 for segment in bars.lines[2][0].get_segments() for y in segment[:, 1])


def test_stage_table_and_demo_json_carry_the_peak_resident_memory_of_the_process_and_its_children(tmp_path):
    # A fresh interpreter, so that no earlier test set the high-water mark: a stage that holds 300 MB in a child,
    # then one that holds 450 MB itself; the peak after each covers what it held and never falls.
    script = f"""
import json, subprocess, sys
from pathlib import Path
from rich.console import Console
from rlkit.demos.stages import Stages
stages = Stages(Console(width=200))
stages.run("child", lambda: subprocess.run([sys.executable, "-c", "b = b'x' * 300_000_000"], check=True))
stages.run("self", lambda: len(b'y' * 450_000_000))
stages.finish([], Path({str(tmp_path)!r}))
"""
    # Through a shell that forks it: Linux starts an exec'd child's peak at its parent's resident size when it
    # forked, and the parent here is a test worker holding models; the shell is small.
    out = subprocess.run(["/bin/sh", "-c", '"$0" -c "$1"; true', sys.executable, script], capture_output=True,
                         text=True, check=True).stdout
    summary = json.loads((tmp_path / "demo.json").read_text())
    child, own = (s["peak_rss_gb"] for s in summary["stages"])
    assert 0.3 <= child < 0.45 <= own == summary["peak_rss_gb"] < 0.9
    assert re.search(rf"self\W+\d+\W+[\d.]+\W+[\d.]+\W+{own:.2f} GB", out)  # its row of the stage table
    assert f"peak resident memory {own:.2f} GB" in out


def test_a_fresh_stage_runs_in_its_own_process_and_records_its_peak_and_what_the_demo_held(tmp_path):
    """Stages.run_fresh (call_fresh runs it; its signals and errors: the tests below)."""
    import psutil

    from rlkit.demos.stages import Stages

    out = io.StringIO()
    stages = Stages(Console(file=out, width=250))
    ballast = b"y" * 500_000_000  # this process holds 500 MB while the stage runs
    # eval: a builtin, so it pickles; the work holds 300 MB in the fresh process and hands back only its length
    assert stages.run_fresh("fresh", eval, "len(b'x' * 300_000_000)") == 300_000_000
    assert stages.run_fresh("pid", eval, "__import__('os').getpid()") != os.getpid()
    with pytest.raises(ValueError, match="invalid literal"):  # its exception, raised here
        stages.run_fresh("broken", int, "nope")
    row = stages.rows[0]
    assert 0.3 <= row["stage_peak_rss_gb"] < 0.45  # its own peak, not started at ours
    assert row["demo_rss_gb"] > 0.5 and len(ballast) == 500_000_000
    assert abs(row["demo_rss_gb"] - psutil.Process().memory_info().rss / 1e9) < 0.2
    assert f"its own process's peak {row['stage_peak_rss_gb']:.2f} GB" in out.getvalue()
    summary = stages.finish([], tmp_path)
    assert summary["peak_rss_at_once_gb"] >= row["stage_peak_rss_gb"] + row["demo_rss_gb"] - 1e-9  # rounded to 1 MB
    assert re.search(rf"fresh\W+\d+\W+[\d.]+\W+[\d.]+\W+[\d.]+ GB\W+{row['stage_peak_rss_gb']:.2f} GB", out.getvalue())


def test_the_summary_names_the_cpu_and_its_bf16_units(tmp_path, monkeypatch):
    """Stage times compare only between CPUs with the same bf16 matmul units: demo.json and the total line say which."""
    from rlkit.demos import stages as module

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu avx512f avx512_bf16 amx_tile amx_bf16\n")
    assert module.cpu_model(info) == "Some Xeon (amx_bf16, avx512_bf16)"
    info.write_text("processor\t: 0\nmodel name\t: Some EPYC\nflags\t\t: fpu avx2 avx512f\n")
    assert module.cpu_model(info) == "Some EPYC"  # no bf16 units: the name alone
    assert module.cpu_model(tmp_path / "absent") == (module.platform.processor() or module.platform.machine())
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # torch's bf16 units held off: said beside the flags
    info.write_text("processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu avx512f avx512_bf16 amx_tile amx_bf16\n")
    assert module.cpu_model(info) == "Some Xeon (amx_bf16, avx512_bf16, ONEDNN_MAX_CPU_ISA=AVX2)"
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setattr(module, "cpu_model", lambda: "Some Xeon (amx_bf16)")
    out = io.StringIO()
    summary = module.Stages(Console(file=out, width=250)).finish([], tmp_path)
    assert summary["cpu"] == json.loads((tmp_path / "demo.json").read_text())["cpu"] == "Some Xeon (amx_bf16)"
    assert f"on {os.cpu_count()} CPUs (Some Xeon (amx_bf16))" in out.getvalue()


def test_a_demo_says_how_long_it_will_take_and_rescales_after_its_first_long_stage(monkeypatch):
    """The reference minutes at the start; after the first stage of 10 s or more, the rest scaled by this machine's
    pace on it (a stage twice as slow: the other stages' reference times doubled)."""
    from rlkit.demos import stages as module

    clock = iter([0.0, 0.0, 3.0, 3.0, 33.0])  # a 3 s stage (too short to tell), then a 30 s one
    monkeypatch.setattr(module.time, "time", lambda: next(clock))
    out = io.StringIO()
    stages = module.Stages(Console(file=out, width=250))
    stages.expect({"build": 3.0, "eval": 15.0, "train": 100.0, "eval again": 20.0}, "2 idle cores, git abc")
    stages.run("build", lambda: None)
    stages.run("eval", lambda: None)
    text = out.getvalue()
    assert "expected time: about 2 min 18 s (2 idle cores, git abc)" in text
    assert "ran eval at 2.0x the reference time: about 4 min 0 s to go" in text  # (100 + 20) x 2
    assert text.count("the reference time") == 1


def test_copy_evals_takes_results_and_episodes_and_keeps_their_times(tmp_path):
    from rlkit.demos.stages import copy_evals

    evals, run = tmp_path / "eval", tmp_path / "run"
    evals.mkdir()
    run.mkdir()
    for i, name in enumerate(("base-x.json", "base-x.trajectories.jsonl", "notes.txt")):
        (evals / name).write_text("{}")
        os.utime(evals / name, (1_000_000 + i, 1_000_000 + i))
    copy_evals(evals, run)
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["base-x.json", "base-x.trajectories.jsonl"]
    assert (run / "eval" / "base-x.trajectories.jsonl").stat().st_mtime == 1_000_001


# call_fresh: one stage in a fresh process (a demo's); builtins as the work, so that it pickles without a module


def test_call_fresh_returns_the_value_and_the_process_own_peak_and_logs_as_rlkit(capfd):
    value, peak = demo_stages.call_fresh(eval, "(__import__('logging').getLogger('rlkit').info('from the stage'), "
                                          "len(b'x' * 300_000_000))[1]")
    assert value == 300_000_000
    assert 0.3e9 <= peak < 0.45e9  # its own: a fresh interpreter and the 300 MB, whatever this process holds
    assert "from the stage" in capfd.readouterr().err  # rlkit's INFO lines, as from a command


def test_call_fresh_raises_the_stage_exception_with_its_traceback_there():
    with pytest.raises(ValueError, match="invalid literal") as caught:
        demo_stages.call_fresh(int, "nope")
    assert isinstance(caught.value.__cause__, demo_stages.ChildTraceback)
    assert "ValueError: invalid literal" in str(caught.value.__cause__)
    stopped = "(_ for _ in ()).throw(__import__('rlkit.errors').errors.Interrupted('run: stopped at step 3', 130))"
    with pytest.raises(Interrupted, match="stopped at step 3") as caught:  # how to resume, and the exit code
        demo_stages.call_fresh(eval, stopped)
    assert caught.value.exit_code == 130


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the child's process group from /proc")
@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_call_fresh_passes_a_signal_to_the_stage_once_and_waits_for_its_answer(tmp_path, signum):
    """The stage runs in a process group of its own (a terminal's Ctrl-C reaches only rlkit), and a signal sent to
    rlkit goes to it, once: here the stage answers SIGINT with KeyboardInterrupt and dies of SIGTERM, as a plain
    Python process does (a training stage checkpoints and raises Interrupted instead: test_resume)."""
    import os
    import signal
    import threading
    import time

    signum = getattr(signal, signum)
    ready, previous = tmp_path / "ready", signal.getsignal(signum)
    work = f"(open({str(ready)!r}, 'w').write(str(__import__('os').getpgrp())), __import__('time').sleep(60))"

    def send_when_ready():  # once the stage runs and the forwarding handler is in place
        deadline = time.time() + 60
        while (not ready.exists() or signal.getsignal(signum) is previous) and time.time() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signum)

    threading.Thread(target=send_when_ready, daemon=True).start()
    started = time.time()
    if signum == signal.SIGINT:
        with pytest.raises(KeyboardInterrupt):
            demo_stages.call_fresh(eval, work)
    else:  # it died of the signal passed on: Stopped, which the stage's timer turns into one line
        with pytest.raises(demo_stages.Stopped) as stopped:
            demo_stages.call_fresh(eval, work)
        assert (stopped.value.signum, stopped.value.sent) == (signal.SIGTERM, True)
    assert time.time() - started < 50  # it did not sleep its minute out
    assert int(ready.read_text()) != os.getpgrp()  # a process group of its own
    assert signal.getsignal(signum) is previous  # the handler is gone again
