"""PPO through TRL 1.12's ``trl.experimental.ppo.PPOTrainer``.

PPOTrainer samples from tokenized prompts and asks a *reward model* for one score per sequence,
reading it the way it reads a sequence-classification model: ``getattr(model,
model.base_model_prefix)(...)`` for hidden states, then ``model.score(hidden_states[-1])`` at the
last real token. It takes no reward callables. So the reward is one of:

- ``reward_model:`` a reward run directory (``algorithm: reward``: its base plus its adapter,
  frozen) or a Hub sequence-classification model;
- ``rewards:`` rlkit's rule rewards (``gsm8k_correct`` ...), presented to PPOTrainer by
  :class:`RuleRewardModel`: it decodes each response, finds the dataset row of its prompt (for the
  gold answer) and returns the weighted sum of the rewards as that "hidden state".

The value model is a one-label score head on the policy's base (or on ``value_model:``: a reward
run directory or a Hub id), with the recipe's LoRA when there is one. Continuing from
``init_from``, the loaded adapter trains as ``default`` and a frozen copy named ``ref`` is the KL
reference, so the reference is the SFT policy rather than the bare base.
"""

from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING, Any

import torch

from rlkit import compat
from rlkit.compat import ppo_reward_model_base

if TYPE_CHECKING:
    from rlkit.recipe import Recipe

log = logging.getLogger("rlkit")
HEAD = "causal"


def config_class() -> type:
    return compat.ppo_config_class()


def dataset(recipe: Recipe):
    from rlkit.data import load_prompt_rows

    return load_prompt_rows(recipe, recipe.data.train)


def rlkit_fields(recipe: Recipe) -> dict[str, Any]:
    if recipe.init_from:
        return {"model_adapter_name": "default", "ref_adapter_name": "ref"}
    return {}


def check_config(args: Any, source: str) -> None:
    """Batch arithmetic PPOTrainer only checks when it is built (after the models load)."""
    from rlkit.errors import UserError

    local_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps
    if local_batch % args.num_mini_batches:
        raise UserError(f"{source}: trainer.num_mini_batches: {args.num_mini_batches} does not divide the rollout "
                        f"batch per device (per_device_train_batch_size x gradient_accumulation_steps = {local_batch})")
    if args.whiten_rewards and local_batch // args.num_mini_batches < 8:
        raise UserError(f"{source}: trainer.whiten_rewards needs at least 8 samples per mini-batch, got "
                        f"{local_batch // args.num_mini_batches}; raise the batch or lower num_mini_batches")


def build(recipe: Recipe, model: Any, tokenizer: Any, peft_config: Any, train_ds: Any, args: Any,
          callbacks: list):
    from rlkit.compat import ppo_trainer_class
    from rlkit.trainers.reward import load_score_model

    if recipe.init_from:
        from rlkit.runs import adapter_dir

        # The starting adapter, frozen, as the KL reference (PPOTrainer switches to it by name).
        model.load_adapter(str(adapter_dir(recipe.init_from)), adapter_name="ref", is_trainable=False)
        model.set_adapter("default")
    tokenizer.padding_side = "left"  # PPOTrainer generates from the collated (padded) prompts
    kwargs = recipe.model.chat_template_kwargs
    prompts = tokenize_prompts(train_ds, tokenizer, kwargs)
    eval_rows = _eval_prompts(recipe, tokenizer, kwargs) or prompts.select(range(min(len(prompts), 8)))
    if recipe.reward_model:
        reward_model, _ = load_score_model(recipe, recipe.reward_model, tokenizer, trainable=False)
        extra_callbacks = []
    else:
        reward_model = RuleRewardModel(recipe, tokenizer, train_ds, prompts)
        extra_callbacks = [reward_model.callback()]
    value_model = _value_model(recipe, tokenizer)
    return ppo_trainer_class()(args=args, processing_class=tokenizer, model=model, ref_model=None,
                      reward_model=reward_model, train_dataset=prompts, value_model=value_model,
                      eval_dataset=eval_rows, peft_config=peft_config,
                      callbacks=extra_callbacks + callbacks)


def tokenize_prompts(rows: Any, tokenizer: Any, chat_template_kwargs: dict[str, Any]):
    """``input_ids`` of each prompt as the model will continue it (chat template, generation prompt)."""

    def encode(row: dict[str, Any]) -> dict[str, list[int]]:
        prompt = row["prompt"]
        if isinstance(prompt, list):
            prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True,
                                                   **chat_template_kwargs)
        return {"input_ids": tokenizer(prompt, add_special_tokens=False)["input_ids"]}

    return rows.map(encode, remove_columns=rows.column_names)


def _eval_prompts(recipe: Recipe, tokenizer: Any, kwargs: dict[str, Any]):
    if recipe.data.eval is None:
        return None
    from rlkit.data import load_prompt_rows

    return tokenize_prompts(load_prompt_rows(recipe, recipe.data.eval), tokenizer, kwargs)


# ---------------------------------------------------------------------------------------------
# Reward and value models



def _value_model(recipe: Recipe, tokenizer: Any):
    from rlkit.backends import hf

    if recipe.value_model:
        from rlkit.trainers.reward import load_score_model

        return load_score_model(recipe, recipe.value_model, tokenizer, trainable=True)[0]
    model, _ = hf.load(recipe.model, head="score", training=True)
    if recipe.lora is None:
        return model
    from peft import get_peft_model

    # LoRA on the value backbone plus a fully trained score head; PPOTrainer reads the inner model.
    return get_peft_model(model, hf.lora_config(recipe.lora, head="score")).get_base_model()


class RuleRewardModel(ppo_reward_model_base()):
    """rlkit's reward functions, shaped like the sequence-classification model PPOTrainer expects
    (:func:`rlkit.compat.ppo_reward_model_base`).

    ``sequence_scores(input_ids, attention_mask)`` decodes every sequence, splits it into the prompt
    (looked up among the dataset's tokenized prompts, which also gives the row's columns such as
    ``answer``) and the response, and scores the response with the recipe's weighted rewards.
    """

    def __init__(self, recipe: Recipe, tokenizer: Any, rows: Any, prompts: Any) -> None:
        from rlkit.rewards import RewardSet

        super().__init__()
        self.reward_set = RewardSet(recipe.rewards)
        self.tokenizer = tokenizer
        self.rows = rows
        self.index: dict[tuple[int, ...], int] = {}
        for i, ids in enumerate(prompts["input_ids"]):
            self.index.setdefault(tuple(ids), i)
        self.lengths = sorted({len(k) for k in self.index}, reverse=True)
        self.history: collections.deque = collections.deque(maxlen=256)  # recent scored batches
        self._pending: dict[str, list[float]] = collections.defaultdict(list)

    def sequence_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[float]:
        found = [self._split(ids[mask.bool()].tolist()) for ids, mask in zip(input_ids, attention_mask, strict=True)]
        rows = [self.rows[i] for i, _ in found]
        texts = [self.tokenizer.decode(ids, skip_special_tokens=True) for _, ids in found]
        prompts = [row["prompt"] for row in rows]
        completions = [[{"role": "assistant", "content": t}] if isinstance(p, list) else t
                       for p, t in zip(prompts, texts, strict=True)]
        columns = {k: [row[k] for row in rows] for k in self.rows.column_names if k != "prompt"}
        total, per_reward = self.reward_set(prompts, completions, completion_ids=[ids for _, ids in found], **columns)
        for name, values in per_reward.items():
            self._pending[name].extend(values)
        self.history.append({"rows": [i for i, _ in found], "completions": texts, "rewards": per_reward,
                             "scores": total})
        return total

    def _split(self, ids: list[int]) -> tuple[int, list[int]]:
        for n in self.lengths:
            row = self.index.get(tuple(ids[:n]))
            if row is not None:
                return row, ids[n:]
        raise RuntimeError("PPO scored a sequence whose prompt is not in the training prompts")

    def callback(self):
        """Adds each rule reward's mean since the last log to the logged metrics (``rewards/<name>/mean``)."""
        from transformers import TrainerCallback

        scorer = self

        class RuleRewardMetrics(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs is None or "objective/scores" not in logs:
                    return
                for name, values in scorer._pending.items():
                    if values:
                        logs[f"rewards/{name}/mean"] = sum(values) / len(values)
                scorer._pending.clear()

        return RuleRewardMetrics()
