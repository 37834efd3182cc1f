"""SFT through TRL's SFTTrainer.

Task rows become conversational prompt/completion pairs (loss on the completion only, TRL's
default for that form) or pass through as ``messages``.
"""

from __future__ import annotations

from typing import Any


def dataset(task: Any, rows: Any, chat_template_kwargs: dict[str, Any]):
    ds = task.sft_rows(rows)
    if chat_template_kwargs:
        # SFTTrainer reads per-row template kwargs from this column.
        ds = ds.map(lambda _: {"chat_template_kwargs": chat_template_kwargs})
    return ds


def rlkit_fields(recipe: Any) -> dict[str, Any]:
    return {}


def build(recipe: Any, model: Any, tokenizer: Any, peft_config: Any, train_ds: Any, args: Any,
          callbacks: list):
    from trl import SFTTrainer

    return SFTTrainer(model=model, args=args, train_dataset=train_ds, processing_class=tokenizer,
                      peft_config=peft_config, callbacks=callbacks)
