"""Tool environments by name, and the helpers the GRPO trainer and rlkit's rollout engine share.

An environment follows TRL's ``environment_factory`` contract (:class:`Env`): the factory is called with
no arguments, one instance serves a rollout at a time and is reused after ``reset(**row)``, and every
public method other than ``reset`` and ``get_reward`` is a tool (typed, with a Google-style
docstring). :func:`tools_of` and :func:`call_tool` apply TRL's rules, so a model evaluated with
rlkit's rollout engine sees the same tools and the same tool-result text as in training.
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import json
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rlkit.compat import TRL_NON_TOOL_METHODS, trl_tool_error
from rlkit.envs.calculator import CalculatorEnv
from rlkit.envs.mcp import McpEnv
from rlkit.envs.retrieval import RetrievalEnv
from rlkit.errors import UserError
from rlkit.registry import Registry, did_you_mean

if TYPE_CHECKING:
    from rlkit.recipe.schema import Recipe


class Env(Protocol):
    """One rollout's environment: ``reset`` with the dataset row, then its tools (its other public methods)."""

    def reset(self, **row: Any) -> Any: ...


ENVS: Registry[type[Env]] = Registry("environment", {"calculator": CalculatorEnv, "mcp": McpEnv,
                                                     "retrieval": RetrievalEnv})


def env_class(name: str) -> type[Env]:
    """The environment class registered as ``name``."""
    return ENVS.get(name)


def check_env_args(name: str, args: dict[str, Any]) -> None:
    """Raise :class:`UserError` naming the first key of ``args`` the environment's ``__init__`` does not take."""
    params = inspect.signature(env_class(name)).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    valid = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in args:
        if key not in valid:
            raise UserError(f"env.args.{key}: environment {name!r} takes no such argument{did_you_mean(key, valid)}; "
                            f"valid: {', '.join(valid) or 'none'}")


def make_factory(recipe: Recipe, presets: Mapping[str, Any] | None = None) -> Callable[[], Any]:
    """TRL's ``environment_factory`` for ``recipe``: a picklable partial of the environment class.

    Its arguments are ``env.args`` over ``presets``, what the task presets for the environment (the task
    layer passes them: :func:`rlkit.data.env_factory`),
    plus, when the environment's module defines ``factory_kwargs(recipe)``, what that derives from the rest of
    the recipe (the retrieval env's index comes from ``retrieval:``). A key both set in ``env.args`` and derived
    is an error rather than a silent precedence rule.
    """
    if recipe.env is None:
        raise UserError("env: this recipe has no tool environment; add `env: {name: calculator}` or similar")
    name = recipe.env.name
    check_env_args(name, recipe.env.args)
    kwargs = {**(presets or {}), **recipe.env.args}
    cls = env_class(name)
    derive = getattr(sys.modules[cls.__module__], "factory_kwargs", None)
    if derive is not None:
        derived = derive(recipe)
        clash = sorted(derived.keys() & kwargs.keys())
        if clash:
            raise UserError(f"env.args.{clash[0]}: environment {name!r} sets it from the rest of the recipe; "
                            "remove it from env.args")
        kwargs.update(derived)
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as e:
        raise UserError(f"env.args: environment {name!r}: {e}") from None
    return functools.partial(cls, **kwargs)


def tools_of(env: Any) -> dict[str, Callable[..., Any]]:
    """The environment's tools by name, as TRL picks them: public methods except ``reset``/``get_reward``."""
    return {name: method for name, method in inspect.getmembers(env, inspect.ismethod)
            if not name.startswith("_") and name not in TRL_NON_TOOL_METHODS}


def tool_schemas(env: Any) -> list[dict[str, Any]]:
    """The environment's tools in OpenAI's ``tools`` format, as TRL renders them into the prompt."""
    from transformers.utils import get_json_schema

    return [get_json_schema(method) for method in tools_of(env).values()]


def class_tool_schemas(cls: type) -> list[dict[str, Any]]:
    """:func:`tool_schemas` without building an instance (which may load an index), for SFT data."""
    from transformers.utils import get_json_schema

    # get_json_schema drops an untyped leading `self`, so plain functions give the bound methods' schemas.
    return [get_json_schema(func) for name, func in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_") and name not in TRL_NON_TOOL_METHODS]


def recipe_tool_schemas(recipe: Recipe) -> list[dict[str, Any]]:
    """The tools the recipe's environment shows the model; an environment whose tools come from elsewhere (an
    MCP server: ``dynamic_tools``) is built once to ask, the others are read from their class."""
    cls = env_class(recipe.env.name)
    if getattr(cls, "dynamic_tools", False):
        return tool_schemas(make_factory(recipe)())
    return class_tool_schemas(cls)


@dataclass
class ToolResult:
    """One tool call. ``content`` is the text the model reads: the tool's result through ``str()``, or
    on failure TRL's ``str({'error': message})``, with the message also in ``error``."""

    name: str
    arguments: dict[str, Any]
    content: str
    error: str | None
    seconds: float
    timed_out: bool = False


def call_tool(env: Any, name: str, arguments: dict[str, Any] | str, timeout: float | None = None) -> ToolResult:
    """Call tool ``name`` of ``env`` the way TRL's tool loop does; never raises for a failed call.

    ``arguments`` may be a JSON string (OpenAI's ``tool_calls`` carry strings). With ``timeout`` (seconds)
    the call runs in a daemon thread; one that overruns is reported and left running, since Python cannot
    stop a thread, so do not reuse that environment instance.
    """
    start = time.perf_counter()
    parsed: dict[str, Any] = {}
    timed_out = False
    try:
        parsed = _parse_arguments(arguments)
        tools = tools_of(env)
        if name not in tools:
            raise ValueError(f"Tool {name} not found; available tools: {', '.join(tools) or 'none'}")
        content, error = str(_run(tools[name], parsed, timeout)), None
    except Exception as e:  # as in TRL: a failed call is the model's tool result, never a crash
        content, error, timed_out = trl_tool_error(str(e)), str(e), isinstance(e, _ToolTimeout)
    return ToolResult(name, parsed, content, error, time.perf_counter() - start, timed_out)


class _ToolTimeout(TimeoutError):
    """A tool call that overran its timeout (and may still be running)."""


def _parse_arguments(arguments: dict[str, Any] | str) -> dict[str, Any]:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"tool arguments are not valid JSON: {e}") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"tool arguments must be a JSON object, got {type(arguments).__name__}")
    return arguments


def _run(tool: Callable[..., Any], arguments: dict[str, Any], timeout: float | None) -> Any:
    if timeout is None:
        return tool(**arguments)
    future: concurrent.futures.Future = concurrent.futures.Future()

    def work() -> None:
        try:
            future.set_result(tool(**arguments))
        except Exception as e:
            future.set_exception(e)

    # A daemon thread rather than an executor: interpreter exit joins executor threads, so a tool
    # that never returns would keep the process alive.
    threading.Thread(target=work, name=f"tool-{getattr(tool, '__name__', 'call')}", daemon=True).start()
    if not concurrent.futures.wait([future], timeout).done:
        raise _ToolTimeout(f"timed out after {timeout:g}s")
    return future.result()


def env_metrics(env: Any) -> dict[str, float]:
    """A copy of the environment's episode ``metrics`` (``{}`` when it keeps none)."""
    return {key: float(value) for key, value in getattr(env, "metrics", {}).items()}
