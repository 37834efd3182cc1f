"""SFT through TRL's SFTTrainer.

Task rows become conversational prompt/completion pairs (loss on the completion only, TRL's
default for that form) or pass through as ``messages``.
"""

from __future__ import annotations

from typing import Any

HEAD = "causal"


def dataset(recipe: Any):
    from rlkit.data import load_rows, task_rows
    from rlkit.trainers import with_template_kwargs

    rows = task_rows(recipe, "sft", load_rows(recipe.data.task, recipe.data.train))
    return with_template_kwargs(rows, recipe.model.chat_template_kwargs)


def build(recipe: Any, model: Any, tokenizer: Any, peft_config: Any, train_ds: Any, args: Any,
          callbacks: list):
    from trl import SFTTrainer

    return SFTTrainer(model=model, args=args, train_dataset=train_ds, processing_class=tokenizer,
                      peft_config=peft_config, callbacks=callbacks)
