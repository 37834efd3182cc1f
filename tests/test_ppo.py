"""PPO: rule rewards reach PPOTrainer through the reward-model adapter; reward runs serve as reward models."""

import json
import sys

import pytest
import torch
from trl.experimental.utils import get_reward

from rlkit.errors import UserError
from rlkit.recipe import load_recipe, recipes_dir
from rlkit.rewards.math import answer_format, gsm8k_correct
from rlkit.train import build_trainer, train
from rlkit.trainers import check_trainer
from tests.test_train import VARIED_REWARD, snapshot

pytestmark = pytest.mark.ppo  # skipped on TRL >= 1.13 (tests/conftest.py)

PPO = recipes_dir() / "gsm8k_ppo.yaml"


def ppo_recipe(*overrides):
    return load_recipe(PPO, list(overrides), smoke=True)


@pytest.fixture()
def my_rewards(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(VARIED_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_rewards", None)


def build(tmp_path, *overrides):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trainer, tokenizer = build_trainer(ppo_recipe(*overrides), run_dir, smoke=True)
    return trainer, tokenizer, run_dir


# Responses to prompt 0 (gold 5 from the generator's first problem is read from the row) -> rewards.
RESPONSES = [
    ("3 + 2 = {gold}\n#### {gold}", 1.0, 1.0),
    ("#### {wrong}", 0.0, 1.0),
    ("so the answer is {gold}.", 1.0, 0.0),
    ("no number here", 0.0, 0.0),
    ("", 0.0, 0.0),
    ("<think>#### {wrong}</think>#### {gold}", 1.0, 1.0),
]


def test_rule_reward_model_scores_like_the_rewards_through_trls_get_reward(tmp_path):
    trainer, tokenizer, _ = build(tmp_path)
    scorer = trainer.reward_model
    pad = tokenizer.pad_token_id
    sequences, expected = [], []
    for i, (template, correct, fmt) in enumerate(RESPONSES):
        row = i % 3  # responses to three different prompts, each with its own gold answer
        gold = scorer.rows[row]["answer"]
        text = template.format(gold=gold, wrong=int(gold) + 1)
        prompt_ids = trainer.train_dataset[row]["input_ids"]
        response = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        sequences.append((prompt_ids, response))
        assert gsm8k_correct([text], answer=[gold]) == [correct] and answer_format([text]) == [fmt]
        expected.append(1.0 * correct + 0.2 * fmt)  # the recipe's weights
    # Left-pad the prompts to one context length, right-pad the responses, as PPOTrainer does.
    context = max(len(p) for p, _ in sequences)
    width = max(len(r) for _, r in sequences) + 3
    batch = torch.tensor([[pad] * (context - len(p)) + p + r + [pad] * (width - len(r)) for p, r in sequences])
    _, scores, _ = get_reward(scorer, batch, pad, context)
    assert scores.tolist() == pytest.approx(expected)
    assert scorer.history[-1]["rewards"]["gsm8k_correct"] == [c for _, c, _ in RESPONSES]


def test_logged_scores_are_the_rule_rewards_of_the_decoded_responses(tmp_path, my_rewards):
    trainer, tokenizer, run_dir = build(
        tmp_path, "rewards=[{name: gsm8k_correct, weight: 1.0}, {name: 'my_rewards:digit_share', weight: 0.5}]",
        "trainer.learning_rate=1e-2", "trainer.temperature=1.5",
        "trainer.missing_eos_penalty=null")  # PPOTrainer's own penalty would shift the logged scores
    scorer = trainer.reward_model
    policy_before = snapshot(trainer.model.policy)
    value_before = snapshot(trainer.model.value_model)
    trainer.train()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "objective/scores" in r]
    batches = list(scorer.history)
    assert len(logged) == len(batches) == 2  # one rollout batch per update in smoke mode
    from my_rewards import digit_share

    for row, batch in zip(logged, batches, strict=True):
        texts = batch["completions"]
        answers = [scorer.rows[i]["answer"] for i in batch["rows"]]
        correct = gsm8k_correct(texts, answer=answers)
        share = digit_share(texts)
        recomputed = [c + 0.5 * s for c, s in zip(correct, share, strict=True)]
        assert row["objective/scores"] == pytest.approx(sum(recomputed) / len(recomputed), abs=1e-6)
        assert row["rewards/gsm8k_correct/mean"] == pytest.approx(sum(correct) / len(correct))
        assert row["rewards/digit_share/mean"] == pytest.approx(sum(share) / len(share))
    assert len({s for b in batches for s in b["scores"]}) > 1  # the responses really were scored one by one
    # The policy's LoRA learned, its base stayed put; the value model's LoRA and score head learned.
    after = dict(trainer.model.policy.named_parameters())
    lora = [n for n in policy_before if "lora_B" in n]
    assert lora and all(not torch.equal(policy_before[n], after[n]) for n in lora)
    assert all(torch.equal(policy_before[n], after[n]) for n in policy_before if "lora_" not in n)
    value_after = dict(trainer.model.value_model.named_parameters())
    trained = [n for n, p in value_after.items() if p.requires_grad]
    assert any("score" in n for n in trained) and any("lora_" in n for n in trained)
    assert all(torch.equal(value_before[n], value_after[n]) for n in value_before if n not in trained)


@pytest.fixture(scope="module")
def reward_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("reward") / "rm"
    return train(recipes_dir() / "hh_reward.yaml", ["trainer.learning_rate=5e-2"], smoke=True, output_dir=out)


def test_reward_run_trains_lora_and_score_head(reward_run):
    from safetensors.torch import load_file

    saved = load_file(str(reward_run / "adapter" / "adapter_model.safetensors"))
    assert any("score" in k for k in saved) and any("lora_B" in k for k in saved)
    assert all(saved[k].abs().sum() > 0 for k in saved if "lora_B" in k)
    config = json.loads((reward_run / "adapter" / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_CLS" and "score" in config["modules_to_save"]


def test_ppo_against_a_reward_run(reward_run, tmp_path):
    from safetensors.torch import load_file

    trainer, tokenizer, run_dir = build(tmp_path, f"reward_model={reward_run}", "rewards=[]",
                                        f"value_model={reward_run}")
    reward_model = trainer.reward_model
    assert type(reward_model).__name__ == "Qwen3ForSequenceClassification"
    assert not any(p.requires_grad for p in reward_model.parameters())
    saved = load_file(str(reward_run / "adapter" / "adapter_model.safetensors"))
    head = next(v for k, v in saved.items() if "score" in k)
    assert torch.equal(reward_model.score.modules_to_save["default"].weight.detach().cpu(), head)
    # The critic starts from the reward model, trainable.
    value = trainer.model.value_model
    assert torch.equal(value.score.modules_to_save["default"].weight.detach().cpu(), head)
    assert any(p.requires_grad for p in value.parameters())
    trainer.train()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "objective/scores" in r]) == 2


def test_reward_model_must_be_a_reward_run(sft_run, tmp_path):
    with pytest.raises(UserError, match="a sft run, not a reward model"):
        build(tmp_path, f"reward_model={sft_run}", "rewards=[]")


def test_ppo_needs_exactly_one_reward_source(tmp_path):
    with pytest.raises(UserError, match="exactly one reward source"):
        ppo_recipe("reward_model=rlkit/tiny-qwen3")
    with pytest.raises(UserError, match="exactly one reward source"):
        ppo_recipe("rewards=[]")
    with pytest.raises(UserError, match="`reward_model:` is only used by ppo recipes"):
        load_recipe(recipes_dir() / "gsm8k_grpo.yaml", ["reward_model=x"], smoke=True)
    with pytest.raises(UserError, match="unsloth does not support ppo"):
        ppo_recipe("model.backend=unsloth")
    # Batch arithmetic PPOTrainer would only reject after loading three models is refused with the TRL config.
    with pytest.raises(UserError, match=r"trainer.num_mini_batches: 3 does not divide .* = 4\)"):
        check_trainer(load_recipe(PPO, ["trainer.num_mini_batches=3"], smoke=True))
    with pytest.raises(UserError, match="whiten_rewards needs at least 8 samples per mini-batch, got 4"):
        check_trainer(load_recipe(PPO, ["trainer.whiten_rewards=true"], smoke=True))


def test_reward_run_evaluates_as_pairwise_accuracy(reward_run, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rlkit.data import load_preference_rows
    from rlkit.evaluate import evaluate
    from rlkit.recipe import DataSource
    from rlkit.tiny import resolve_model_id

    results = evaluate(reward_run, out=tmp_path / "rm.json", show_progress=False)
    examples = results["examples"]
    assert results["metric"] == "pairwise accuracy" and results["n"] == 8 == len(examples)
    assert results["accuracy"] == sum(e["chosen_score"] > e["rejected_score"] for e in examples) / 8
    # The first pair scored independently: plain transformers + PEFT on the same text.
    tokenizer = AutoTokenizer.from_pretrained(reward_run / "adapter")
    base = AutoModelForSequenceClassification.from_pretrained(resolve_model_id("rlkit/tiny-qwen3"), num_labels=1)
    base.config.pad_token_id = tokenizer.pad_token_id
    model = PeftModel.from_pretrained(base, reward_run / "adapter").eval()
    pair = load_preference_rows("hh_rlhf", DataSource(synthetic=8, seed=1))[0]
    text = tokenizer.apply_chat_template(pair["prompt"] + pair["chosen"], tokenize=False, enable_thinking=False)
    with torch.inference_mode():
        score = model(**tokenizer(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item()
    assert examples[0]["chosen_score"] == pytest.approx(score, abs=1e-4)
