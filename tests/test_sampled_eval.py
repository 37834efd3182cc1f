"""`rlkit eval --samples K`: K samples per problem in batched generates (plain tasks) or K episodes per problem
played together (tool agents), summarised as pass@1, pass@K, avg@K and maj@K with 95% intervals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlkit import stats
from rlkit.recipe import recipes_dir

SFT = recipes_dir() / "tiny_arith_sft.yaml"
CALCULATOR = recipes_dir() / "gsm8k_calculator_grpo.yaml"
SHORT = ["eval.max_new_tokens=6", "eval.batch_size=8"]


def recomputed(path, k):
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(len(r["samples"]) == k for r in records)
    return records, stats.sampled([[s["prediction"] for s in r["samples"]] for r in records],
                                  [[s["correct"] for s in r["samples"]] for r in records])


def test_task_eval_with_samples(tmp_path):
    from rlkit.evaluate import evaluate

    out = tmp_path / "results.json"
    results = evaluate(SFT, limit=6, smoke=True, out=out, overrides=SHORT, show_progress=False, samples=4,
                       temperature=1.0)
    sampled = results["samples"]
    assert sampled["k"] == 4 and sampled["n"] == 6 and sampled["temperature"] == 1.0
    records, metrics = recomputed(out.with_suffix(".samples.jsonl"), 4)
    assert sampled["metrics"] == metrics and list(metrics) == ["pass@1", "pass@4", "avg@4", "maj@4"]
    assert [r["prompt"] for r in records] == [e["prompt"] for e in results["examples"]]
    assert len({s["completion"] for r in records for s in r["samples"]}) > 6  # sampled, not 4 copies of greedy
    m = metrics
    assert m["pass@4"]["mean"] >= m["pass@1"]["mean"] == m["avg@4"]["mean"]
    assert json.loads(out.read_text())["samples"]["metrics"] == metrics
    # Seeded: the same samples again.
    again = evaluate(SFT, limit=6, smoke=True, out=out, overrides=SHORT, show_progress=False, samples=4,
                     temperature=1.0)
    assert recomputed(out.with_suffix(".samples.jsonl"), 4)[0] == records and again["samples"]["metrics"] == metrics


def test_near_zero_temperature_samples_are_the_greedy_answers(tmp_path):
    from rlkit.evaluate import evaluate

    results = evaluate(SFT, limit=4, smoke=True, out=tmp_path / "r.json", overrides=SHORT, show_progress=False,
                       samples=2, temperature=1e-6)
    records, _ = recomputed(tmp_path / "r.samples.jsonl", 2)
    for record, example in zip(records, results["examples"], strict=True):
        assert [s["completion"] for s in record["samples"]] == [example["completion"]] * 2


def test_agent_eval_with_samples(tmp_path, capsys):
    from rlkit.evaluate import evaluate
    from rlkit.evaluate.show import print_eval

    out = tmp_path / "agent.json"
    results = evaluate(CALCULATOR, smoke=True, limit=3, out=out, show_progress=False, samples=2)
    episodes = [json.loads(line) for line in out.with_suffix(".samples.jsonl").read_text().splitlines()]
    assert [e["id"].rpartition("#")[2] for e in episodes] == ["0", "1"] * 3
    assert len({e["id"].rpartition("#")[0] for e in episodes}) == 3
    correct = [[bool(e["metrics"]["accuracy"]) for e in episodes[i:i + 2]] for i in (0, 2, 4)]
    answers = [[e["prediction"] for e in episodes[i:i + 2]] for i in (0, 2, 4)]
    assert results["samples"]["metrics"] == stats.sampled(answers, correct)
    print_eval(results)
    shown = capsys.readouterr().out
    assert "greedy pass@1" in shown and "maj@2" in shown


@pytest.mark.parametrize(("flags", "message"), [
    (["--temperature", "0.7"], "--temperature applies to --samples K"),
    (["--samples", "0"], "--samples 0: give K >= 1"),
    (["--samples", "4", "--temperature", "0"], "sampling needs T > 0"),
])
def test_bad_sampling_flags_are_one_line(tmp_path, flags, message):
    done = subprocess.run([sys.executable, "-m", "rlkit", "eval", str(SFT), "--smoke", *flags], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
