"""DPO trains the LoRA on preference pairs; ``rlkit pairs`` turns the model's own samples into such pairs."""

import json
import subprocess
import sys

import pytest

from rlkit.errors import UserError
from rlkit.pairs import build_pairs
from rlkit.recipe import recipes_dir
from rlkit.train import train
from tests.test_train import VARIED_REWARD, assert_lora_changed_base_frozen, run_two_steps

DPO = recipes_dir() / "gsm8k_dpo.yaml"


def test_dpo_two_steps_train_lora_only(tmp_path):
    trainer, before, run_dir = run_two_steps(DPO, tmp_path, [])
    assert_lora_changed_base_frozen(before, trainer.model)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "rewards/margins" in r]
    assert [r["step"] for r in logged] == [1, 2]
    assert trainer.args.beta == 0.1


@pytest.fixture()
def digit_share(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(VARIED_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_rewards", None)
    from my_rewards import digit_share

    return digit_share


def test_pairs_keep_best_and_worst_above_the_gap_and_train_dpo(tmp_path, digit_share):
    out = tmp_path / "pairs.jsonl"
    rewards = "rewards=[{name: 'my_rewards:digit_share', weight: 2.0}]"
    summary = build_pairs(DPO, "rlkit/tiny-qwen3", out, samples=4, min_gap=0.02, limit=6, smoke=True,
                          overrides=[rewards, "pairs.temperature=1.5", "pairs.prompts={synthetic: 6, seed: 5}"],
                          show_progress=False)
    pairs = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["prompts"] == 6 and summary["samples"] == 4 and summary["pairs"] == len(pairs) > 0
    for pair in pairs:
        chosen, rejected = pair["chosen"][0]["content"], pair["rejected"][0]["content"]
        # The stored rewards are the recipe's weighted rewards of exactly these texts.
        assert pair["chosen_reward"] == pytest.approx(2.0 * digit_share([chosen])[0])
        assert pair["rejected_reward"] == pytest.approx(2.0 * digit_share([rejected])[0])
        assert pair["chosen_reward"] - pair["rejected_reward"] > 0.02
        assert pair["prompt"][-1]["role"] == "user" and pair["answer"]
    # The file is a dpo recipe's train data as written.
    run_dir = train(DPO, [f"data.train={{path: '{out}'}}"], smoke=True, output_dir=tmp_path / "dpo")
    assert (run_dir / "adapter" / "adapter_config.json").is_file()


def test_pairs_over_several_batches_score_each_prompts_own_samples(tmp_path, monkeypatch):
    # A reward that never ties (the text's length): every prompt makes exactly one pair.
    (tmp_path / "length_reward.py").write_text(
        "def text_length(completions, **kwargs):\n"
        "    return [float(len(c if isinstance(c, str) else c[-1]['content'])) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "pairs.jsonl"
    overrides = ["rewards=[{name: 'length_reward:text_length'}]", "pairs.temperature=1.5", "pairs.batch_size=2",
                 "pairs.prompts={synthetic: 6, seed: 5}", "pairs.max_new_tokens=12"]
    summary = build_pairs(DPO, "rlkit/tiny-qwen3", out, samples=4, min_gap=0.0, limit=6, smoke=True,
                          overrides=overrides, show_progress=False)
    pairs = [json.loads(line) for line in out.read_text().splitlines()]
    # Three batches of two prompts: each prompt is paired once, from its own samples.
    assert summary["pairs"] == len({json.dumps(p["prompt"]) for p in pairs}) == 6


def test_pairs_gap_filter_and_refusals(tmp_path):
    out = tmp_path / "pairs.jsonl"
    # A random model never answers right: every sample scores 0, so no pair clears any gap.
    summary = build_pairs(DPO, "rlkit/tiny-qwen3", out, smoke=True, limit=2, show_progress=False,
                          overrides=["rewards=[{name: gsm8k_correct}]", "pairs.prompts={synthetic: 2, seed: 0}",
                                     "pairs.max_new_tokens=4"])
    assert summary["pairs"] == 0 and summary["tied_prompts"] == 2 and out.read_text() == ""
    with pytest.raises(UserError, match="already exists; pass --resume to continue it or --overwrite"):
        build_pairs(DPO, "rlkit/tiny-qwen3", out, smoke=True)
    with pytest.raises(UserError, match="no `pairs:` section"):
        build_pairs(recipes_dir() / "gsm8k_grpo.yaml", "rlkit/tiny-qwen3", tmp_path / "other.jsonl", smoke=True)


def test_pairs_command_line(tmp_path):
    out = tmp_path / "p.jsonl"
    cmd = [sys.executable, "-m", "rlkit", "pairs", str(DPO), "--smoke", "--model", "rlkit/tiny-qwen3",
           "--out", str(out), "--samples", "2", "--limit", "2", "--set", "pairs.max_new_tokens=4"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "pairs written to" in done.stdout and out.exists()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [f"rlkit: error: {out}: already exists; pass --resume to continue it or --overwrite to replace it"]


def test_pairs_are_appended_and_resume_samples_only_prompts_without_a_pair(tmp_path, digit_share):
    from rlkit.jsonl import read_records

    out = tmp_path / "pairs.jsonl"
    overrides = ["rewards=[{name: 'my_rewards:digit_share', weight: 2.0}]", "pairs.temperature=1.5",
                 "pairs.prompts={synthetic: 6, seed: 5}"]
    build_pairs(DPO, "rlkit/tiny-qwen3", out, samples=4, min_gap=0.02, limit=6, smoke=True, overrides=overrides,
                show_progress=False)
    lines = out.read_text().splitlines()
    assert len(lines) >= 2
    out.write_text(lines[0] + "\n" + lines[1][:50])  # killed while writing the second pair
    again = build_pairs(DPO, "rlkit/tiny-qwen3", out, samples=4, min_gap=0.02, limit=6, smoke=True,
                        overrides=overrides, show_progress=False, resume=True)
    pairs = read_records(out)
    assert again["prompts"] == 5 and again["pairs"] == len(pairs) >= 1
    assert pairs[0] == json.loads(lines[0])  # the paid-for pair is kept as written
    assert pairs[0]["prompt"] not in [p["prompt"] for p in pairs[1:]]  # and its prompt not sampled again
