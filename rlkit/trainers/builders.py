"""One builder per algorithm (:class:`TrainerBuilder`), by name: recipe + loaded model -> a ready TRL trainer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from rlkit.recipe import Recipe
from rlkit.registry import Registry
from rlkit.trainers import dpo, grpo, ppo, reward, sft

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments



class TrainerBuilder(Protocol):
    """What each algorithm's module provides. No training loops: TRL's trainers run them."""

    HEAD: str
    """``causal``, or ``score`` for a sequence-classification model (reward models)."""

    def config_class(self) -> type[TrainingArguments]:
        """TRL's config class for the algorithm (imported when asked: Unsloth must come first)."""

    def dataset(self, recipe: Recipe) -> Dataset:
        """The train split in the form the TRL trainer reads."""

    def rlkit_fields(self, recipe: Recipe) -> dict[str, Any]:
        """TRL config fields rlkit decides from the rest of the recipe (``RLKIT_OWNED_TRAINER_KEYS``)."""

    def check_config(self, config: Any, source: str) -> None:
        """Refuse settings the trainer would reject only once the models are loaded."""

    def build(self, recipe: Recipe, model: Any, tokenizer: Any, peft_config: Any, train_ds: Dataset,
              args: Any, callbacks: list) -> Trainer:
        """The TRL trainer, ready to ``train()``."""


BUILDERS: Registry[TrainerBuilder] = Registry("algorithm", {
    "sft": sft,
    "dpo": dpo,
    "reward": reward,
    "ppo": ppo,
    "grpo": grpo,
})
