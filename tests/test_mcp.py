"""MCP both ways: `rlkit serve-search` serves a recipe's search tool, and `env: {name: mcp}` trains and rolls out
against any MCP server's tools. Real servers (rlkit's own, and a calculator written with the SDK) over stdio
and streamable HTTP, real SDK clients."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import anyio
import pytest

from rlkit.recipe import load_recipe, recipes_dir

pytest.importorskip("mcp")

ROOT = recipes_dir().parent
MULTIHOP = recipes_dir() / "multihop_rag_grpo.yaml"


def _server_env(cache) -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "RLKIT_CACHE": str(cache),
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _serve_command(*extra: str) -> list[str]:
    return [sys.executable, "-m", "rlkit", "serve-search", str(MULTIHOP), "--smoke", *extra]


def _training_env(monkeypatch, cache):
    from rlkit.mcp_serve import search_env

    monkeypatch.setenv("RLKIT_CACHE", str(cache))
    return search_env(load_recipe(MULTIHOP, [], smoke=True))


async def _list_and_call(target, queries):
    from mcp import Client

    async with Client(target) as client:
        tools = (await client.list_tools()).tools
        results = [await client.call_tool("search", {"query": q}) for q in queries]
    return tools, results


def _check(tools, results, env, queries):
    from rlkit.mcp_serve import tool_of

    expected = tool_of(env)
    assert [t.name for t in tools] == ["search"]
    assert tools[0].description == expected["description"]
    assert tools[0].input_schema == expected["parameters"]
    assert tools[0].meta == {"rlkit/returns": expected["return"]}
    for query, result in zip(queries, results, strict=True):
        if query.strip():
            env.reset()
            assert not result.is_error and result.content[0].text == env.search(query)
        else:
            assert result.is_error and result.content[0].text == "empty query; give keywords to search for"


QUERIES = ["TechCrunch October 2023", "engineers Bogota", "  "]


def test_serve_search_over_stdio_is_listed_and_called_by_an_mcp_client(tmp_path, monkeypatch):
    from mcp import StdioServerParameters

    env = _training_env(monkeypatch, tmp_path / "cache")
    command = _serve_command()
    params = StdioServerParameters(command=command[0], args=command[1:], env=_server_env(tmp_path / "cache"))
    tools, results = anyio.run(_list_and_call, params, QUERIES)
    _check(tools, results, env, QUERIES)
    assert "[1] " in results[0].content[0].text  # passages came back, not "No results."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_search_over_streamable_http(tmp_path, monkeypatch):
    env = _training_env(monkeypatch, tmp_path / "cache")
    port = _free_port()
    server = subprocess.Popen(_serve_command("--http", f"127.0.0.1:{port}"), env={**os.environ,
                              **_server_env(tmp_path / "cache")}, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.time() < deadline, server.stderr.read() if server.poll() else ""
                time.sleep(0.2)
        tools, results = anyio.run(_list_and_call, f"http://127.0.0.1:{port}/mcp", QUERIES)
    finally:
        server.terminate()
        server.wait(10)
    _check(tools, results, env, QUERIES)


def test_serve_search_refuses_bad_input_with_one_line(tmp_path):
    bad_http = subprocess.run(_serve_command("--http", "localhost"), capture_output=True, text=True,
                              env={**os.environ, **_server_env(tmp_path)})
    assert bad_http.returncode == 2
    assert bad_http.stderr.strip().splitlines()[-1] == ("rlkit: error: --http 'localhost': give HOST:PORT, "
                                                        "e.g. 127.0.0.1:8765")
    no_index = subprocess.run([sys.executable, "-m", "rlkit", "serve-search", str(recipes_dir() / "gsm8k_grpo.yaml")],
                              capture_output=True, text=True, env={**os.environ, **_server_env(tmp_path)})
    assert no_index.returncode == 2 and "no `retrieval:` section" in no_index.stderr
