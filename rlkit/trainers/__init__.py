"""One builder per algorithm: recipe + loaded model -> a ready TRL trainer. No training loops here.

Each builder module provides ``HEAD`` (``causal``, or ``score`` for a sequence-classification
model), ``dataset(recipe)`` (the train split in the form its TRL trainer reads) and ``build(...)``;
optionally ``rlkit_fields(recipe)`` (TRL config fields rlkit decides from the recipe) and
``check_config(config, source)`` (settings the trainer would reject only once the models are loaded).
"""

from __future__ import annotations

import importlib
from typing import Any

BUILDERS = {
    "sft": "rlkit.trainers.sft",
    "dpo": "rlkit.trainers.dpo",
    "reward": "rlkit.trainers.reward",
    "ppo": "rlkit.trainers.ppo",
    "grpo": "rlkit.trainers.grpo",
}


def builder(algorithm: str):
    return importlib.import_module(BUILDERS[algorithm])


def with_template_kwargs(ds: Any, chat_template_kwargs: dict[str, Any]):
    """SFT, DPO and reward trainers read per-row chat-template kwargs from this column."""
    if not chat_template_kwargs:
        return ds
    return ds.map(lambda _: {"chat_template_kwargs": chat_template_kwargs})
