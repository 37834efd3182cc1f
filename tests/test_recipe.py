"""Recipe loading: strict schema, TRL-validated trainer block, overrides, one-line user errors."""

import subprocess
import sys

import pytest

from rlkit.errors import UserError
from rlkit.recipe import apply_overrides, load_recipe
from rlkit.trainers import check_trainer
from tests.helpers import shipped_recipe_params

GOOD = """\
name: t
algorithm: grpo
model: {name_or_path: rlkit/tiny-qwen3, backend: hf}
data: {task: gsm8k, train: {synthetic: 8}}
rewards: [{name: gsm8k_correct}]
trainer: {learning_rate: 5e-6, num_generations: 4, per_device_train_batch_size: 4}
"""


def write(tmp_path, text, name="r.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(tmp_path, text, overrides=None):
    """The one-line error of loading the recipe and building its TRL config (what `rlkit train` does first)."""
    path = write(tmp_path, text)
    with pytest.raises(UserError) as info:
        check_trainer(load_recipe(path, overrides), source=str(path))
    message = str(info.value)
    assert "\n" not in message  # one line
    return message


def test_good_recipe_builds_trl_config(tmp_path):
    recipe = load_recipe(write(tmp_path, GOOD))
    assert recipe.algorithm == "grpo" and recipe.rewards[0].weight == 1.0
    assert check_trainer(recipe).num_generations == 4
    # `5e-6` is a string to PyYAML; rlkit reads it as the number everyone means.
    assert recipe.trainer["learning_rate"] == pytest.approx(5e-6)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("backend: hf", "backnd: hf"), "model.backnd: unknown key (did you mean 'backend'?)"),
        (("name: t", "name: t\nrewardz: []"), "rewardz: unknown key (did you mean 'rewards'?)"),
        (("backend: hf", "backend: tpu"), "model.backend: Input should be 'auto', 'unsloth' or 'hf'"),
        (("train: {synthetic: 8}", "train: {synthetic: many}"), "data.train.synthetic: Input should be a valid integer"),
        (("train: {synthetic: 8}", "train: {}"), "data.train: give exactly one of `path`"),
        (("task: gsm8k", "task: gsm8"), "data.task: unknown task 'gsm8' (did you mean 'gsm8k'?)"),
        (("gsm8k_correct", "gsm8k_corect"), "did you mean 'gsm8k_correct'?"),
        (("learning_rate: 5e-6", "learning_rat: 5e-6"), "trainer.learning_rat: not a GRPOConfig field (did you mean 'learning_rate'?)"),
        (("num_generations: 4", "num_generations: four"), "trainer.num_generations: Input should be a valid integer"),
        (("num_generations: 4", "num_generations: 3"), "GRPOConfig rejected the settings: generation_batch_size (4)"),
        (("learning_rate: 5e-6", "output_dir: /x"), "trainer.output_dir: set by rlkit; use `rlkit train --output-dir DIR`"),
        (("name: t", "name: t\noutput_dir: runs/x"), "output_dir: unknown key; use `rlkit train --output-dir DIR`"),
        (("rewards: [{name: gsm8k_correct}]", "rewards: []"), "a grpo recipe needs at least one entry in `rewards:`"),
        (("name: t", "name: t\nalgorithm: ppo_plus"), "algorithm: Input should be 'sft', 'dpo', 'reward', 'ppo' or 'grpo'"),
    ],
)
def test_recipe_errors_name_the_key_and_the_fix(tmp_path, edit, expected):
    old, new = edit
    assert old in GOOD
    text = GOOD.replace(old, new, 1)
    if new.startswith("name: t\nalgorithm"):
        text = text.replace("algorithm: grpo\n", "")
    message = error_of(tmp_path, text)
    assert expected in message
    assert str(tmp_path / "r.yaml") in message


def test_malformed_yaml_and_missing_file(tmp_path):
    assert "malformed YAML" in error_of(tmp_path, "name: [unclosed\n")
    assert "line" in error_of(tmp_path, "name: [unclosed\n")
    assert "a recipe is a YAML mapping" in error_of(tmp_path, "- a\n- b\n")
    with pytest.raises(UserError, match="no such recipe file"):
        load_recipe(tmp_path / "absent.yaml")


def test_overrides_are_yaml_scalars_and_validated(tmp_path):
    path = write(tmp_path, GOOD)
    recipe = load_recipe(path, ["trainer.learning_rate=1e-4", "model.load_in_4bit=true", "lora.r=4"])
    assert recipe.trainer["learning_rate"] == pytest.approx(1e-4)
    assert recipe.model.load_in_4bit is True and recipe.lora.r == 4
    with pytest.raises(UserError, match="expected KEY=VALUE"):
        load_recipe(path, ["trainer.learning_rate"])
    with pytest.raises(UserError, match="lora.rank: unknown key"):
        load_recipe(path, ["lora.rank=4"])
    with pytest.raises(UserError, match="'name' is not a section"):
        load_recipe(path, ["name.x=1"])


def test_apply_overrides_leaves_input_untouched():
    data = {"trainer": {"a": 1}}
    out = apply_overrides(data, ["trainer.b=[1, 2]", "new.key=x"])
    assert data == {"trainer": {"a": 1}}
    assert out == {"trainer": {"a": 1, "b": [1, 2]}, "new": {"key": "x"}}


def test_smoke_changes_are_reported_and_override_wins(tmp_path):
    path = write(tmp_path, GOOD.replace("rlkit/tiny-qwen3", "Qwen/Qwen3-1.7B"))
    recipe = load_recipe(path, ["trainer.max_steps=3"], smoke=True)
    assert recipe.model.name_or_path == "rlkit/tiny-qwen3"
    assert recipe.trainer["max_steps"] == 3 and recipe.trainer["use_vllm"] is False
    changes = recipe.smoke_changes
    assert any(c.startswith("model.name_or_path: 'Qwen/Qwen3-1.7B'") for c in changes)


@pytest.mark.parametrize("path", shipped_recipe_params())
def test_shipped_recipes_validate_as_is_and_in_smoke_mode(path):
    recipe = load_recipe(path)
    assert recipe.name == path.stem
    assert path.read_text().startswith("#"), "every recipe opens with a comment header"
    check_trainer(recipe, source=str(path))
    check_trainer(load_recipe(path, smoke=True), source=str(path))


def test_loading_a_recipe_imports_no_training_stack():
    """Eval, chat, index and `recipes list` load recipes: that must not pay for (or fail on) torch, trl or Unsloth."""
    probe = ("import sys\nfrom rlkit.recipe import load_recipe, recipes_dir\n"
             "load_recipe(recipes_dir() / 'gsm8k_grpo.yaml', smoke=True)\n"
             "print(sorted(m for m in ('torch', 'transformers', 'trl', 'unsloth', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr
