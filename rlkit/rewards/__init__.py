"""Reward functions by name: the ``REWARDS`` registry, plus ``package.module:function`` for user code.

Every reward follows TRL's calling convention (:class:`Reward`) and is pure.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import numbers
import re
from collections.abc import Callable
from math import isfinite  # `math` here would be rlkit.rewards.math, the submodule
from typing import Any, Protocol

from rlkit.errors import UserError
from rlkit.registry import Registry, did_you_mean
from rlkit.rewards.judge import judge, rank
from rlkit.rewards.math import answer_format, gsm8k_correct
from rlkit.rewards.qa import qa_correct
from rlkit.rewards.think import short_think, think_format


class Reward(Protocol):
    """TRL's calling convention: ``f(prompts=..., completions=..., completion_ids=..., **dataset_columns,
    **trainer_kwargs)`` -> one float per completion (None: no score)."""

    def __call__(self, *args: Any, **kwargs: Any) -> list[float]: ...


REWARDS: Registry[Reward] = Registry("reward", {
    "gsm8k_correct": gsm8k_correct,
    "qa_correct": qa_correct,
    "answer_format": answer_format,  # args `form: gsm8k` (default) or `form: answer_tag` (QA)
    "think_format": think_format,  # args `partial: true` for the share of well-formed turns
    "short_think": short_think,  # args `max_tokens`, `min_tokens`, `empty_score`, `tokenizer`
    "judge": judge,  # an LLM judge through an OpenAI-compatible endpoint: args `endpoint`, `model`, ... (judge.py)
    "rank": rank,  # RULER-style relative scores of each prompt's group of completions (judge.py)
}, also=", or package.module:function")


def resolve_reward(name: str, args: dict | None = None) -> Reward:
    """The reward called ``name`` (a ``REWARDS`` key or ``package.module:function``), with ``args`` bound."""
    if name in REWARDS:
        func: Any = REWARDS[name]
    elif ":" in name:
        func = _import(name)
    else:
        raise UserError(REWARDS.unknown(name))
    if not callable(func):
        raise UserError(f"reward {name!r} is a {type(func).__name__}, not a function")
    if inspect.iscoroutinefunction(func):
        if args:
            raise UserError(
                f"reward {name!r} is async, which rlkit cannot bind `args:` to; "
                "read them inside the function instead"
            )
        return func  # TRL awaits it itself; wrapping would hide that it is async
    if args:
        _check_args(name, func, args)
        func = _WithArgs(func, name.rpartition(":")[2], args)
    # rlkit's own rewards are tested pure functions; user code gets its answers checked.
    return _Checked(func, name) if name not in REWARDS else func


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
            hint = did_you_mean(key, settings)
            what = "is filled from the data, not set in `args:`" if key in columns else f"takes no argument {key!r}"
            raise UserError(f"args.{key}: reward {name!r} {what}{hint}; its settings: {', '.join(settings) or 'none'}")
    if name in REWARDS:
        # rlkit's rewards check their settings before reading any completion: an empty batch shows a bad value.
        required = {p: [] for p in columns if p not in ("completions", "prompts")}
        try:
            func(prompts=[], completions=[], **required, **args)
        except ValueError as e:
            raise UserError(f"args: {e}") from None


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


class _Checked:
    """A reward whose every answer is checked: one finite number (or None) per completion.

    A reward that raises, returns the wrong length or type, or a NaN/inf would otherwise surface deep
    inside TRL (or, for NaN, train on garbage): this stops the run with one line naming the function, the
    row and what it returned. Module-level so it pickles, like :class:`_WithArgs`.
    """

    def __init__(self, func: Callable[..., list[float]], spec: str) -> None:
        functools.update_wrapper(self, func)
        self.__name__ = self.__qualname__ = spec.rpartition(":")[2]
        self.spec = spec

    def __call__(self, *positional, **kwargs) -> list[float]:
        completions = kwargs.get("completions") or []
        try:
            values = self.__wrapped__(*positional, **kwargs)
        except Exception as e:  # the user's code: any error it raises is reported as a one-line UserError
            if isinstance(e, UserError):
                raise
            raise UserError(f"reward {self.spec}: raised {type(e).__name__}: {e}{_where(kwargs, None)}") from e
        if not isinstance(values, list | tuple) and not hasattr(values, "tolist"):
            raise UserError(f"reward {self.spec}: returned {_show(values)} (a {type(values).__name__}); "
                            f"a reward returns a list with one float per completion")
        values = list(values.tolist() if hasattr(values, "tolist") else values)
        if len(values) != len(completions):
            raise UserError(f"reward {self.spec}: returned {len(values)} values for {len(completions)} completions"
                            f"{_where(kwargs, None)}")
        for i, v in enumerate(values):
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise UserError(f"reward {self.spec}: returned {_show(v)} (a {type(v).__name__}) "
                                f"{_where(kwargs, i).lstrip()}; expected a float or None")
            if not isfinite(v):
                raise UserError(f"reward {self.spec}: returned {v} {_where(kwargs, i).lstrip()}; rewards must be "
                                "finite (training stopped; the last complete checkpoint is kept)")
        return values

    def __repr__(self) -> str:
        return repr(self.__wrapped__)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _where(kwargs: dict, row: int | None) -> str:
    state = kwargs.get("trainer_state")
    step = f" at step {state.global_step}" if getattr(state, "global_step", None) is not None else ""
    if row is None:
        return step
    prompts = kwargs.get("prompts") or []
    prompt = prompts[row] if row < len(prompts) else None
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        prompt = prompt[-1].get("content")
    return f" for row {row} of the batch{step} (prompt {_show(prompt)})"


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
    (PPO's rule-reward model, ``rlkit pairs``). ``None`` counts as 0; non-finite values stop the run."""

    def __init__(self, specs: list) -> None:
        self.names = [spec.name.rpartition(":")[2] for spec in specs]
        self.weights = [spec.weight for spec in specs]
        self.funcs = [resolve_reward(spec.name, spec.args) for spec in specs]

    def __call__(self, prompts: list, completions: list, **columns) -> tuple[list[float], dict[str, list[float]]]:
        """(weighted total per completion, {reward name: values})."""
        total = [0.0] * len(completions)
        per_reward: dict[str, list[float]] = {}
        for name, func, weight in zip(self.names, self.funcs, self.weights, strict=True):
            raw = func(prompts=prompts, completions=completions, **columns)
            values = [float(v) if v is not None else 0.0 for v in raw]
            per_reward[name] = values
            total = [t + weight * v for t, v in zip(total, values, strict=True)]
        return total, per_reward
