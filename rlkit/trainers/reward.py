"""Reward models through TRL's RewardTrainer: the policy's base with a one-label score head.

The head is new and trained in full (``modules_to_save``) next to the LoRA. The run's adapter is
what PPO's ``reward_model:`` (and ``value_model:``) load.
"""

from __future__ import annotations

from typing import Any

HEAD = "score"


def dataset(recipe: Any):
    from rlkit.data import load_preference_rows
    from rlkit.trainers import with_template_kwargs

    rows = load_preference_rows(recipe.data.task, recipe.data.train)
    return with_template_kwargs(rows, recipe.model.chat_template_kwargs)


def rlkit_fields(recipe: Any) -> dict[str, Any]:
    return {}


def build(recipe: Any, model: Any, tokenizer: Any, peft_config: Any, train_ds: Any, args: Any,
          callbacks: list):
    from trl import RewardTrainer

    return RewardTrainer(model=model, args=args, train_dataset=train_ds, processing_class=tokenizer,
                         peft_config=peft_config, callbacks=callbacks)
