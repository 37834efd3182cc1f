"""bench/reward_only.py (GRPO against RFT in the same minutes): its settings are the recipes' own, and RFT's SFT rows
are exactly the distinct right samples, as the SFT stage will read them."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import reward_only  # noqa: E402


def test_every_stage_s_overrides_are_valid_and_sample_grpo_s_own_pool():
    from rlkit.recipe import load_recipe

    grpo = load_recipe(ROOT / reward_only.GRPO, reward_only.grpo_overrides(12, 1.5e-4, 1))
    assert grpo.init_from is None and grpo.data.prompt == "short"  # from the base, the two worked turns
    assert (grpo.trainer["learning_rate"], grpo.trainer["max_steps"], grpo.trainer["seed"]) == (1.5e-4, 12, 1)
    assert grpo.trainer["per_device_train_batch_size"] // grpo.trainer["num_generations"] == reward_only.PROMPTS_PER_STEP
    assert (grpo.trainer["num_generations"], grpo.trainer["temperature"]) == (reward_only.SAMPLES,
                                                                              reward_only.TEMPERATURE)
    # RFT samples the problems GRPO draws from: a change to the recipe's pool must reach the bench too.
    sampled = load_recipe(ROOT / reward_only.GRPO, reward_only.sampling_overrides())
    assert sampled.data.eval.model_dump(exclude_defaults=True) == grpo.data.train.model_dump(exclude_defaults=True)
    assert sampled.eval.max_new_tokens == grpo.trainer["max_completion_length"]  # the same completion budget
    # --pool: both arms on other problems, the same ones.
    pool = {"synthetic": 2000, "seed": 7, "generator": {"min_value": 10, "max_value": 99, "max_steps": 1}}
    other = load_recipe(ROOT / reward_only.GRPO, reward_only.grpo_overrides(12, 1.5e-4, 0, pool))
    drawn = load_recipe(ROOT / reward_only.GRPO, reward_only.sampling_overrides(pool))
    assert other.data.train.model_dump(exclude_defaults=True) == pool == drawn.data.eval.model_dump(exclude_defaults=True)
    rft = load_recipe(ROOT / reward_only.SFT, reward_only.rft_overrides(Path("/x/rft.jsonl"), 0))
    assert rft.algorithm == "sft" and rft.data.train.path == "/x/rft.jsonl" and rft.data.prompt == "short"
    assert rft.trainer["lr_scheduler_type"] == "constant" and rft.trainer["max_steps"] == 100000


def test_rft_rows_are_each_problem_s_distinct_right_samples_prompted_as_sampled():
    from rlkit.data import gsm8k

    records = [{"prompt": "Ann has 3 apples and buys 4. How many?", "samples": [
                   {"completion": "3 + 4 = 7\n#### 7", "correct": True},
                   {"completion": " 3 + 4 = 7\n#### 7 ", "correct": True},  # the same text: once
                   {"completion": "3 + 4 = 8\n#### 8", "correct": False},
                   {"completion": "4 + 3 = 7\n#### 7", "correct": True}]},
               {"prompt": "Bo has 9 pens and loses 2. How many?", "samples": [
                   {"completion": "9 - 2 = 6\n#### 6", "correct": False}] * 4}]
    rows = reward_only.right_rows(records)
    assert rows == [{"question": records[0]["prompt"], "answer": "3 + 4 = 7\n#### 7"},
                    {"question": records[0]["prompt"], "answer": "4 + 3 = 7\n#### 7"}]
    # `rlkit eval --samples` records the prompt's last message; in the short form that is the question itself, so
    # the SFT stage prompts each row as it was sampled and trains on the sample.
    prompt = gsm8k.chat_prompt(records[0]["prompt"], "short")
    assert prompt[-1] == {"role": "user", "content": records[0]["prompt"]}
    from datasets import Dataset

    sft = gsm8k.sft_rows(Dataset.from_list(rows), prompt="short")
    assert sft[0]["prompt"] == prompt and sft[1]["completion"] == [{"role": "assistant", "content": rows[1]["answer"]}]
