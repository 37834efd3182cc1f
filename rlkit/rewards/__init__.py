"""Reward functions by name: the ``REWARDS`` registry, plus ``package.module:function`` for user code.

Every reward follows TRL's calling convention, ``f(prompts=..., completions=..., completion_ids=...,
**dataset_columns, **trainer_kwargs) -> list[float]``, and is pure.
"""

import difflib
import functools
import importlib
import inspect
import re
from collections.abc import Callable

from rlkit.errors import UserError
from rlkit.rewards.math import answer_format, gsm8k_correct
from rlkit.rewards.qa import qa_correct
from rlkit.rewards.think import short_think, think_format

REWARDS: dict[str, Callable[..., list[float]]] = {
    "gsm8k_correct": gsm8k_correct,
    "qa_correct": qa_correct,
    "answer_format": answer_format,  # args `form: gsm8k` (default) or `form: answer_tag` (QA)
    "think_format": think_format,  # args `partial: true` for the share of well-formed turns
    "short_think": short_think,  # args `max_tokens`, `min_tokens`, `empty_score`, `tokenizer`
}


def resolve_reward(name: str, args: dict | None = None) -> Callable[..., list[float]]:
    """The reward called ``name`` (a ``REWARDS`` key or ``package.module:function``), with ``args`` bound."""
    if name in REWARDS:
        func = REWARDS[name]
    elif ":" in name:
        func = _import(name)
    else:
        raise UserError(
            f"unknown reward {name!r}{_suggestion(name)}; valid: {', '.join(sorted(REWARDS))}, "
            "or package.module:function"
        )
    if not callable(func):
        raise UserError(f"reward {name!r} is a {type(func).__name__}, not a function")
    if not args:
        return func
    if inspect.iscoroutinefunction(func):
        raise UserError(
            f"reward {name!r} is async, which rlkit cannot bind `args:` to; "
            "read them inside the function instead"
        )
    _check_args(name, func, args)
    return _WithArgs(func, name.rpartition(":")[2], args)


def _check_args(name: str, func: Callable, args: dict) -> None:
    """Refuse `args:` the reward would never read, and (for rlkit's own rewards) values it would reject.

    Rewards take ``**kwargs`` (TRL passes every dataset column), so a misspelt argument would otherwise be
    swallowed silently: rlkit's rewards take only their named settings. User functions that take
    ``**kwargs`` may read anything from it, so only their named columns are refused.
    """
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):  # a builtin or C function: nothing to check
        return
    # Settings are the parameters with defaults; the ones without are columns TRL fills per batch.
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    settings = [p for p, v in params.items() if v.kind in kinds and v.default is not v.empty]
    columns = [p for p, v in params.items() if v.kind in kinds and v.default is v.empty]
    takes_any = any(v.kind is inspect.Parameter.VAR_KEYWORD for v in params.values())
    for key in args:
        if key not in settings and (name in REWARDS or not takes_any):  # user code may read **kwargs itself
            close = difflib.get_close_matches(key, settings, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            what = "is filled from the data, not set in `args:`" if key in columns else f"takes no argument {key!r}"
            raise UserError(f"args.{key}: reward {name!r} {what}{hint}; its settings: {', '.join(settings) or 'none'}")
    if name in REWARDS:
        # rlkit's rewards check their settings before reading any completion: an empty batch shows a bad value.
        required = {p: [] for p in columns if p != "completions"}
        try:
            func(prompts=[], completions=[], **required, **args)
        except ValueError as e:
            raise UserError(f"args: {e}") from None


def _suggestion(name: str) -> str:
    close = difflib.get_close_matches(name, REWARDS, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _import(spec: str) -> object:
    if not re.fullmatch(r"\w+(\.\w+)*:\w+", spec):
        raise UserError(f"reward {spec!r} must have the form package.module:function")
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(f"cannot import reward {spec!r}: {e}") from None
    if not hasattr(module, attribute):
        raise UserError(f"cannot load reward {spec!r}: module {module_name!r} has no attribute {attribute!r}")
    return getattr(module, attribute)


class _WithArgs:
    """A reward with the recipe's ``args`` added to every call, named after the reward.

    A module-level class rather than a closure so it pickles (TRL's async GRPO sends reward functions
    to a spawned process), and not a bare ``functools.partial``, which TRL logs under the wrapped
    function's name.
    """

    def __init__(self, func: Callable[..., list[float]], name: str, args: dict) -> None:
        functools.update_wrapper(self, func)
        self.__name__ = self.__qualname__ = name
        self.args = dict(args)

    def __call__(self, *positional, **kwargs) -> list[float]:
        return self.__wrapped__(*positional, **kwargs, **self.args)

    def __repr__(self) -> str:
        return f"{self.__name__}(**{self.args!r})"


class RewardSet:
    """A recipe's weighted rewards, called TRL's way; for the places rlkit scores text itself
    (PPO's rule-reward model, ``rlkit pairs``). ``None`` and non-finite values count as 0."""

    def __init__(self, specs: list) -> None:
        self.names = [spec.name.rpartition(":")[2] for spec in specs]
        self.weights = [spec.weight for spec in specs]
        self.funcs = [resolve_reward(spec.name, spec.args) for spec in specs]

    def __call__(self, prompts: list, completions: list, **columns) -> tuple[list[float], dict[str, list[float]]]:
        """(weighted total per completion, {reward name: values})."""
        import math

        total = [0.0] * len(completions)
        per_reward: dict[str, list[float]] = {}
        for name, func, weight in zip(self.names, self.funcs, self.weights, strict=True):
            raw = func(prompts=prompts, completions=completions, **columns)
            values = [float(v) if v is not None and math.isfinite(v) else 0.0 for v in raw]
            per_reward[name] = values
            total = [t + weight * v for t, v in zip(total, values, strict=True)]
        return total, per_reward
