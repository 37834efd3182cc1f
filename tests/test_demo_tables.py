"""Every closing table of the demos and of `rlkit eval --suite` / `--ifeval` reads whole at 80 columns (a log, a
pipe, a narrow terminal): rendered at width 80, each set name and each interval is found intact on one line; the
full table is also written as Markdown. Scripted evals: no model, no training."""

import io
import json
import logging
import re
from pathlib import Path

import pytest
from rich.console import Console

from rlkit.evaluate.show import results_table
from rlkit.stats import paired, show_accuracy, show_diff, wilson

# An interval as the tables print it: an accuracy with its bounds, or a paired gain with its bounds and p
INTERVAL = re.compile(r"[-+]?\d\.\d{3} \[[-+]?\d\.\d{3}, [-+]?\d\.\d{3}\](?: p=[\d.e-]+(?: \*)?)?")


def _render(renderable, width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def _whole(text: str, cells) -> None:
    """Each cell is on one line of ``text``, unbroken, and no line is wider than 80 columns."""
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    for cell in cells:
        assert any(cell in line for line in lines), f"{cell!r} is cut or wrapped"
    assert "…" not in text


def _cells(rows) -> list[str]:
    return [str(v) for row in rows for v in row.values() if v]


def test_results_table_keeps_every_cell_whole_at_80_columns_whatever_the_stages():
    """Stage and comparison names are data: a fourth stage and a control comparison need no change."""
    stages = ["base", "SFT", "GRPO", "SFT continued"]
    right = {"base": 41, "SFT": 52, "GRPO": 60, "SFT continued": 55}
    sets = ["held-out problems, training wording", "new wording (names, things, sentence shapes never trained on)",
            "two-digit", "gsm8k-easiest100"]
    scores = {s: [1.0] * right[s] + [0.0] * (100 - right[s]) for s in stages}
    rows = [{"eval set": name, "n": "100", **{s: show_accuracy(right[s] / 100, 100) for s in stages},
             "SFT - base": show_diff(paired(scores["base"], scores["SFT"])),
             "GRPO - SFT": show_diff(paired(scores["SFT"], scores["GRPO"])),
             "GRPO - control": show_diff(paired(scores["SFT continued"], scores["GRPO"])),
             "degenerate replies base -> SFT -> GRPO": "0.02 -> 0.01 -> 0.00"} for name in sets]
    table = results_table("rlkit demo: base -> SFT -> GRPO and SFT continued for the same minutes (greedy accuracy "
                          "[95% Wilson interval])", rows, caption="gain: the paired difference; * = significant at 5%")
    narrow = _render(table)
    _whole(narrow, _cells(rows))
    assert "0.410 [0.319, 0.508]" in narrow and re.search(r"GRPO - control\s+\+0\.050 \[", narrow)
    wide = _render(table, 400).splitlines()  # room enough: one table, a row per set holding all its cells
    (row,) = [line for line in wide if "two-digit" in line]
    assert all(cell in row for cell in rows[2].values()) and row.startswith("│ two-digit")
    markdown = table.markdown().splitlines()
    assert markdown[2] == ("| eval set | n | base | SFT | GRPO | SFT continued | SFT - base | GRPO - SFT | GRPO - control "
                           "| degenerate replies base -> SFT -> GRPO |")
    assert markdown[4].startswith("| held-out problems, training wording | 100 | 0.410 [0.319, 0.508] | 0.520 [")
    assert markdown[-1] == "gain: the paired difference; * = significant at 5%"
    assert "│ a │ 1 │" in _render(results_table("unnamed first column", [{"": "a", "x": "1"}]))


def _scripted_arith(right: dict[str, int], n: int = 20):
    """rlkit.evaluate.evaluate for the arith demo: per (stage, set) the first `right` problems answered."""
    def evaluate(recipe, model, *, overrides, out, limit=None, show_progress=True):
        stage = Path(out).name.split("-")[0]
        examples = [{"prompt": f"q{i}", "completion": f"{i} + 1 = {i + 1}\n#### {i + 1}", "correct": i < right[stage]}
                    for i in range(n)]
        correct = sum(e["correct"] for e in examples)
        return {"accuracy": correct / n, "interval": list(wilson(correct, n)), "n": n, "examples": examples,
                "degenerate": 0.05}

    return evaluate


def _no_training(monkeypatch):
    import rlkit.report
    import rlkit.tiny
    import rlkit.train

    monkeypatch.setattr(rlkit.train, "train", lambda *args, **kwargs: None)
    monkeypatch.setattr(rlkit.tiny, "resolve_model_id", lambda name: "scripted")
    monkeypatch.setattr(rlkit.report, "write_report", lambda run_dir: None)


@pytest.fixture
def offline_without_data(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
    monkeypatch.delenv("RLKIT_DATA_DIR", raising=False)
    monkeypatch.setenv("COLUMNS", "80")  # what rich gives a log or a pipe


def test_arith_demo_table_reads_whole_at_80_columns_and_is_written_as_markdown(tmp_path, monkeypatch, capsys,
                                                                               caplog, offline_without_data):
    import rlkit.evaluate
    from rlkit.demos import arith
    from rlkit.evaluate.suite import load_suite

    caplog.set_level(logging.INFO, "rlkit")
    _no_training(monkeypatch)
    monkeypatch.setattr(rlkit.evaluate, "evaluate", _scripted_arith({"base": 4, "sft": 11, "grpo": 13, "control": 12}))
    monkeypatch.setattr(arith, "copy_evals", lambda eval_dir, run_dir: None)
    monkeypatch.setattr(arith, "train_minutes", lambda run_dir: 1.0)
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    (data / "test.jsonl").write_text("".join(json.dumps({"question": f"{i} plus 1?", "answer": f"a\nb\n#### {i + 1}"})
                                             + "\n" for i in range(5)))
    summary = arith.run_demo(tmp_path / "demo", tmp_path / "data", full=True)
    out = capsys.readouterr().out
    robust = load_suite("robust").sets
    names = ([s.name for s in load_suite(arith.SUITE).sets] + [f"ask: {s.name}" for s in robust] +
             ["gsm8k-easiest100", "ask: all ten (pooled)"])
    assert [r["set"] for r in summary["rows"]] == names
    intervals = ["0.200 [0.081, 0.416]", "0.550 [0.342, 0.742]", "0.650 [0.433, 0.819]", "0.600 [0.387, 0.781]"]
    assert [show_accuracy(summary["rows"][0][k]["accuracy"], 20, summary["rows"][0][k]["interval"])
            for k in arith.MODELS] == intervals
    gains = [show_diff(summary["rows"][0][k]) for k in ("SFT - base", "GRPO - SFT", "GRPO - base", "GRPO - control")]
    assert all(INTERVAL.fullmatch(g) for g in gains)
    pooled = summary["rows"][-1]
    assert pooled["n"] == 20 * len(robust) and pooled["base"]["interval"] == pytest.approx(wilson(4 * len(robust),
                                                                                                  20 * len(robust)))
    table = out[out.index("rlkit demo: SmolLM2"):out.index("time per stage")]
    _whole(table, [*names, *intervals, *gains])
    # GSM8K from the folder given, IFEval not in it and offline: a line says so
    said = [r.getMessage() for r in caplog.records if r.name == "rlkit"]
    assert said[0] == f"GSM8K test (1319 problems): {tmp_path / 'data' / 'gsm8k'}"
    assert said[1].startswith(f"IFEval prompts (541): {tmp_path / 'data'} has no ifeval/input_data.jsonl, "
                                         "and offline")
    markdown = (tmp_path / "demo" / "table.md").read_text().splitlines()
    assert markdown[0].startswith("**rlkit demo: SmolLM2-135M-Instruct (greedy accuracy")
    (gsm8k,) = [line for line in markdown if line.startswith("| gsm8k-easiest100 |")]
    assert gsm8k.split(" | ")[2:6] == intervals and gsm8k.split(" | ")[6:10] == gains
    assert gsm8k.endswith("| 0.05 -> 0.05 -> 0.05 -> 0.05 |")


def test_quick_arith_demo_needs_no_public_data(tmp_path, monkeypatch, capsys, caplog, offline_without_data):
    """`make demo`: the box and three sets outside it, four models, nothing looked up for GSM8K or IFEval."""
    import rlkit.evaluate
    from rlkit.demos import arith

    caplog.set_level(logging.INFO, "rlkit")
    _no_training(monkeypatch)
    monkeypatch.setattr(rlkit.evaluate, "evaluate", _scripted_arith({"base": 4, "sft": 11, "grpo": 13, "control": 12}))
    monkeypatch.setattr(arith, "copy_evals", lambda eval_dir, run_dir: None)
    monkeypatch.setattr(arith, "train_minutes", lambda run_dir: 1.0)
    summary = arith.run_demo(tmp_path / "demo")
    assert [r["set"] for r in summary["rows"]] == list(arith.QUICK)
    assert not [r for r in caplog.records if "GSM8K" in r.getMessage() or "IFEval" in r.getMessage()]
    assert [s["stage"] for s in summary["stages"]][-2:] == ["SFT continued (control)", "control eval"]
    _whole(capsys.readouterr().out.split("rlkit demo: SmolLM2")[1].split("time per stage")[0], list(arith.QUICK))


def test_the_arith_demo_ends_grpo_at_a_time_limit_and_gives_the_control_what_grpo_took(tmp_path, monkeypatch,
                                                                                       offline_without_data):
    """`run_demo(grpo_minutes=...)` (bench/gpu_smol.py --grpo-minutes): GRPO gets train's max_minutes, SFT none."""
    import rlkit.evaluate
    import rlkit.train
    from rlkit.demos import arith

    _no_training(monkeypatch)
    limits = {}
    monkeypatch.setattr(rlkit.train, "train", lambda recipe, overrides, *, output_dir, max_minutes=None, **kw:
                        limits.setdefault(Path(output_dir).name, max_minutes))
    monkeypatch.setattr(rlkit.evaluate, "evaluate", _scripted_arith({"base": 4, "sft": 11, "grpo": 13, "control": 12}))
    monkeypatch.setattr(arith, "copy_evals", lambda eval_dir, run_dir: None)
    monkeypatch.setattr(arith, "train_minutes", lambda run_dir: 1.93)  # what GRPO took, read from its run
    arith.run_demo(tmp_path / "demo", grpo_minutes=2.0)
    assert limits == {"sft": None, "grpo": 2.0, "sft-continued": 1.93}


def test_calc_demo_table_reads_whole_at_80_columns(tmp_path, monkeypatch, capsys, offline_without_data):
    import rlkit.evaluate
    from rlkit.demos import calc

    _no_training(monkeypatch)
    monkeypatch.setattr(calc, "copy_evals", lambda eval_dir, run_dir: None)
    right = {"base": 3, "sft": 9, "grpo": 14, "control": 12}

    def evaluate(recipe, model, *, overrides, out):
        stage, n = Path(out).name.split("-")[0], 20
        episodes = Path(out).with_suffix(".trajectories.jsonl")
        episodes.parent.mkdir(parents=True, exist_ok=True)
        episodes.write_text("".join(json.dumps({"tool_calls": [{}] * (i % 2)}) + "\n" for i in range(n)))
        examples = [{"correct": i < right[stage]} for i in range(n)]
        return {"accuracy": right[stage] / n, "interval": list(wilson(right[stage], n)), "n": n, "examples": examples,
                "trajectories": str(episodes)}

    monkeypatch.setattr(rlkit.evaluate, "evaluate", evaluate)
    monkeypatch.setattr(calc, "train_minutes", lambda run_dir: 1.0)
    summary = calc.run_calc_demo(tmp_path / "demo")
    out = capsys.readouterr().out
    table = out[out.index("rlkit calculator agent"):out.index("time per stage")]
    models = ("base", "SFT", "GRPO", "SFT continued")
    cells = [label for label, _, _ in calc.SETS] + [
        show_accuracy(r[m]["accuracy"], r["n"], r[m]["interval"]) for r in summary["rows"] for m in models] + [
        show_diff(r[k]) for r in summary["rows"] for k in ("GRPO - SFT", "GRPO - base", "GRPO - control")]
    assert "0.150 [0.052, 0.360]" in cells and "0.700 [0.481, 0.855]" in cells
    _whole(table, cells)
    assert "tool base -> SFT -> GRPO -> SFT continued  0.50 -> 0.50 -> 0.50 -> 0.50" in table
    assert "| new wording (names, things, sentence shapes never trained on) | 20 |" in (
        tmp_path / "demo" / "table.md").read_text()


def test_search_demo_tables_read_whole_at_80_columns(tmp_path):
    from rlkit.demos import search
    from tests.test_demo_intervals import STAGES, _trajectories

    stages = [[_trajectories(tmp_path, stage)] for stage in STAGES]
    rows = search._rows([("HotpotQA closed set (real questions, transfer only)", "hotpotqa", [])], *stages)
    sets, kinds = search._tables(rows)
    text = _render(sets)
    _whole(text, ["HotpotQA closed set (real questions, transfer only)", "0.650 [0.500, 0.800]",
                  "0.300 [0.108, 0.603]", "0.000 [0.000, 0.278]", show_diff(rows[0]["grpo_minus_sft"]),
                  "searches base -> SFT -> GRPO  1.50 -> 1.50 -> 1.50"])
    assert re.search(r"F1 after SFT\s+0\.650 \[0\.500, 0\.800\]", text)
    by_type = _render(kinds)
    _whole(by_type, ["hotpotqa: bridge", "hotpotqa: comparison", "0.500 [0.188, 0.812]", "0.000 [0.000, 0.490]"])
    assert re.search(r"hotpotqa: comparison\n  n\s+4\n", by_type)


def test_tiny_demo_table_reads_whole_at_80_columns(tmp_path, monkeypatch, capsys):
    import rlkit.evaluate
    import rlkit.tiny
    import rlkit.train
    from rlkit.demos.tiny import run_demo

    right = {"eval-untrained.json": 2, "eval-sft.json": 12, "eval-grpo.json": 12}

    def scripted(target, *, out):
        examples = [{"prediction": "1", "completion": "#### 1", "correct": i < right[out.name]} for i in range(20)]
        return {"accuracy": right[out.name] / 20, "interval": list(wilson(right[out.name], 20)), "n": 20,
                "examples": examples}

    monkeypatch.setattr(rlkit.evaluate, "evaluate", scripted)
    monkeypatch.setattr(rlkit.train, "train", lambda *args, **kwargs: None)
    monkeypatch.setattr(rlkit.tiny, "tiny_model_path", lambda size: "tiny")
    monkeypatch.setenv("COLUMNS", "80")
    rows = run_demo(tmp_path)
    out = capsys.readouterr().out
    _whole(out[out.index("rlkit demo: tiny Qwen3"):], ["after SFT + GRPO", "0.100 [0.028, 0.301]",
                                                      "0.600 [0.387, 0.781]", show_diff(rows[1]["gain"])])
    assert "| after SFT | 0.600 [0.387, 0.781] | +0.500 [" in (tmp_path / "table.md").read_text()


def test_suite_and_ifeval_tables_read_whole_at_80_columns(tmp_path):
    from rlkit.cli.suite import print_suite, suite_table
    from rlkit.evaluate.show import ifeval_table

    sets = ["two-digit", "products", "other-wording"]
    cell = {"correct": 11, "n": 20, "accuracy": 0.55, "interval": list(wilson(11, 20))}
    gain = paired([0.0] * 10 + [1.0] * 10, [1.0] * 16 + [0.0] * 4)
    summary = {"suite": "arith", "sets": [{"name": s, "about": ""} for s in sets],
               "rows": [{"role": "base", "model": "rlkit/smollm2-135m-instruct", "sets": dict.fromkeys(sets, cell)},
                        {"role": "trained", "model": "runs/smol_arith_grpo/adapter", "sets": dict.fromkeys(sets, cell)}],
               "gain": dict.fromkeys(sets, gain), "path": str(tmp_path / "suite.json")}
    text = _render(suite_table(summary))
    _whole(text, [*sets, "0.550 [0.342, 0.742] (11/20)", show_diff(gain)])
    assert re.search(r"products\n  base: rlkit/smollm2-135m-instruct\s+0\.550 \[0\.342, 0\.742\] \(11/20\)\n"
                     r"  trained: runs/smol_arith_grpo/adapter\s+0\.550 .*\n  gain\s+\+0\.300 \[", text)
    print_suite(summary)
    assert "| products | 0.550 [0.342, 0.742] (11/20) | 0.550 [0.342, 0.742] (11/20) | +0.300 [" in (
        tmp_path / "suite.md").read_text()

    metric = {"accuracy": 0.4, "interval": list(wilson(20, 50))}
    ifeval = {"max_new_tokens": 256, "tolerance": 0.05,
              "rows": [{"role": role, "model": model, "n": 50, "seconds": 120.0,
                        "metrics": dict.fromkeys(("prompt_strict", "inst_strict", "prompt_loose", "inst_loose"), metric)}
                       for role, model in (("base", "rlkit/smollm2-135m-instruct"), ("GRPO", "runs/demo/grpo"))],
              "comparisons": [{"role": "GRPO", "against": "base", "prompt_strict": gain, "prompt_loose": gain,
                               "flagged": True, "drop": 0.06}]}
    text = _render(ifeval_table(ifeval))
    _whole(text, ["base: rlkit/smollm2-135m-instruct", "GRPO: runs/demo/grpo", "0.400 [0.276, 0.538]",
                  show_diff(gain), "FLAGGED: -0.060"])
