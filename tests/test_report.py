import io
import json
import math
import os
import re
import subprocess
import sys

import pytest
import yaml
from matplotlib.image import imread
from rich.console import Console

from rlkit.errors import UserError
from rlkit.report import render, write_report


def make_run(path, algorithm, rows, *, evals=(), trainer=None):
    """A run directory as `rlkit train` leaves it: resolved recipe, metrics.jsonl, optional eval/*.json."""
    path.mkdir(parents=True)
    recipe = {"name": f"test_{algorithm}", "algorithm": algorithm, "model": {"name_or_path": "rlkit/tiny-qwen3"},
              "trainer": {"max_steps": 5, "learning_rate": 1e-5, "hub_token": "hf_SECRETVALUE", **(trainer or {})},
              "provenance": {"backend": "hf", "smoke": True, "api_key": "sk-SECRETVALUE", "versions": {"trl": "1.12.0"}}}
    (path / "recipe.resolved.yaml").write_text(yaml.safe_dump(recipe))
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))  # NaN is written as NaN
    for i, result in enumerate(evals):
        (path / "eval").mkdir(exist_ok=True)
        (path / "eval" / f"model{i}.json").write_text(json.dumps(result))
    return path


def grpo_rows():
    """5 steps; reward logged as 0.5, NaN, 0.25, null, 1.0, so 3 real values; a final summary row."""
    rewards = [0.5, math.nan, 0.25, None, 1.0]
    rows = [{"step": s, "epoch": s / 10, "loss": 0.01 * s, "learning_rate": 1e-5 * (1 - s / 5), "reward": r,
             "reward_std": 0.2, "rewards/correct/mean": 0.1 * s, "rewards/correct/std": 0.05,
             "rewards/format/mean": 1.0, "rewards/format/std": 0.0, "kl": 0.001 * s,
             "completions/mean_length": 20.0 + s, "completions/min_length": 10.0, "completions/max_length": 40.0,
             "completions/clipped_ratio": 0.1 * s, "entropy": 0.5}
            for s, r in zip(range(1, 6), rewards, strict=True)]
    return rows + [{"step": 5, "epoch": 0.5, "train_runtime": 12.5, "train_loss": 0.03}]


# the shape `rlkit eval` writes (values from a demo run)
EVAL = {"recipe": "tiny_arith_grpo", "model": "runs/demo/grpo/adapter", "task": "gsm8k", "n": 200, "accuracy": 0.86,
        "seconds": 2.51, "api_key": "sk-SECRETVALUE", "examples": [{"prompt": "1+1", "gold": "2", "correct": True}]}
AGENT_EVAL = {"recipe": "calc", "model": "rlkit/tiny-qwen3", "task": "gsm8k", "n": 20, "accuracy": 0.25, "em": 0.25,
              "f1": 0.3, "by_question_type": {"comparison_query": {"n": 8, "accuracy": 0.5, "em": 0.5, "f1": 0.6}},
              "seconds": 9.0, "examples": []}


@pytest.fixture(scope="module")
def grpo(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("runs") / "grpo", "grpo", grpo_rows(), evals=[EVAL],
                   trainer={"beta": 0.04})
    return run, write_report(run)


def pngs(run):
    return sorted(p.name for p in (run / "plots").iterdir())


def table_row(report, key):
    return next(line for line in report.splitlines() if line.startswith(f"| `{key}` |"))


def test_grpo_charts_and_reward_table(grpo):
    run, summary = grpo
    assert pngs(run) == ["completion_length.png", "eval.png", "kl.png", "learning_rate.png", "loss.png",
                         "reward.png", "reward_components.png"]
    assert sorted(p.name for p in summary["plots"]) == pngs(run)
    report = (run / "report.md").read_text()
    # first 0.5, last 1.0, min 0.25, max 1.0 over the 3 logged values; NaN and null skipped
    assert table_row(report, "reward") == "| `reward` | 0.5 | 1 | 0.25 | 1 | 3 |"
    assert table_row(report, "rewards/correct/mean") == "| `rewards/correct/mean` | 0.1 | 0.5 | 0.1 | 0.5 | 5 |"
    assert table_row(report, "kl") == "| `kl` | 0.001 | 0.005 | 0.001 | 0.005 | 5 |"
    reward = next(r for r in summary["rows"] if r["metric"] == "reward")
    assert (reward["first"], reward["last"], reward["min"], reward["max"], reward["steps"]) == (0.5, 1.0, 0.25, 1.0, 3)
    # bands are not rows of their own
    assert not any(r["metric"].endswith("/std") or r["metric"] == "reward_std" for r in summary["rows"])


def test_report_text(grpo):
    run, summary = grpo
    report = (run / "report.md").read_text()
    assert report.startswith("# Run report: test_grpo\n")
    assert "**GRPO** on `rlkit/tiny-qwen3` with the `hf` backend, 5 / 5 steps, finished in 12.5 s" in report
    assert "a **smoke** run" in report
    assert "| `runs/demo/grpo/adapter` | 200 | 0.860 [0.805, 0.901] | - | 2.51 | `eval/model0.json` |" in report
    # every chart is linked relative to RUN, and nothing else is
    links = re.findall(r"!\[[^]]+\]\((plots/[^)]+)\)", report)
    assert sorted(links) == [f"plots/{name}" for name in pngs(run)]
    assert summary["report"] == run / "report.md"
    assert "SECRETVALUE" not in report and "hub_token" not in report and "api_key" not in report


def test_pngs_are_whole_images_1000px_wide(grpo):
    run, _ = grpo
    for name in pngs(run):
        image = imread(run / "plots" / name)
        height, width, channels = image.shape
        assert width == 1000 and 300 <= height <= 1400 and channels in (3, 4), name
        assert image[..., :3].std() > 0.05, name  # something was drawn
    assert not [p for p in (run / "plots").iterdir() if p.name.startswith(".")]  # no temp files left


def test_sft_run(tmp_path):
    rows = [{"step": s, "epoch": s / 4, "loss": 2.0 / s, "learning_rate": 1e-4, "mean_token_accuracy": 0.2 * s,
             "entropy": 3.0 - s, "num_tokens": 100.0 * s} for s in (1, 2, 3)]
    rows += [{"step": 3, "epoch": 0.75, "eval_loss": 0.9, "eval_mean_token_accuracy": 0.7, "eval_runtime": 1.0}]
    run = make_run(tmp_path / "sft", "sft", rows)
    summary = write_report(run)
    assert pngs(run) == ["eval.png", "learning_rate.png", "loss.png", "sft.png"]
    report = (run / "report.md").read_text()
    # logged once, still a row (and drawn with a marker)
    assert table_row(report, "eval_loss") == "| `eval_loss` | 0.9 | 0.9 | 0.9 | 0.9 | 1 |"
    assert table_row(report, "eval_mean_token_accuracy") == "| `eval_mean_token_accuracy` | 0.7 | 0.7 | 0.7 | 0.7 | 1 |"
    assert "no final row yet" in report and "Adapter: not saved yet" in report
    assert {r["metric"] for r in summary["rows"]} >= {"loss", "mean_token_accuracy", "entropy"}


def test_dpo_run_has_preference_chart_and_no_reward_components(tmp_path):
    rows = [{"step": s, "epoch": s / 4, "loss": 0.69 - 0.01 * s, "learning_rate": 5e-6, "rewards/chosen": 0.01 * s,
             "rewards/rejected": -0.01 * s, "rewards/accuracies": 0.25 * s, "rewards/margins": 0.02 * s,
             "logps/chosen": -120.0, "logps/rejected": -125.0, "logits/chosen": 0.0} for s in (1, 2, 3, 4)]
    run = make_run(tmp_path / "dpo", "dpo", rows)
    summary = write_report(run)
    assert pngs(run) == ["learning_rate.png", "loss.png", "preference.png"]  # rewards/chosen is not a component
    assert table_row((run / "report.md").read_text(), "rewards/margins") == "| `rewards/margins` | 0.02 | 0.08 | 0.02 | 0.08 | 4 |"
    assert imread(summary["plots"][0]).shape[0] > imread(run / "plots" / "loss.png").shape[0]  # 3 panels, taller


def test_agent_run_has_tools_chart(tmp_path):
    rows = [{"step": s, "loss": 0.0, "reward": 0.5, "reward_std": 0.1, "tools/call_frequency": 1.5 * s,
             "tools/failure_frequency": 0.1, "env/calls": 2.0, "env/errors": 0.5} for s in (1, 2)]
    run = make_run(tmp_path / "agent", "grpo", rows, evals=[AGENT_EVAL])
    summary = write_report(run)
    assert pngs(run) == ["eval.png", "loss.png", "reward.png", "tools.png"]
    assert imread(run / "plots" / "tools.png").shape[:2] == (1080, 1000)  # calls, failures, env: 3 panels
    assert {"tools/call_frequency", "tools/failure_frequency", "env/calls", "env/errors"} <= {
        r["metric"] for r in summary["rows"]}
    report = (run / "report.md").read_text()
    # No interval recorded in the results file: Wilson's from n, 5/20 overall and 4/8 for the question type.
    assert "| `rlkit/tiny-qwen3` | 20 | 0.250 [0.112, 0.469] | - | 9 | `eval/model0.json` |" in report
    assert "| ↳ comparison_query | 8 | 0.500 [0.215, 0.785] | | |" in report


def test_agent_eval_chart_and_table_start_at_step_0_which_the_trainer_never_logs(tmp_path):
    # The trainer logs the agent eval with the step it ran at (2 here), never step 0 (before any update) nor a step
    # it did not log; agent_eval.jsonl has every one, each F1 with its interval.
    rows = [{"step": s, "loss": 0.1, "reward": 0.5, **({"agent_eval/f1": 0.6, "agent_eval/em": 0.5} if s == 2 else {})}
            for s in (1, 2, 3)]
    run = make_run(tmp_path / "agent", "grpo", rows)
    (run / "agent_eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [
        {"step": 0, "n": 20, "f1": 0.4, "f1_interval": [0.2, 0.6], "em": 0.35},
        {"step": 2, "n": 20, "f1": 0.6, "f1_interval": [0.4, 0.8], "em": 0.5},
        {"step": 3, "n": 20, "f1": 0.55, "f1_interval": [0.35, 0.75], "em": 0.45}]))
    summary = write_report(run)
    f1 = next(r for r in summary["rows"] if r["metric"] == "agent_eval/f1")
    assert (f1["first"], f1["last"], f1["min"], f1["max"], f1["steps"]) == (0.4, 0.55, 0.4, 0.6, 3)
    assert "agent_eval.png" in pngs(run) and not any(r["metric"].endswith(("_low", "_high")) for r in summary["rows"])
    assert "| `agent_eval/em` | 0.35 | 0.45 | 0.35 | 0.5 | 3 |" in (run / "report.md").read_text()


def _write_trajectories(path, episodes):
    """A trajectories file: (question type, EM, F1, evidence recall, tool calls, rounds) per episode."""
    path.write_text("".join(json.dumps({
        "question_type": kind, "success": em == 1.0, "rounds": rounds, "turns": [], "messages": [],
        "metrics": {"em": em, "f1": f1, "accuracy": em, "evidence_recall": recall},
        "tool_calls": [{"name": "search", "seconds": 0.01}] * calls}) + "\n"
        for kind, em, f1, recall, calls, rounds in episodes))


def test_agent_evals_episodes_are_analysed_before_and_after_in_the_order_they_were_played(tmp_path):
    rows = [{"step": s, "loss": 0.0, "reward": 0.5} for s in (1, 2)]
    two = {**AGENT_EVAL, "n": 2}
    # Named so that the file order puts the trained model first; the base model's episodes were played first.
    run = make_run(tmp_path / "agent", "grpo", rows, evals=[{**two, "model": "runs/x/adapter"}, two, two, two])
    trained, base = run / "eval" / "model0.trajectories.jsonl", tmp_path / "elsewhere" / "base.trajectories.jsonl"
    base.parent.mkdir()
    _write_trajectories(base, [("comparison_query", 0.0, 0.0, 0.0, 0, 1), ("null_query", 0.0, 0.2, 0.0, 0, 1)])
    _write_trajectories(trained, [("comparison_query", 1.0, 1.0, 1.0, 2, 3), ("null_query", 0.0, 0.5, 0.5, 1, 2)])
    # Where the results say: the copy next to them first (the path was recorded relative to another cwd), else
    # the recorded path; an eval cut short (1 episode of 2) and a file that is not JSON lines are rows that say so.
    (run / "eval" / "model2.trajectories.jsonl").write_text((run / "eval" / "model0.trajectories.jsonl").read_text()
                                                            .splitlines()[0] + "\n")
    (run / "eval" / "model3.trajectories.jsonl").write_text("not json\n{}\n")
    for path, when in [(base, 1), (trained, 2), (run / "eval" / "model2.trajectories.jsonl", 3),
                       (run / "eval" / "model3.trajectories.jsonl", 4)]:
        os.utime(path, (when * 1_000_000, when * 1_000_000))
    recorded = {"model0.json": "runs/gone/model0.trajectories.jsonl", "model1.json": str(base),
                "model2.json": "model2.trajectories.jsonl", "model3.json": "model3.trajectories.jsonl"}
    for name, where in recorded.items():
        result = json.loads((run / "eval" / name).read_text())
        (run / "eval" / name).write_text(json.dumps(result | {"trajectories": where}))
    (run / "eval" / "model4.json").write_text(json.dumps(two | {"trajectories": "nowhere.jsonl"}))  # no row
    summary = write_report(run)
    assert [(e["file"], e.get("n"), e.get("f1"), e.get("tool_calls"), e.get("rounds")) for e in summary["episodes"]] == [
        ("model1.json", 2, 0.1, 0.0, {1: 2}), ("model0.json", 2, 0.75, 1.5, {2: 1, 3: 1}),
        ("model2.json", None, None, None, None), ("model3.json", None, None, None, None)]
    assert summary["episodes"][2]["problem"] == "1 episodes where the results count 2"
    assert summary["episodes"][3]["problem"].startswith("cannot be analysed: ")
    lines = (run / "report.md").read_text().splitlines()
    first = lines.index("| `eval/model1.json` | `rlkit/tiny-qwen3` | 2 | 0.000 [0.000, 0.658] | 0.100 [0.000, 0.200] "
                        "| 0.000 | 0.00 | 1:2 | comparison_query 0.000, null_query 0.200 |")
    assert lines[first + 1].startswith("| `eval/model0.json` | `runs/x/adapter` | 2 | 0.500 [")
    assert lines[first + 1].endswith("| 0.750 | 1.50 | 2:1 3:1 | comparison_query 1.000, null_query 0.500 |")
    assert lines[first + 2].startswith("| `eval/model2.json` | `rlkit/tiny-qwen3` | - | ")
    assert lines[first + 2].endswith(": 1 episodes where the results count 2 | | | | | |")
    assert lines[first + 3].startswith("| `eval/model3.json` | `rlkit/tiny-qwen3` | - | ")
    assert lines[first + 4] == ""  # model4's episodes are nowhere: no row


def test_ppo_keys(tmp_path):
    rows = [{"step": s, "episode": 8 * s, "objective/scores": 0.1 * s, "objective/rlhf_reward": 0.1 * s - 0.01,
             "objective/kl": 0.2 * s, "loss/policy_avg": -0.01, "loss/value_avg": 0.3, "lr": 3e-6} for s in (1, 2)]
    run = make_run(tmp_path / "ppo", "ppo", rows)
    write_report(run)
    assert pngs(run) == ["kl.png", "learning_rate.png", "loss.png", "reward.png"]
    assert table_row((run / "report.md").read_text(), "objective/kl") == "| `objective/kl` | 0.2 | 0.4 | 0.2 | 0.4 | 2 |"


def test_rerun_replaces_plots_and_drops_stale_ones(tmp_path):
    rows = [{"step": s, "reward": 0.1 * s, "kl": 0.01} for s in (1, 2)]
    run = make_run(tmp_path / "run", "grpo", rows)
    write_report(run)
    assert pngs(run) == ["kl.png", "reward.png"]
    (run / "plots" / "reward.png").write_bytes(b"half a png")
    (run / "plots" / "mine.png").write_bytes(b"not ours")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": 0.1 * s}) + "\n" for s in (1, 2)))
    write_report(run)
    assert imread(run / "plots" / "reward.png").shape[1] == 1000
    assert not (run / "plots" / "kl.png").exists()  # no kl logged any more: no kl chart, no kl link
    assert "kl.png" not in (run / "report.md").read_text()
    assert (run / "plots" / "mine.png").read_bytes() == b"not ours"  # only our own chart names are removed


def test_a_half_written_last_line_is_skipped(tmp_path):
    run = make_run(tmp_path / "run", "grpo", [{"step": 1, "reward": 0.5}])
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "reward": 0.')
    summary = write_report(run)
    assert next(r for r in summary["rows"] if r["metric"] == "reward")["steps"] == 1


def test_render(grpo):
    _, summary = grpo
    out = io.StringIO()
    render(summary, Console(file=out, width=150))
    text = out.getvalue()
    assert re.search(r"reward\s+│\s+0\.5\s+│\s+1\s+│\s+0\.25\s+│\s+1\s+│\s+3", text)
    assert "runs/demo/grpo/adapter" in text and "0.86" in text


def test_not_a_run_directory(tmp_path):
    with pytest.raises(UserError, match=r"missing: not a run directory \(no recipe.resolved.yaml\); pass the "
                                        r"--output-dir of an `rlkit train` run"):
        write_report(tmp_path / "missing")


@pytest.mark.parametrize("content", [None, "", "\n\n", '{"step": 5, "epoch": 1.0}\n'])
def test_no_metrics_yet(tmp_path, content):
    run = make_run(tmp_path / "run", "grpo", [])
    if content is None:
        (run / "metrics.jsonl").unlink()
    else:
        (run / "metrics.jsonl").write_text(content)
    with pytest.raises(UserError, match=r"run: no metrics yet \(metrics.jsonl is missing or empty\)"):
        write_report(run)
    assert not (run / "report.md").exists()


def test_importing_does_not_load_matplotlib_or_torch():
    code = "import sys, rlkit.report; print(sorted({'matplotlib', 'torch'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
