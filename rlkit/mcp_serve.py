"""``rlkit serve-search RECIPE``: the recipe's search tool as an MCP server (the official ``mcp`` SDK).

The tool is the training environment's own: the server builds the ``retrieval`` environment exactly as
training does (the ``retrieval:`` section's corpus, chunking, method and ``top_k``, the cached index, and
the task's tool description) and serves its ``search`` method. The MCP tool's name, description and input
schema are ``transformers.utils.get_json_schema`` of that method, the JSON the chat template shows the
model in training, and a call returns the text the method returns. Its arguments are checked against that
schema first, by the same code as in training (:mod:`rlkit.envs.arguments`): a wrong type, a missing or unknown
argument or an oversized query, like an empty query, is an MCP tool error (``isError``) carrying one line for the
model (``query must be a string, not an integer``), never a traceback or a protocol error; an MCP client such as
``env: {name: mcp}`` turns it back into the ``{'error': ...}`` text TRL gives the model. So an agent evaluated
through MCP sees what it was trained on.

stdio by default (an MCP client launches the command); ``--http HOST:PORT`` serves streamable HTTP at
``http://HOST:PORT/mcp``. Logs go to stderr: stdout is the protocol's in stdio mode.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from pathlib import Path
from typing import Any

from rlkit.errors import UserError

log = logging.getLogger("rlkit")
HTTP_PATH = "/mcp"


def search_env(recipe: Any) -> Any:
    """The ``retrieval`` environment as training builds it for ``recipe`` (what the server serves)."""
    from rlkit.data import env_presets
    from rlkit.envs import check_env_args
    from rlkit.envs.retrieval import RetrievalEnv, factory_kwargs

    args = dict(recipe.env.args) if recipe.env is not None and recipe.env.name == "retrieval" else {}
    check_env_args("retrieval", args)
    kwargs = {**env_presets(recipe.data.task, "retrieval"), **args, **factory_kwargs(recipe)}
    return RetrievalEnv(**kwargs)


def tool_of(env: Any) -> dict[str, Any]:
    """The ``search`` tool's schema as the chat template shows it in training (OpenAI ``function`` form)."""
    from transformers.utils import get_json_schema

    return get_json_schema(env.search)["function"]


def build_server(env: Any) -> Any:
    """A low-level MCP ``Server`` with one tool, ``search``, backed by ``env.search``."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server

    from rlkit.envs.mcp import RETURNS_META

    spec = tool_of(env)
    # `return` is part of what the chat template shows; MCP has no field for it, so it travels in `_meta`.
    meta = {RETURNS_META: spec["return"]} if "return" in spec else None
    tool = types.Tool(name=spec["name"], description=spec["description"], input_schema=spec["parameters"], meta=meta)
    lock = threading.Lock()  # one search at a time through the shared environment

    def search(arguments: dict[str, Any]) -> str:
        with lock:
            env.reset()  # each call stands alone: the server keeps no episode
            return env.search(**arguments)

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name != tool.name:
            return _error(f"Tool {params.name} not found; available tools: {tool.name}")
        try:
            text = await anyio.to_thread.run_sync(search, dict(params.arguments or {}))
        except ValueError as e:  # arguments off the schema, an empty query: the model's mistake, told back
            return _error(str(e))
        return types.CallToolResult(content=[types.TextContent(text=text)])

    return Server("rlkit-search", version=_version(), instructions=spec["description"],
                  on_list_tools=list_tools, on_call_tool=call_tool)


def _error(message: str) -> Any:
    import mcp_types as types

    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


def _version() -> str:
    from importlib.metadata import version

    return version("rlkit")


def parse_http(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as ``(host, port)``; a UserError for anything else."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--http {value!r}: give HOST:PORT, e.g. 127.0.0.1:8765")
    return host, int(port)


def serve(recipe_path: str | Path, overrides: list[str], *, smoke: bool = False, http: str | None = None) -> None:
    """Build (or load) the recipe's index, then serve ``search`` over stdio or streamable HTTP until stopped."""
    from rlkit.envs.mcp_client import require_sdk
    from rlkit.recipe import load_recipe

    require_sdk("rlkit serve-search")
    address = parse_http(http) if http else None
    recipe = load_recipe(recipe_path, overrides, smoke=smoke)
    if recipe.retrieval is None:
        raise UserError(f"{recipe_path}: no `retrieval:` section, so there is no index to serve; add one "
                        "(`corpus:` a file or Hub id, or `synthetic:` an article count)")
    with contextlib.redirect_stdout(sys.stderr):  # index building must not write on the protocol's stream
        env = search_env(recipe)
    server = build_server(env)
    log.info("serving `search` over %d passages (%s, top %d) %s", len(env.retriever), recipe.retrieval.method,
             env.top_k, f"at http://{address[0]}:{address[1]}{HTTP_PATH}" if address else "on stdio")
    import anyio

    if address is None:
        anyio.run(_serve_stdio, server)
    else:
        _serve_http(server, *address)


async def _serve_stdio(server: Any) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def _serve_http(server: Any, host: str, port: int) -> None:
    import uvicorn

    app = server.streamable_http_app(streamable_http_path=HTTP_PATH, host=host)
    uvicorn.run(app, host=host, port=port, log_level="warning")
