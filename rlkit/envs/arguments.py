"""A tool call's arguments checked against the tool's JSON schema before the tool runs (``jsonschema``'s validator).

A built-in tool's schema is what the model reads about it: transformers' ``get_json_schema`` of the method (its
type hints and docstring), which TRL renders into the prompt in training and ``rlkit serve-search`` publishes. The
check adds two things a Python signature already implies: no argument the method does not take
(``additionalProperties: false``) and no string over ``MAX_CHARS`` characters, so a megabyte "query" is refused
before an index sees it. An MCP server's tools (``env: {name: mcp}``) are checked against the server's own input
schema, as published.

A call that fails is a :class:`ToolArgumentError`, a ``ValueError`` whose one-line message is the tool result the
model reads (``query must be a string, not an integer``): TRL turns it into ``{'error': ...}`` and counts it as a
failed call, rlkit's rollouts and ``rlkit serve-search`` (an MCP tool error) do the same, and the episode earns
what any failed call earns. The check is one code path for all three, never a Python ``TypeError`` or a traceback.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

MAX_CHARS = 2000  # per string argument of a built-in tool; the calculator allows fewer (its MAX_LENGTH)
_ARTICLE = {"array": "an array", "integer": "an integer", "object": "an object", "null": "null"}


class ToolArgumentError(ValueError):
    """Arguments that do not fit the tool's schema; the message says which and how, for the model to read."""


def validated(func: Callable[..., Any] | None = None, *, max_chars: int = MAX_CHARS) -> Any:
    """Decorate a tool method: its keyword arguments are checked against its own schema first.

    ``functools.wraps`` keeps the signature, type hints and docstring, so TRL and ``get_json_schema`` see the
    method as written. Positional arguments (a Python caller's) are checked under their parameter names.
    """
    if func is None:
        return functools.partial(validated, max_chars=max_chars)
    names = list(inspect.signature(func).parameters)[1:]  # after `self`

    @functools.wraps(func)
    def tool(self: Any, *args: Any, **kwargs: Any) -> Any:
        check(func.__name__, _schema(func, max_chars), {**dict(zip(names, args, strict=False)), **kwargs})
        return func(self, *args, **kwargs)

    return tool


@functools.lru_cache(maxsize=64)
def _schema(func: Callable[..., Any], max_chars: int) -> dict[str, Any]:
    from transformers.utils import get_json_schema

    params = get_json_schema(func)["function"]["parameters"]
    properties = {name: {"maxLength": max_chars, **prop} for name, prop in params.get("properties", {}).items()}
    return {**params, "properties": properties, "additionalProperties": False}


def check(tool: str, schema: dict[str, Any], arguments: dict[str, Any]) -> None:
    """Raise :class:`ToolArgumentError` naming the first way ``arguments`` break ``schema``."""
    error = _best_error(_validator(_key(schema)), arguments)
    if error is not None:
        raise ToolArgumentError(describe(tool, schema, arguments, error))


def check_schema(tool: str, schema: dict[str, Any]) -> None:
    """A :class:`~rlkit.errors.UserError` for an input schema that is not valid JSON Schema (an MCP server's)."""
    from jsonschema.exceptions import SchemaError

    from rlkit.errors import UserError

    try:
        type(_validator(_key(schema))).check_schema(schema)
    except SchemaError as e:
        raise UserError(f"env.tools: the MCP tool {tool!r} publishes an input schema that is not valid JSON Schema "
                        f"({_short(e.message, 120)}); leave the tool out with env.tools") from None


def _key(schema: dict[str, Any]) -> str:
    import json

    return json.dumps(schema, sort_keys=True, default=str)


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    import json

    from jsonschema import validators

    schema = json.loads(schema_json)
    cls = validators.validator_for(schema)  # the draft the schema names ($schema), 2020-12 when it names none
    return cls(schema)


def _best_error(validator: Any, arguments: dict[str, Any]) -> Any:
    from jsonschema.exceptions import best_match

    return best_match(validator.iter_errors(arguments))


def describe(tool: str, schema: dict[str, Any], arguments: dict[str, Any], error: Any) -> str:
    """One line for the model: which argument, what it must be, what was sent instead."""
    takes = ", ".join(schema.get("properties") or {}) or "no arguments"
    name = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "required":
        missing = [n for n in error.validator_value if n not in error.instance]
        return f"missing argument {missing[0] if missing else '?'}; {tool} takes: {takes}"
    if error.validator == "additionalProperties" and not error.absolute_path:
        unknown = [n for n in arguments if n not in (schema.get("properties") or {})]
        return f"unknown argument {_short(repr(unknown[0] if unknown else '?'), 60)}; {tool} takes: {takes}"
    if error.validator == "type":
        wanted = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        return f"{name or 'arguments'} must be {' or '.join(_ARTICLE.get(t, 'a ' + t) for t in wanted)}, " \
               f"not {_json_type(error.instance)}"
    if error.validator == "maxLength":
        return f"{name} too long ({len(error.instance)} characters, limit {error.validator_value})"
    if error.validator == "enum":
        return f"{name} must be one of: {', '.join(map(str, error.validator_value))}"
    return f"{name or 'arguments'}: {_short(error.message, 200)}"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list | tuple) else "an object"


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
