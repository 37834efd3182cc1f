"""GRPO through TRL's GRPOTrainer, with rlkit's reward registry.

Reward weights come from the recipe's ``rewards:`` list (TRL's ``reward_weights``); the chat
template kwargs from ``model.chat_template_kwargs``.
"""

from __future__ import annotations

from typing import Any

HEAD = "causal"


def dataset(recipe: Any):
    from rlkit.data import get_task, load_rows

    return get_task(recipe.data.task).grpo_rows(load_rows(recipe.data.task, recipe.data.train))


def rlkit_fields(recipe: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"reward_weights": [r.weight for r in recipe.rewards]}
    if recipe.model.chat_template_kwargs:
        fields["chat_template_kwargs"] = recipe.model.chat_template_kwargs
    return fields


def reward_functions(recipe: Any) -> list:
    from rlkit.rewards import resolve_reward

    return [resolve_reward(r.name, r.args) for r in recipe.rewards]


def build(recipe: Any, model: Any, tokenizer: Any, peft_config: Any, train_ds: Any, args: Any,
          callbacks: list):
    from trl import GRPOTrainer

    return GRPOTrainer(model=model, reward_funcs=reward_functions(recipe), args=args, train_dataset=train_ds,
                       processing_class=tokenizer, peft_config=peft_config, callbacks=callbacks)
