"""Reward models through TRL's RewardTrainer: the policy's base with a one-label score head.

The head is new and trained in full (``modules_to_save``) next to the LoRA. The run's adapter is
what PPO's ``reward_model:`` (and ``value_model:``) load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlkit import runs
from rlkit.backends import hf
from rlkit.errors import UserError
from rlkit.recipe import Recipe
from rlkit.trainers.dpo import check_config, dataset, rlkit_fields  # noqa: F401  (DPO's pairs, nothing added)

HEAD = "score"


def config_class() -> type:
    from trl import RewardConfig

    return RewardConfig


def build(recipe: Recipe, model: Any, tokenizer: Any, peft_config: Any, train_ds: Any, args: Any,
          callbacks: list):
    from trl import RewardTrainer

    return RewardTrainer(model=model, args=args, train_dataset=train_ds, processing_class=tokenizer,
                         peft_config=peft_config, callbacks=callbacks)


def load_score_model(recipe: Recipe, ref: str | Path, tokenizer: Any = None, *, trainable: bool = False):
    """A one-label sequence-classification model: a reward run (base + adapter) or a Hub/local model.

    With ``tokenizer`` (the policy's, for PPO) the model must share it, since it reads the policy's
    token ids. Returns ``(model, its tokenizer)``.
    """
    path = Path(ref)
    if runs.holds_adapter(path):
        directory = runs.adapter_dir(path)
        run_dir = directory.parent if runs.is_run_dir(directory.parent) else None
        spec = recipe.model
        if run_dir is not None:
            trained = runs.read_resolved(run_dir)
            if trained.get("algorithm") != "reward":
                raise UserError(f"{ref}: a {trained.get('algorithm')} run, not a reward model "
                                "(train one with an `algorithm: reward` recipe)")
            spec = spec.model_copy(update={k: trained["model"][k] for k in ("name_or_path", "load_in_4bit")})
        from rlkit.backends.recorded import trained_base

        spec, quantization = trained_base(spec, run_dir)
        base, score_tokenizer = hf.load(spec, head="score", training=True, quantization=quantization)
        model = hf.attach_adapter(base, directory, trainable=trainable).get_base_model()
    else:
        model, score_tokenizer = hf.load(recipe.model, head="score", name=ref, training=True)
        model.requires_grad_(trainable)
    if tokenizer is not None and score_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise UserError(f"{ref}: its tokenizer differs from the policy's ({recipe.model.name_or_path}); PPO feeds "
                        "the policy's token ids to the reward and value models, so they must share a tokenizer")
    return model, score_tokenizer
