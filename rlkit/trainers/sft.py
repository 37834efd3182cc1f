"""SFT through TRL's SFTTrainer.

Task rows become conversational prompt/completion pairs (loss on the completion only, TRL's
default for that form) or pass through as ``messages``.
"""

from __future__ import annotations

from typing import Any

from rlkit.data import load_rows, task_rows
from rlkit.recipe import Recipe

HEAD = "causal"


def config_class() -> type:
    from trl import SFTConfig

    return SFTConfig


def dataset(recipe: Recipe):
    rows = task_rows(recipe, "sft", load_rows(recipe.data.task, recipe.data.train))
    return with_template_kwargs(rows, recipe.model.chat_template_kwargs)


def rlkit_fields(recipe: Recipe) -> dict[str, Any]:
    return {}  # the chat template kwargs travel in the dataset (with_template_kwargs)


def check_config(config: Any, source: str) -> None:
    """SFTTrainer checks its settings itself."""


def with_template_kwargs(ds: Any, chat_template_kwargs: dict[str, Any]):
    """SFT, DPO and reward trainers read per-row chat-template kwargs from this column."""
    if not chat_template_kwargs:
        return ds
    return ds.map(lambda _: {"chat_template_kwargs": chat_template_kwargs})


def build(recipe: Recipe, model: Any, tokenizer: Any, peft_config: Any, train_ds: Any, args: Any,
          callbacks: list):
    from trl import SFTTrainer

    return SFTTrainer(model=model, args=args, train_dataset=train_ds, processing_class=tokenizer,
                      peft_config=peft_config, callbacks=callbacks)
