"""MCP vs in-process tools: seconds per tool call, and rollout episodes per second.

Per call: the same calls through `rlkit.envs.call_tool` (what rollouts and chat use; TRL calls the method the
same way) on the built-in environment in this process, and on `env: {name: mcp}` against
- `rlkit serve-search recipes/multihop_rag_grpo.yaml --smoke` (80 passages, BM25) over stdio and over
  streamable HTTP, for the `search` tool;
- tests/mcp_calculator.py (the SDK's MCPServer) over stdio, for `calculate`.
`CALLS` sequential calls each, after `WARMUP`; median and p90 in milliseconds.

Episodes/s: `rlkit rollout` of `EPISODES` MultiHop-RAG smoke episodes against a scripted OpenAI-compatible
teacher on localhost (one search, then an answer; concurrency 8), built-in `retrieval` env vs `env: mcp` on
serve-search over stdio; the server's start is not counted (it happens before the episodes).

    .venv/bin/python bench/mcp_tools.py
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time

from common import ROOT, machine, machine_line

sys.path.insert(0, str(ROOT))
CALLS, WARMUP, EPISODES = 300, 20, 48
MULTIHOP = ROOT / "recipes" / "multihop_rag_grpo.yaml"
CALCULATOR = ROOT / "recipes" / "gsm8k_calculator_grpo.yaml"
SERVER_ENV = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _serve(*extra: str) -> list[str]:
    return [sys.executable, "-m", "rlkit", "serve-search", str(MULTIHOP), "--smoke", *extra]


def _mcp(server: dict) -> str:
    return "env=" + json.dumps({"name": "mcp", "max_turns": 6, "server": server})


def _per_call(env, name: str, arguments: list[dict]) -> dict:
    from rlkit.envs import call_tool

    for args in arguments[:WARMUP]:
        call_tool(env, name, args)
    ms = []
    for args in arguments[:CALLS]:
        started = time.perf_counter()
        result = call_tool(env, name, args)
        ms.append((time.perf_counter() - started) * 1000)
        assert result.error is None, result.error
    ms.sort()
    return {"calls": len(ms), "median_ms": round(statistics.median(ms), 3), "p90_ms": round(ms[int(0.9 * len(ms))], 3)}


def _env(path, overrides):
    from rlkit.data import env_factory
    from rlkit.recipe import load_recipe

    return env_factory(load_recipe(path, overrides, smoke=True))()


def latency() -> list[dict]:
    from rlkit.data import multihop_rag
    from rlkit.envs.mcp_client import close_all

    queries = [{"query": q["query"]} for q in multihop_rag.generate(CALLS, seed=3).to_list()]
    queries = (queries * 2)[:CALLS + WARMUP]
    exprs = [{"expression": f"({i} + 17) * 3 / 7"} for i in range(CALLS + WARMUP)]
    rows = [{"tool": "search", "via": "in-process RetrievalEnv", **_per_call(_env(MULTIHOP, []), "search", queries)}]
    serve = _serve()
    stdio = _env(MULTIHOP, [_mcp({"command": serve[0], "args": serve[1:], "env": SERVER_ENV})])
    rows.append({"tool": "search", "via": "MCP stdio (rlkit serve-search)", **_per_call(stdio, "search", queries)})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    http = subprocess.Popen(_serve("--http", f"127.0.0.1:{port}"), env={**os.environ, **SERVER_ENV})
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        env = _env(MULTIHOP, [_mcp({"url": f"http://127.0.0.1:{port}/mcp"})])
        rows.append({"tool": "search", "via": "MCP streamable HTTP (rlkit serve-search)",
                     **_per_call(env, "search", queries)})
    finally:
        close_all()
        http.terminate()
        http.wait(10)
    rows.append({"tool": "calculate", "via": "in-process CalculatorEnv",
                 **_per_call(_env(CALCULATOR, []), "calculate", exprs)})
    calc = _env(CALCULATOR, [_mcp({"command": sys.executable, "args": [str(ROOT / "tests" / "mcp_calculator.py")],
                                   "env": {"PYTHONPATH": str(ROOT)}})])
    rows.append({"tool": "calculate", "via": "MCP stdio (SDK MCPServer)", **_per_call(calc, "calculate", exprs)})
    close_all()
    return rows


def episodes_per_second() -> list[dict]:
    import tempfile

    from rlkit.agents.rollout import rollout
    from rlkit.data import env_factory, multihop_rag
    from rlkit.envs.mcp_client import close_all
    from rlkit.recipe import load_recipe
    from tests.scripted_server import ScriptedServer
    from tests.test_agents import _reader

    queries = multihop_rag.generate(EPISODES, seed=1).to_list()
    serve = _serve()
    rows = []
    for via, extra in (("in-process retrieval env", []),
                       ("MCP stdio (rlkit serve-search)",
                        [_mcp({"command": serve[0], "args": serve[1:], "env": SERVER_ENV})])):
        overrides = [f"data.eval.synthetic={EPISODES}", *extra]
        env_factory(load_recipe(MULTIHOP, overrides, smoke=True))  # index and server up before the clock starts
        with tempfile.TemporaryDirectory() as tmp, ScriptedServer(_reader(queries)) as server:
            started = time.perf_counter()
            result = rollout(MULTIHOP, endpoint=server.url, smoke=True, out=f"{tmp}/t.jsonl", show_progress=False,
                             overrides=overrides)
            seconds = time.perf_counter() - started
        rows.append({"via": via, "episodes": result["episodes"], "seconds": round(seconds, 2),
                     "episodes_per_s": round(result["episodes"] / seconds, 2)})
    close_all()
    return rows


def figures(calls: list[dict], episodes: list[dict]) -> list[dict]:
    """The headline numbers, in the form `bench/run.py` summarises."""
    def figure(name: str, value: float, unit: str) -> dict:
        return {"figure": name, "value": value, "unit": unit, "target": None, "met": None, "note": ""}

    out = [figure(f"{r['tool']} call, {r['via']} (median)", r["median_ms"], "ms") for r in calls]
    return out + [figure(f"rollout, {r['via']}", r["episodes_per_s"], "episodes/s") for r in episodes]


def main() -> None:
    before = os.getloadavg()
    calls = latency()
    episodes = episodes_per_second()
    m = machine()
    out = {"name": "mcp_tools", "title": "MCP vs in-process tools", "machine": m, "figures": figures(calls, episodes),
           "load_before": before, "load_after": os.getloadavg(), "per_call": calls, "episodes": episodes}
    results = ROOT / "bench" / "results"
    (results / "mcp_tools.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = ["# MCP vs in-process tools", "", f"Machine: {machine_line(m)}",
             f"Load average (1, 5, 15 min) before: {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}; after: "
             f"{out['load_after'][0]:.2f}: a shared, loaded machine, not idle figures.", "",
             f"## Seconds per tool call ({CALLS} sequential calls after {WARMUP} warm-up calls)", "",
             "| tool | via | calls | median ms | p90 ms |", "|---|---|---|---|---|"]
    lines += [f"| {r['tool']} | {r['via']} | {r['calls']} | {r['median_ms']} | {r['p90_ms']} |" for r in calls]
    lines += ["", f"## Rollout: {EPISODES} MultiHop-RAG smoke episodes, scripted teacher, concurrency 8", "",
              "| via | episodes | seconds | episodes/s |", "|---|---|---|---|"]
    lines += [f"| {r['via']} | {r['episodes']} | {r['seconds']} | {r['episodes_per_s']} |" for r in episodes]
    lines += ["", "Reproduce: `.venv/bin/python bench/mcp_tools.py`.", ""]
    (results / "mcp_tools.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
