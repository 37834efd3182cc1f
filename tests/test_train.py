"""Two-step SFT and GRPO runs on the tiny model: the LoRA learns, the base stays frozen."""

import json
import sys

import pytest
import torch

from rlkit.recipe import load_recipe, recipes_dir
from rlkit.train import build_trainer, train

# A reward that varies between completions of a random model, so GRPO has a non-zero advantage.
VARIED_REWARD = '''
def digit_share(completions, **kwargs):
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]
'''


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_lora_changed_base_frozen(before, model):
    after = dict(model.named_parameters())
    lora = [n for n in before if "lora_" in n]
    base = [n for n in before if "lora_" not in n]
    assert lora and base
    changed = [n for n in lora if not torch.equal(before[n], after[n])]
    # lora_A starts random and lora_B at zero; with two steps every B (and A after B moved) has changed.
    assert all(not torch.equal(before[n], after[n]) for n in lora if "lora_B" in n)
    assert len(changed) >= len(lora) // 2
    for n in base:
        assert torch.equal(before[n], after[n]), f"base weight {n} changed"
        assert not after[n].requires_grad


def run_two_steps(recipe_path, tmp_path, overrides):
    recipe = load_recipe(recipe_path, ["trainer.learning_rate=1e-2", *overrides], smoke=True)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trainer, _ = build_trainer(recipe, run_dir, smoke=True)
    before = snapshot(trainer.model)
    trainer.train()
    return trainer, before, run_dir


def test_sft_two_steps_train_lora_only(tmp_path):
    trainer, before, run_dir = run_two_steps(recipes_dir() / "gsm8k_sft.yaml", tmp_path, [])
    assert_lora_changed_base_frozen(before, trainer.model)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    assert all(r["loss"] > 0 for r in rows if "loss" in r)


def test_grpo_two_steps_train_lora_only(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(VARIED_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_rewards", None)
    trainer, before, run_dir = run_two_steps(
        recipes_dir() / "gsm8k_grpo.yaml", tmp_path,
        ["rewards=[{name: 'my_rewards:digit_share'}, {name: gsm8k_correct, weight: 0.5}]"])
    assert_lora_changed_base_frozen(before, trainer.model)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "reward" in r]
    assert len(logged) == 2
    assert all("rewards/digit_share/mean" in r and "rewards/gsm8k_correct/mean" in r for r in logged)
    assert trainer.args.reward_weights == [1.0, 0.5]


def test_train_writes_run_directory_and_refuses_reuse(sft_run):
    from rlkit.errors import UserError

    run_dir = out = sft_run
    assert (run_dir / "adapter" / "adapter_config.json").is_file()
    assert (run_dir / "adapter" / "tokenizer.json").is_file()
    assert (run_dir / "checkpoints" / "checkpoint-2").is_dir()
    import yaml

    resolved = yaml.safe_load((run_dir / "recipe.resolved.yaml").read_text())
    prov = resolved["provenance"]
    assert resolved["model"]["name_or_path"] == "rlkit/tiny-qwen3"
    assert "tiny-qwen3" in prov["model_loaded"] and prov["model_loaded"].endswith("tiny")
    import trl

    assert prov["versions"]["trl"] == trl.__version__ and prov["versions"]["torch"] == torch.__version__
    assert prov["smoke"] is True and prov["backend"] == "hf"
    with pytest.raises(UserError, match="not empty; pass --overwrite"):
        train(recipes_dir() / "gsm8k_sft.yaml", smoke=True, output_dir=out)


def test_user_error_during_setup_leaves_no_run_directory(tmp_path):
    from rlkit.errors import UserError

    data = tmp_path / "bad.jsonl"
    data.write_text('{"question": "q"}\n')
    out = tmp_path / "run"
    with pytest.raises(UserError, match="missing column"):
        train(recipes_dir() / "gsm8k_sft.yaml", [f"data.train={{path: '{data}'}}"], smoke=True, output_dir=out)
    assert not out.exists()


def test_qlora_4bit_sft_runs_on_cpu(tmp_path):
    """bitsandbytes nf4 works on CPU: the QLoRA path is tested without a GPU."""
    trainer, before, _ = run_two_steps(recipes_dir() / "gsm8k_sft.yaml", tmp_path, ["model.load_in_4bit=true"])
    assert any("Linear4bit" in type(m).__name__ for m in trainer.model.modules())
    changed = [n for n, p in trainer.model.named_parameters() if "lora_B" in n and not torch.equal(before[n], p)]
    assert changed


def test_max_minutes_ends_training_at_the_first_step_past_the_limit(tmp_path):
    """A limit shorter than one step: training ends after step 1 of 6, the adapter and metrics written as for a
    finished run (the demo's equal-time control trains this way)."""
    out = train(recipes_dir() / "gsm8k_sft.yaml", ["trainer.max_steps=6"], smoke=True, output_dir=tmp_path / "run",
                doctor=False, max_minutes=1e-4)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) == 1 and any("train_runtime" in r for r in rows)
    assert (out / "adapter" / "adapter_config.json").is_file()
