"""``env: {name: mcp}``: any MCP server's tools as the episode's tools (TRL's ``environment_factory`` contract).

The recipe names the server (``env.server``: a ``command`` with ``args``/``env``/``cwd``, or a ``url``), which
of its tools to expose (``env.tools``, default all) and the seconds a call may take (``env.timeout``). One
server per process serves every episode (:mod:`rlkit.envs.mcp_client`).

TRL 1.12 reads an environment's tools from its public methods and renders each through transformers'
``get_json_schema`` (type hints and a Google-style docstring), which offers no way to hand it a schema
directly. So each MCP tool becomes a method built for it: named as the tool, its docstring the tool's
description with an ``Args:`` line per property, its signature one keyword parameter per property typed
from the JSON schema (required ones without a default). The method checks the arguments the model gave against
the server's input schema, as built-in tools are checked against theirs (:mod:`rlkit.envs.arguments`; a call off
the schema is a failed call that never reaches the server), then forwards them exactly. What
``get_json_schema`` cannot express (nested object properties, ``$ref``, defaults, formats, numeric bounds) is
dropped from what the model reads (the check still applies it), and rlkit logs the difference once per tool.
A tool's ``Returns:`` line comes from ``_meta["rlkit/returns"]`` when the server sets it (``rlkit serve-search``
does, so its schema is the training environment's to the byte).

A call that the server marks as an error (``isError``), a transport failure or a timeout raises, so TRL and
rlkit's rollouts give the model ``{'error': ...}`` as the tool result, as for a built-in tool. Each episode
counts ``calls``, ``errors`` and ``timeouts`` in ``metrics`` and keeps every call in ``calls``.
"""

from __future__ import annotations

import inspect
import json
import keyword
import logging
import re
import types
from typing import TYPE_CHECKING, Any, Literal, Union

from rlkit.compat import TRL_NON_TOOL_METHODS
from rlkit.envs.arguments import ToolArgumentError, check, check_schema
from rlkit.errors import UserError

if TYPE_CHECKING:
    from rlkit.recipe.schema import Recipe

log = logging.getLogger("rlkit")
RETURNS_META = "rlkit/returns"  # a tool's `_meta` entry holding the schema's `return` (type, description)
_JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "null": type(None)}
_warned: set[str] = set()


class McpEnv:
    """One episode's view of the shared MCP server; its tool methods are built from the server's listing."""

    dynamic_tools = True  # the tools are known only once the server answers (rlkit.envs.recipe_tool_schemas)

    def __init__(self, server: dict[str, Any], tools: list[str] | None = None, timeout: float = 30.0) -> None:
        from rlkit.envs.mcp_client import connect

        self.connection, self.call_timeout = connect(server), timeout
        for tool in selected(self.connection.tools, tools):
            setattr(self, tool.name, types.MethodType(tool_method(tool), self))
        self.reset()

    def reset(self, **row: Any) -> None:
        self.calls: list[dict[str, Any]] = []
        self.metrics: dict[str, float] = {"calls": 0.0, "errors": 0.0, "timeouts": 0.0}

    def _call(self, name: str, arguments: dict[str, Any], schema: dict[str, Any]) -> str:
        self.metrics["calls"] += 1
        record: dict[str, Any] = {"tool": name, "arguments": arguments}
        self.calls.append(record)
        try:
            check(name, schema, arguments)
            result = self.connection.call(name, arguments, self.call_timeout)
        except ToolArgumentError as e:
            self.metrics["errors"] += 1
            record["error"] = str(e)
            raise
        except TimeoutError:
            self.metrics["timeouts"] += 1
            self.metrics["errors"] += 1
            record["error"] = f"timed out after {self.call_timeout:g}s"
            raise
        except ConnectionError as e:
            self.metrics["errors"] += 1
            record["error"] = str(e)
            raise
        text = result_text(result)
        record["content"] = text
        if result.is_error:
            self.metrics["errors"] += 1
            record["error"] = text
            raise McpToolError(text)
        return text


class McpToolError(Exception):
    """A tool result the server marked as an error; its text is the message the model reads."""


def selected(listing: list[Any], names: list[str] | None) -> list[Any]:
    """The tools to expose: all, or ``names`` in the listing's order; a UserError for a name not served."""
    served = [t.name for t in listing]
    if names is not None:
        from rlkit.registry import did_you_mean

        for name in names:
            if name not in served:
                raise UserError(f"env.tools: the MCP server has no tool {name!r}{did_you_mean(name, served)}; "
                                f"it serves: {', '.join(served) or 'none'}")
    chosen = [t for t in listing if names is None or t.name in names]
    for tool in chosen:
        if tool.name.startswith("_") or tool.name in TRL_NON_TOOL_METHODS or not tool.name.isprintable():
            raise UserError(f"env.tools: the MCP tool {tool.name!r} cannot be a TRL tool method (a leading `_`, "
                            f"or {' / '.join(TRL_NON_TOOL_METHODS)}); list the others in env.tools")
    return chosen


def tool_method(tool: Any) -> types.FunctionType:
    """A function for ``tool`` whose ``get_json_schema`` is the tool's schema (as far as it can express it)."""
    schema = tool.input_schema or {}
    properties: dict[str, dict] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    check_schema(tool.name, schema)
    for name in properties:
        if not name.isidentifier() or keyword.iskeyword(name) or name == "self":
            raise UserError(f"env.tools: the MCP tool {tool.name!r} has an argument {name!r} that cannot be a Python "
                            "parameter, so TRL cannot offer it; leave the tool out with env.tools")

    def call(self: McpEnv, **arguments: Any) -> str:
        return self._call(tool.name, arguments, schema)

    hints = {name: python_type(properties[name]) for name in properties}
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    # Keyword-only, so required and optional ones keep the schema's order (it is the order the model reads).
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[name],
                                 default=inspect.Parameter.empty if name in required else None) for name in properties]
    call.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    call.__annotations__ = dict(hints)
    returns = (tool.meta or {}).get(RETURNS_META) if getattr(tool, "meta", None) else None
    if returns:
        call.__annotations__["return"] = python_type(returns)
    call.__name__ = call.__qualname__ = tool.name
    call.__doc__ = docstring(tool, properties, returns)
    _check_schema(tool, call)
    return call


def python_type(schema: dict[str, Any]) -> Any:
    """The type hint ``get_json_schema`` turns back into ``schema``'s type (``Any`` where it has none)."""
    if "enum" in schema and all(isinstance(v, (str, int, float, bool)) for v in schema["enum"]) and schema["enum"]:
        return Literal[tuple(schema["enum"])]
    kind = schema.get("type")
    if isinstance(kind, list):
        hints = [python_type({**schema, "type": k}) for k in kind]
        return Union[tuple(hints)] if len(hints) > 1 else hints[0]  # noqa: UP007 (built from a list)
    if "anyOf" in schema or "oneOf" in schema:
        hints = [python_type(s) for s in schema.get("anyOf") or schema.get("oneOf")]
        return Union[tuple(hints)] if len(hints) > 1 else hints[0]  # noqa: UP007
    if kind == "array":
        return list[python_type(schema["items"])] if isinstance(schema.get("items"), dict) else list
    if kind == "object":
        extra = schema.get("additionalProperties")
        return dict[str, python_type(extra)] if isinstance(extra, dict) else dict
    return _JSON_TYPES.get(kind, Any)


def docstring(tool: Any, properties: dict[str, dict], returns: dict | None) -> str:
    """The tool's description, an ``Args:`` line per property (and ``Returns:``), as get_json_schema reads them."""
    # A description with its own Args:/Returns: sections would be read as ours: keep the part before them.
    # cleandoc: servers built from Python functions send the raw docstring, indentation and all.
    text = inspect.cleandoc(tool.description or tool.title or tool.name)
    description = re.split(r"\n\s*(?:Args|Returns|Raises):", text)[0].strip()
    lines = [description, ""]
    if properties:
        lines.append("Args:")
        for name, prop in properties.items():
            text = " ".join(str(prop.get("description") or prop.get("title") or name).split())
            lines.append(f"    {name}: {text}")
    if returns and returns.get("description"):
        lines += ["", "Returns:", f"    {' '.join(str(returns['description']).split())}"]
    return "\n".join(lines)


def _check_schema(tool: Any, func: Any) -> None:
    """Log once per tool what of its input schema the model will not see (get_json_schema's limits)."""
    from transformers.utils import get_json_schema

    shown = get_json_schema(func)["function"]
    # Titles (pydantic writes one on every property) are not for the model: leave them out of the comparison.
    want = {k: v for k, v in _untitled(tool.input_schema or {}).items() if k in ("type", "properties", "required")}
    want.setdefault("type", "object")
    if not want.get("required"):
        want.pop("required", None)
    got = dict(shown["parameters"])
    if got != want and tool.name not in _warned:
        _warned.add(tool.name)
        log.warning("MCP tool %r: the chat template shows %s instead of the server's input schema %s "
                    "(transformers' get_json_schema cannot express the rest)", tool.name, json.dumps(got),
                    json.dumps(tool.input_schema))


def _untitled(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _untitled(v) for k, v in schema.items() if not (k == "title" and isinstance(v, str))}
    return [_untitled(v) for v in schema] if isinstance(schema, list) else schema


def result_text(result: Any) -> str:
    """The tool result as the model reads it: its text blocks joined by newlines (other blocks described)."""
    parts = []
    for block in result.content or []:
        if getattr(block, "type", None) == "text":
            parts.append(block.text)
        else:
            kind = getattr(block, "mime_type", None) or getattr(block, "uri", None) or ""
            parts.append(f"[{block.type}{': ' + str(kind) if kind else ''}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


def factory_kwargs(recipe: Recipe) -> dict[str, Any]:
    """The server (started here, so a server that cannot start fails before any model loads), tools, timeout."""
    from rlkit.envs.mcp_client import connect

    env = recipe.env
    server = env.server.model_dump(exclude_none=True)
    for tool in selected(connect(server).tools, env.tools):
        tool_method(tool)  # a tool TRL cannot take fails here, and what the model will not see is logged once
    return {"server": server, "tools": env.tools, "timeout": env.timeout}
