"""DPO through TRL's DPOTrainer, on preference pairs (a file, the Hub, or ``rlkit pairs`` output).

With LoRA no reference copy is loaded: the reference is the model with the adapter disabled. When
continuing from ``init_from``, TRL adds a frozen copy of the loaded adapter named ``ref``, so the
reference is the starting (e.g. SFT) policy, not the bare base.
"""

from __future__ import annotations

from typing import Any

from rlkit.data import load_preference_rows
from rlkit.recipe import Recipe
from rlkit.trainers.sft import with_template_kwargs

HEAD = "causal"


def config_class() -> type:
    from trl import DPOConfig

    return DPOConfig


def dataset(recipe: Recipe):
    rows = load_preference_rows(recipe.data.task, recipe.data.train)
    return with_template_kwargs(rows, recipe.model.chat_template_kwargs)


def rlkit_fields(recipe: Recipe) -> dict[str, Any]:
    return {}  # the chat template kwargs travel in the dataset (with_template_kwargs)


def check_config(config: Any, source: str) -> None:
    """DPOTrainer checks its settings itself."""


def build(recipe: Recipe, model: Any, tokenizer: Any, peft_config: Any, train_ds: Any, args: Any,
          callbacks: list):
    from trl import DPOTrainer

    return DPOTrainer(model=model, args=args, train_dataset=train_ds, processing_class=tokenizer,
                      peft_config=peft_config, callbacks=callbacks)
