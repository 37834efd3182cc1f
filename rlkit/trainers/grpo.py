"""GRPO through TRL's GRPOTrainer, with rlkit's reward registry and tool environments.

Reward weights come from the recipe's ``rewards:`` list (TRL's ``reward_weights``); the chat
template kwargs from ``model.chat_template_kwargs``. With ``env:`` the environment class goes to
TRL as ``environment_factory`` (one instance per rollout, its public methods the tools) and
``env.max_turns`` becomes ``max_tool_calling_iterations``; each batch's episode metrics (searches,
empty results, calculator errors...) are logged as ``env/<name>``. With ``sampling.dynamic`` the trainer is
:mod:`rlkit.trainers.dynamic`'s subclass, which drops groups whose rewards are all equal and refills them.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
from typing import Any

from rlkit import compat
from rlkit.data import env_factory, load_rows, task_rows
from rlkit.envs import env_metrics, recipe_tool_schemas
from rlkit.errors import UserError
from rlkit.launch import rank_info
from rlkit.recipe import Recipe
from rlkit.rewards import Reward, resolve_reward
from rlkit.trainers import dynamic

HEAD = "causal"


def config_class() -> type:
    from trl import GRPOConfig

    return GRPOConfig


def dataset(recipe: Recipe):
    return task_rows(recipe, "grpo", load_rows(recipe.data.task, recipe.data.train))


def rlkit_fields(recipe: Recipe) -> dict[str, Any]:
    check_sampling(recipe)
    fields: dict[str, Any] = {"reward_weights": [r.weight for r in recipe.rewards]}
    if recipe.model.chat_template_kwargs:
        fields["chat_template_kwargs"] = recipe.model.chat_template_kwargs
    if recipe.env is not None:
        fields["max_tool_calling_iterations"] = recipe.env.max_turns
    if recipe.trainer.get("use_vllm") and recipe.trainer.get("vllm_max_model_length") is None:
        # Otherwise vLLM sizes its KV cache for the model's whole context (40K tokens for Qwen3-1.7B),
        # which does not fit the 0.3 of the GPU colocate mode gives it, and fails at start-up.
        fields["vllm_max_model_length"] = recipe.model.max_seq_length
    generation = recipe.trainer.get("generation_kwargs")
    if isinstance(generation, str) and generation.lstrip().startswith("{"):
        generation = _json_mapping(generation)  # TRL's own string form: its config parses it
    if isinstance(generation, str):  # TRL's GRPOTrainer would update a dict with it and fail with a traceback
        raise UserError(f"trainer.generation_kwargs: {generation!r} is not a mapping; write it as one, e.g. "
                        "--set 'trainer.generation_kwargs={max_new_tokens: 64}'")
    if recipe.trainer.get("use_vllm") and isinstance(generation, dict) and "max_new_tokens" in generation:
        # A reply's cap in transformers' name (recipes/smol_search_grpo.yaml); vLLM's SamplingParams calls it
        # max_tokens and refuses the other.
        generation = dict(generation)
        generation["max_tokens"] = generation.pop("max_new_tokens")
        fields["generation_kwargs"] = generation
    return fields


def _json_mapping(text: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"trainer.generation_kwargs: {text!r} is not JSON ({e.msg}); write it as a mapping, e.g. "
                        "--set 'trainer.generation_kwargs={max_new_tokens: 64}'") from None


def reply_tokens(generation_kwargs: Any, max_completion_length: int) -> int:
    """The most tokens one reply (one tool turn) may take: ``generation_kwargs``' ``max_new_tokens`` (or vLLM's
    ``max_tokens``) where the recipe sets one, else TRL's own limit for a turn, the episode's
    ``max_completion_length``."""
    if isinstance(generation_kwargs, dict):
        cap = generation_kwargs.get("max_new_tokens", generation_kwargs.get("max_tokens"))
        if isinstance(cap, int) and cap > 0:
            return min(cap, max_completion_length)
    return max_completion_length


def check_sampling(recipe: Recipe) -> None:
    """Every process builds the TRL config before a model loads: refuse ``sampling:`` with several there."""
    spec = recipe.sampling
    if spec is not None and (spec.dynamic or spec.pool is not None) and rank_info()[2] > 1:
        raise UserError("sampling: dynamic sampling and the prompt pool run in one process (a refill would have to "
                        "be drawn by every rank together); drop --num-processes or the `sampling:` section")


def check_config(config: Any, source: str) -> None:
    """GRPOConfig checks the batch arithmetic itself; fit_context checks the prompt room once the data is loaded."""


def reward_functions(recipe: Recipe) -> list[Reward]:
    funcs: list[Reward] = [resolve_reward(r.name, r.args) for r in recipe.rewards]
    if recipe.env is not None:
        # Wrap a synchronous reward: TRL decides sync vs async by inspecting the function it is given.
        first_sync = next((i for i, f in enumerate(funcs) if not inspect.iscoroutinefunction(f)), None)
        if first_sync is not None:
            funcs[first_sync] = LogEnvMetrics(funcs[first_sync])
    return funcs


class LogEnvMetrics:
    """A reward function that also logs the batch's mean environment metrics through TRL's ``log_metric``.

    TRL hands every reward function the batch's environment instances; wrapping the first reward is
    the one place rlkit sees them once per batch. The reward itself is unchanged.
    """

    def __init__(self, func: Any) -> None:
        functools.update_wrapper(self, func)
        self.__name__ = getattr(func, "__name__", type(func).__name__)

    def __call__(self, *args, environments: list | None = None, log_metric: Any = None, **kwargs) -> list:
        if environments and log_metric is not None:
            per_env = [env_metrics(env) for env in environments]
            for name in sorted({key for metrics in per_env for key in metrics}):
                values = [m[name] for m in per_env if name in m and math.isfinite(m[name])]
                if values:
                    log_metric(f"env/{name}", sum(values) / len(values))
        return self.__wrapped__(*args, environments=environments, log_metric=log_metric, **kwargs)


def build(recipe: Recipe, model: Any, tokenizer: Any, peft_config: Any, train_ds: Any, args: Any,
          callbacks: list):
    from trl import GRPOTrainer

    extra: dict[str, Any] = {}
    if recipe.env is not None:
        compat.silence_experimental_warning()
        extra["environment_factory"] = env_factory(recipe)
    cls = GRPOTrainer
    if recipe.sampling is not None and recipe.sampling.dynamic:
        cls, extra["max_rounds"] = dynamic.trainer_class(), recipe.sampling.max_rounds if recipe.sampling.refill else 0
    train_ds = fit_context(recipe, tokenizer, train_ds, args)
    return cls(model=model, reward_funcs=reward_functions(recipe), args=args, train_dataset=train_ds,
               processing_class=tokenizer, peft_config=peft_config, callbacks=callbacks, **extra)


def fit_context(recipe: Recipe, tokenizer: Any, train_ds: Any, args: Any) -> Any:
    """Drop prompts that leave no room for a completion in the context; refuse when none is left.

    The room is ``model.max_seq_length`` minus ``trainer.max_completion_length``; prompts are
    measured as the model sees them (chat template, tool schemas for an agent, generation prompt).
    """
    tools = None
    if recipe.env is not None:
        tools = recipe_tool_schemas(recipe)
    room = recipe.model.max_seq_length - args.max_completion_length
    if room <= 0:
        raise UserError(f"trainer.max_completion_length {args.max_completion_length} leaves no room for a prompt in "
                        f"model.max_seq_length {recipe.model.max_seq_length}; raise one or lower the other")
    kwargs = recipe.model.chat_template_kwargs
    texts = [tokenizer.apply_chat_template(p, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs)
             if isinstance(p, list) else p for p in train_ds["prompt"]]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    keep = [i for i, n in enumerate(lengths) if n <= room]
    if len(keep) == len(lengths):
        return train_ds
    why = (f"longer than {room} tokens (model.max_seq_length {recipe.model.max_seq_length} - "
           f"trainer.max_completion_length {args.max_completion_length}); the longest has {max(lengths)}")
    if not keep:
        raise UserError(f"data.train: every prompt is {why}; raise model.max_seq_length, lower "
                        "trainer.max_completion_length or shorten the prompts")
    logging.getLogger("rlkit").warning("data.train: dropped %d of %d prompts %s", len(lengths) - len(keep),
                                       len(lengths), why)
    return train_ds.select(keep)
