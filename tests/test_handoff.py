"""init_from: the saved adapter is compared with the recipe, continues trainable, and is the KL reference."""

import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file

from rlkit import handoff
from rlkit.errors import UserError
from rlkit.recipe import load_recipe, recipes_dir
from rlkit.train import _require_trainable, build_trainer, train


def recipe(name, sft_run, *overrides):
    return load_recipe(recipes_dir() / f"{name}.yaml", [f"init_from={sft_run}", *overrides], smoke=True)


MISMATCHES = [
    (["model.name_or_path=rlkit/tiny-qwen3-small"], ["it was trained on 'rlkit/tiny-qwen3' and model.name_or_path "
                                                     "is 'rlkit/tiny-qwen3-small'"]),
    (["lora.r=16"], ["lora.r is 16 but the adapter has 8"]),
    (["lora.alpha=8"], ["lora.alpha is 8 but the adapter has 16"]),
    (["lora.target_modules=[q_proj, v_proj]"], ["lora.target_modules is ['q_proj', 'v_proj'] but the adapter has "
                                                "'all-linear'"]),
    (["lora.modules_to_save=[lm_head]"], ["lora.modules_to_save is ['lm_head'] but the adapter has None"]),
    (["lora.r=4", "lora.alpha=4"], ["lora.r is 4 but the adapter has 8", "lora.alpha is 4 but the adapter has 16"]),
]


@pytest.mark.parametrize(("overrides", "expected"), MISMATCHES)
def test_mismatches_are_reported_on_one_line(sft_run, overrides, expected):
    with pytest.raises(UserError) as info:
        handoff.check(recipe("gsm8k_grpo", sft_run, *overrides))
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"init_from {sft_run}: the adapter does not match")
    for part in expected:
        assert part in message


def test_matching_recipes_pass_and_record_the_start(sft_run):
    for name in ("gsm8k_grpo", "gsm8k_dpo", "gsm8k_ppo"):
        info = handoff.check(recipe(name, sft_run))
        assert info == {"adapter": str((sft_run / "adapter").resolve()), "run_dir": str(sft_run.resolve()),
                        "algorithm": "sft", "base_model": "rlkit/tiny-qwen3", "trained_in_4bit": False}


def test_lora_null_defers_to_the_adapter(sft_run):
    info = handoff.check(recipe("gsm8k_grpo", sft_run, "lora=null"))
    assert info["algorithm"] == "sft"


def test_a_causal_adapter_cannot_start_a_reward_model(sft_run):
    with pytest.raises(UserError, match=r"causal-LM adapter \(CAUSAL_LM\); a reward recipe needs SEQ_CLS"):
        handoff.check(recipe("hh_reward", sft_run), head="score")


def test_bare_adapter_dir_is_checked_against_adapter_config(sft_run, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(sft_run / "adapter", bare)
    info = handoff.check(recipe("gsm8k_grpo", bare))
    assert info["run_dir"] is None and info["base_model"].endswith("tiny")
    with pytest.raises(UserError, match="it was trained on"):
        handoff.check(recipe("gsm8k_grpo", bare, "model.name_or_path=rlkit/tiny-qwen3-small"))
    with pytest.raises(UserError, match="lora.r is 16 but the adapter has 8"):
        handoff.check(recipe("gsm8k_grpo", bare, "lora.r=16"))


def test_not_an_adapter_is_refused(tmp_path):
    with pytest.raises(UserError, match="not a run directory or adapter directory"):
        handoff.check(recipe("gsm8k_grpo", tmp_path))


def test_4bit_difference_is_logged_not_refused(sft_run, caplog):
    with caplog.at_level(logging.WARNING, logger="rlkit"):
        handoff.check(recipe("gsm8k_grpo", sft_run, "model.load_in_4bit=true"))
    assert "trained on a 16-bit base and continues on a 4-bit one" in caplog.text


def test_zero_trainable_parameters_is_an_error():
    model = torch.nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(UserError, match="zero trainable parameters"):
        _require_trainable(model)


def _adapter_tensors(run_dir):
    return load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))


def _named(model, adapter):
    return {n.replace(f".{adapter}.", "."): p for n, p in model.named_parameters() if f".{adapter}." in n}


def test_grpo_with_kl_uses_the_sft_policy_as_reference(sft_run, tmp_path):
    r = recipe("gsm8k_grpo", sft_run, "trainer.beta=0.04", "trainer.learning_rate=1e-2")
    run_dir = tmp_path / "grpo"
    run_dir.mkdir()
    trainer, _ = build_trainer(r, run_dir, smoke=True)
    model = trainer.model
    assert set(model.peft_config) == {"default", "ref"}
    saved = _adapter_tensors(sft_run)
    ref, default = _named(model, "ref"), _named(model, "default")
    assert len(ref) == len(saved) == len(default) > 0
    for name, param in ref.items():
        key = name.replace("base_model.model.", "base_model.model.", 1)
        assert torch.equal(param.detach().cpu(), saved[key]), name  # the reference starts as the SFT adapter
        assert not param.requires_grad
    assert all(p.requires_grad for p in default.values())
    before = {n: p.detach().clone() for n, p in default.items()}
    trainer.train()
    after_ref = _named(trainer.model, "ref")
    assert all(torch.equal(after_ref[n].detach().cpu(), saved[n]) for n in after_ref)  # frozen throughout
    moved = [n for n, p in _named(trainer.model, "default").items() if not torch.equal(before[n], p.detach())]
    assert len(moved) == len(before)  # every continued LoRA weight trained


def test_continued_run_saves_one_adapter_and_records_its_start(sft_run, tmp_path):
    run_dir = train(recipes_dir() / "gsm8k_dpo.yaml", [f"init_from={sft_run}"], smoke=True, output_dir=tmp_path / "d")
    assert not (run_dir / "adapter" / "ref").exists()
    import yaml

    resolved = yaml.safe_load((run_dir / "recipe.resolved.yaml").read_text())
    assert resolved["init_from"] == str(sft_run)
    assert resolved["provenance"]["init_from"]["adapter"] == str((sft_run / "adapter").resolve())
    # The continued adapter started from the SFT weights, so it differs from them only by DPO's 2 steps.
    start, end = _adapter_tensors(sft_run), _adapter_tensors(run_dir)
    assert start.keys() == end.keys()
    assert all(torch.allclose(start[k], end[k], atol=1e-3) for k in start)
    # ... and it did take them: the LoRA moved (a run that never stepped would save the SFT weights unchanged).
    moved = {k for k in start if (start[k] - end[k]).abs().max() > 1e-6}  # 2 AdamW steps of lr 5e-6: ~7.5e-6
    assert moved == set(start), f"{len(moved)} of {len(start)} tensors changed"


@pytest.mark.ppo
def test_ppo_continues_the_adapter_with_a_frozen_reference(sft_run, tmp_path):
    run_dir = tmp_path / "ppo"
    run_dir.mkdir()
    trainer, _ = build_trainer(recipe("gsm8k_ppo", sft_run), run_dir, smoke=True)
    policy = trainer.model.policy
    assert set(policy.peft_config) == {"default", "ref"}
    assert trainer.args.ref_adapter_name == "ref" and trainer.args.model_adapter_name == "default"
    saved = _adapter_tensors(sft_run)
    for name, param in _named(policy, "ref").items():
        assert torch.equal(param.detach().cpu(), saved[name]) and not param.requires_grad
