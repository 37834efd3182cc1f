"""One MCP server per process, shared by every episode: an ``mcp`` SDK ``Client`` on a background event loop.

:func:`connect` starts the recipe's server (a command over stdio, or a streamable-HTTP URL) the first time a
process needs it and returns the same :class:`Connection` afterwards. The client lives in one task of a
daemon thread's event loop (the SDK's transports are async context managers that must be entered and left
in one task); synchronous tool methods submit their calls to that loop and wait with a timeout.

No server outlives rlkit:

- a normal exit, an exception or Ctrl-C: ``atexit`` closes every connection, and the SDK's stdio transport
  closes the server's stdin, waits, then kills its process group;
- a hard kill of rlkit (SIGKILL, the OOM killer): a command is started through :mod:`rlkit.envs.mcp_guard`,
  which asks Linux to signal it when rlkit's connection thread dies and then kills the server's whole
  process group (the server's stdin also reaches end-of-file, which ends any well-behaved stdio server).
"""

from __future__ import annotations

import asyncio
import atexit
import builtins
import json
import os
import sys
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from rlkit.errors import UserError

# anyio's task groups raise exception groups (Python >= 3.11 has them built in).
_GROUPS: tuple[type[BaseException], ...] = tuple(filter(None, [getattr(builtins, "BaseExceptionGroup", None)]))
_CONNECTIONS: dict[str, Connection] = {}
_LOCK = threading.Lock()


class Connection:
    """A connected MCP client; ``tools`` is the server's tool listing (``mcp_types.Tool``, every page)."""

    def __init__(self, server: dict[str, Any], startup_timeout: float) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rlkit-mcp", daemon=True)
        self._thread.start()
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Future | None = None
        self.client: Any = None
        try:
            self.tools = asyncio.run_coroutine_threadsafe(self._open(), self.loop).result(startup_timeout)
        except FutureTimeout:
            self.close()
            raise UserError(f"env.server: {describe_server(server)} did not answer within {startup_timeout:g}s "
                            "(env.server.startup_timeout)") from None
        except BaseException as e:
            self.close()
            if isinstance(e, (OSError, ConnectionError, *_GROUPS, _mcp_error())) or _http_error(e):
                where = "" if server.get("url") else " (its stderr is above)"
                raise UserError(f"env.server: cannot start {describe_server(server)}: {_first_line(e)}{where}") \
                    from None
            raise

    async def _open(self) -> list[Any]:
        self._stop = asyncio.Event()
        ready: asyncio.Future = self.loop.create_future()
        self._task = asyncio.ensure_future(self._hold(ready))
        return await ready

    async def _hold(self, ready: asyncio.Future) -> None:
        try:
            from mcp import Client

            async with Client(_target(self.server)) as client:
                tools, cursor = [], None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools += page.tools
                    if not (cursor := page.next_cursor):
                        break
                self.client = client
                ready.set_result(tools)
                await self._stop.wait()
        except BaseException as e:
            if ready.done():
                raise
            ready.set_exception(e)

    def call(self, name: str, arguments: dict[str, Any], timeout: float) -> Any:
        """``tools/call`` on the server; a ``TimeoutError`` after ``timeout`` seconds (the request is cancelled)."""
        if self.client is None:
            raise ConnectionError(f"the MCP server {describe_server(self.server)} is closed")
        future = asyncio.run_coroutine_threadsafe(self.client.call_tool(name, arguments), self.loop)
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise TimeoutError(f"timed out after {timeout:g}s") from None

    def close(self) -> None:
        """Stop the server (the SDK's shutdown sequence) and the loop thread; idempotent."""
        if not self._thread.is_alive():
            return
        if self._stop is not None and self._task is not None:
            async def finish() -> None:
                self._stop.set()
                await asyncio.wait([self._task], timeout=10)

            asyncio.run_coroutine_threadsafe(finish(), self.loop).result(15)
        self.client = None
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


def require_sdk(what: str) -> None:
    """A UserError naming the extra to install when the ``mcp`` SDK is missing."""
    import importlib.util

    if importlib.util.find_spec("mcp") is None:
        raise UserError(f"{what} needs the MCP SDK: pip install 'rlkit[mcp]'")


def connect(server: dict[str, Any]) -> Connection:
    """The process's connection to ``server`` (an ``env.server`` section as a dict), started on first use."""
    require_sdk("env mcp")
    key = json.dumps(server, sort_keys=True)
    with _LOCK:
        if key not in _CONNECTIONS:
            _CONNECTIONS[key] = Connection(server, float(server.get("startup_timeout") or 60))
        return _CONNECTIONS[key]


@atexit.register
def close_all() -> None:
    """Stop every server this process started (at exit, and in tests)."""
    with _LOCK:
        connections = list(_CONNECTIONS.values())
        _CONNECTIONS.clear()
    for connection in connections:
        connection.close()


def describe_server(server: dict[str, Any]) -> str:
    if server.get("url"):
        return f"the MCP server at {server['url']}"
    return "the MCP server `" + " ".join([server["command"], *server.get("args", [])]) + "`"


def _target(server: dict[str, Any]) -> Any:
    """What ``mcp.Client`` connects to: the URL, or the command started through :mod:`rlkit.envs.mcp_guard`."""
    if server.get("url"):
        return server["url"]
    from mcp import StdioServerParameters

    from rlkit.envs import mcp_guard as guard

    command, args, env = server["command"], list(server.get("args", [])), server.get("env") or None
    if sys.platform.startswith("linux"):  # the guard needs prctl; elsewhere atexit and stdin EOF stop the server
        # Isolated mode, by file: the guard is standard library only and must not see the server's environment.
        command, args = sys.executable, ["-I", guard.__file__, str(os.getpid()), command, *args]
    return StdioServerParameters(command=command, args=args, env=env, cwd=server.get("cwd"))


def _mcp_error() -> type[Exception]:
    from mcp import MCPError

    return MCPError


def _http_error(e: BaseException) -> bool:
    import httpx2

    return isinstance(e, httpx2.HTTPError)


def _first_line(e: BaseException) -> str:
    while isinstance(e, _GROUPS) and e.exceptions:
        e = e.exceptions[0]
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
