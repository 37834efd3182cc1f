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


async def _list_and_call(target, calls):
    from mcp import Client

    async with Client(target) as client:
        tools = (await client.list_tools()).tools
        results = [await client.call_tool("search", arguments) for arguments in calls]
    return tools, results


def _check(tools, results, env, calls, stderr: str):
    from rlkit.mcp_serve import tool_of

    expected = tool_of(env)
    assert [t.name for t in tools] == ["search"]
    assert tools[0].description == expected["description"]
    assert tools[0].input_schema == expected["parameters"]
    assert tools[0].meta == {"rlkit/returns": expected["return"]}
    for arguments, result in zip(calls, results, strict=True):
        if arguments in BAD_CALLS:  # the tool error the model reads; the server answered, and printed no traceback
            assert result.is_error and result.content[0].text == BAD_CALLS[arguments], arguments
        else:
            env.reset()
            assert not result.is_error and result.content[0].text == env.search(**arguments)
    assert "Traceback" not in stderr and "Error" not in stderr, stderr


class Args(dict):
    """A call's arguments, hashable so that BAD_CALLS can be keyed by them."""

    def __hash__(self) -> int:
        return hash(repr(self))


# Issue 49: wrong types, missing or unknown arguments and an oversized query reached the index as Python errors
# (`AttributeError: 'int' object has no attribute 'strip'`, a traceback on the server); now each is one line.
BAD_CALLS = {
    Args(query="  "): "empty query; give keywords to search for",
    Args(query=5): "query must be a string, not an integer",
    Args(query=None): "query must be a string, not null",
    Args(query=["TechCrunch"]): "query must be a string, not an array",
    Args(): "missing argument query; search takes: query",
    Args(query="TechCrunch", top_k=50): "unknown argument 'top_k'; search takes: query",
    Args(query="TechCrunch " * 1000): "query too long (11000 characters, limit 2000)",
}
CALLS = [Args(query="TechCrunch October 2023"), *BAD_CALLS, Args(query="engineers Bogota")]


def test_serve_search_over_stdio_is_listed_and_called_by_an_mcp_client(tmp_path, monkeypatch):
    import shlex

    from mcp import StdioServerParameters

    env = _training_env(monkeypatch, tmp_path / "cache")
    log = tmp_path / "server.stderr"
    command = ["sh", "-c", f"exec {shlex.join(_serve_command())} 2>{shlex.quote(str(log))}"]
    params = StdioServerParameters(command=command[0], args=command[1:], env=_server_env(tmp_path / "cache"))
    tools, results = anyio.run(_list_and_call, params, CALLS)
    _check(tools, results, env, CALLS, log.read_text())
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
        tools, results = anyio.run(_list_and_call, f"http://127.0.0.1:{port}/mcp", CALLS)
    finally:
        server.terminate()
        server.wait(10)
    _check(tools, results, env, CALLS, server.stderr.read())


def test_serve_search_refuses_bad_input_with_one_line(tmp_path):
    bad_http = subprocess.run(_serve_command("--http", "localhost"), capture_output=True, text=True,
                              env={**os.environ, **_server_env(tmp_path)})
    assert bad_http.returncode == 2
    assert bad_http.stderr.strip().splitlines()[-1] == ("rlkit: error: --http 'localhost': give HOST:PORT, "
                                                        "e.g. 127.0.0.1:8765")
    no_index = subprocess.run([sys.executable, "-m", "rlkit", "serve-search", str(recipes_dir() / "gsm8k_grpo.yaml")],
                              capture_output=True, text=True, env={**os.environ, **_server_env(tmp_path)})
    assert no_index.returncode == 2 and "no `retrieval:` section" in no_index.stderr


CALCULATOR = recipes_dir() / "gsm8k_calculator_grpo.yaml"
CALC_SERVER = ROOT / "tests" / "mcp_calculator.py"


def _calc_env(extra: str = "", **server_env: str) -> str:
    env = {"PYTHONPATH": str(ROOT), **server_env}
    return (f"env={{name: mcp, max_turns: 2{extra}, server: {{command: {sys.executable}, args: [{CALC_SERVER}], "
            f"env: {env}}}}}".replace("'", '"'))


@pytest.fixture
def fresh_connections():
    from rlkit.envs.mcp_client import close_all

    close_all()
    yield
    close_all()


def test_mcp_tools_become_env_methods_and_failures_are_tool_text(fresh_connections):
    from transformers.utils import get_json_schema

    from rlkit.data import env_factory
    from rlkit.envs import call_tool, recipe_tool_schemas, tool_schemas
    from rlkit.envs.calculator import CalculatorEnv

    recipe = load_recipe(CALCULATOR, [_calc_env(", timeout: 1.0")], smoke=True)
    env = env_factory(recipe)()
    schemas = {s["function"]["name"]: s["function"] for s in tool_schemas(env)}
    assert list(schemas) == ["calculate", "children", "sleep"] and recipe_tool_schemas(recipe) == tool_schemas(env)
    builtin = get_json_schema(CalculatorEnv.calculate)["function"]
    assert schemas["calculate"]["parameters"] == builtin["parameters"]  # what the model reads about the argument
    assert schemas["calculate"]["description"] == builtin["description"]
    assert call_tool(env, "calculate", {"expression": "2 + 3 * 4"}).content == "14"
    refused = call_tool(env, "calculate", '{"expression": "1/0"}')
    # The server's error text (the SDK's MCPServer prefixes it), in the form TRL gives a built-in tool's exception.
    assert refused.content == "{'error': 'Error executing tool calculate: division by zero'}"
    slow = call_tool(env, "sleep", {"seconds": 3}, timeout=30.0)
    assert slow.content == "{'error': 'timed out after 1s'}" and not slow.timed_out and slow.seconds < 2.5
    assert call_tool(env, "calculate", {"expression": "6*7"}).content == "42"  # the connection still serves
    assert call_tool(env, "nope", {}).error.startswith("Tool nope not found")
    # Off the server's input schema: checked here as a built-in tool is, and never sent (issue 49).
    assert call_tool(env, "calculate", {"expression": 5}).content == "{'error': 'expression must be a string, not an " \
                                                                     "integer'}"
    assert call_tool(env, "calculate", {}).error == "missing argument expression; calculate takes: expression"
    assert env.metrics == {"calls": 6.0, "errors": 4.0, "timeouts": 1.0}
    assert [c["tool"] for c in env.calls] == ["calculate", "calculate", "sleep", "calculate", "calculate", "calculate"]
    env.reset()
    assert env.metrics["calls"] == 0 and env.calls == []
    assert env_factory(recipe)().connection is env.connection  # one server per process, shared by episodes

    only = env_factory(load_recipe(CALCULATOR, [_calc_env(", tools: [calculate]")], smoke=True))()
    assert [s["function"]["name"] for s in tool_schemas(only)] == ["calculate"]
    from rlkit.errors import UserError

    with pytest.raises(UserError, match=r"env.tools: the MCP server has no tool 'calculat' \(did you mean"):
        env_factory(load_recipe(CALCULATOR, [_calc_env(", tools: [calculat]")], smoke=True))


def test_env_mcp_recipe_errors_are_one_line(tmp_path):
    from rlkit.errors import UserError

    with pytest.raises(UserError, match="env mcp needs `server:`"):
        load_recipe(CALCULATOR, ["env={name: mcp}"], smoke=True)
    with pytest.raises(UserError, match="give exactly one of `command`"):
        load_recipe(CALCULATOR, ["env={name: mcp, server: {command: x, url: http://h/mcp}}"], smoke=True)
    with pytest.raises(UserError, match=r"`env.timeout` is for `name: mcp`"):
        load_recipe(CALCULATOR, ["env.timeout=3"], smoke=True)


_EPISODE_THEN = """
import json, os, signal, sys, time
# Ctrl-C as in a terminal even when the suite was started in the background, where the shell ignores SIGINT and
# every child inherits that (Python then leaves it ignored: the sleep below would run its 60 s).
signal.signal(signal.SIGINT, signal.default_int_handler)
from rlkit.data import env_factory
from rlkit.envs import call_tool
from rlkit.recipe import load_recipe
env = env_factory(load_recipe(sys.argv[1], [sys.argv[2]], smoke=True))()
print(json.dumps({"grandchild": int(call_tool(env, "children", {}).content)}), flush=True)
sys.stdin.readline()  # the test has found every process alive
if sys.argv[3] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)  # the test interrupts it here
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; the guard is Linux-only")
@pytest.mark.parametrize("how", ["kill", "interrupt"])
def test_no_server_process_outlives_a_killed_or_interrupted_run(tmp_path, how):
    import json
    import signal

    pid_file = tmp_path / "server.pid"
    run = subprocess.Popen([sys.executable, "-c", _EPISODE_THEN, str(CALCULATOR),
                            _calc_env(MCP_PID_FILE=str(pid_file)), how], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    grandchild = json.loads(run.stdout.readline())["grandchild"]
    server = int(pid_file.read_text())
    with open(f"/proc/{server}/stat") as f:
        guard = int(f.read().rpartition(")")[2].split()[1])
    processes = {"guard": guard, "server": server, "the server's child": grandchild}
    assert all(_alive(pid) for pid in processes.values())
    run.stdin.write("go\n")
    run.stdin.flush()
    if how == "interrupt":
        time.sleep(0.5)  # into its sleep, where Ctrl-C finds it
        run.send_signal(signal.SIGINT)  # Ctrl-C: KeyboardInterrupt, then atexit closes the connection
    # close_all waits at most 15 s + 5 s (mcp_client.Connection.close); the rest is for a loaded machine
    assert run.wait(60) == (-signal.SIGKILL if how == "kill" else -signal.SIGINT)
    deadline = time.time() + 15
    while any(_alive(pid) for pid in processes.values()) and time.time() < deadline:
        time.sleep(0.1)
    assert [name for name, pid in processes.items() if _alive(pid)] == []


def test_a_server_that_cannot_start_fails_the_doctor_with_one_line(fresh_connections):
    from rlkit.doctor import run

    override = "env={name: mcp, server: {command: rlkit-no-such-server}}"
    report = run(CALCULATOR, [override], smoke=True, families=("template",))
    check = next(c for c in report.checks if c.name == "env tools")
    assert check.verdict == "fail" and not report.go
    assert check.evidence.startswith("env.server: cannot start the MCP server `rlkit-no-such-server`: ")
    assert "\n" not in check.evidence
    good = run(CALCULATOR, [_calc_env()], smoke=True, families=("template",))
    assert [c.evidence for c in good.checks if c.name == "env tools"] == [
        "the mcp server answered: 3 tools (calculate, children, sleep)"]


def test_round_trip_the_same_episodes_through_the_retrieval_env_and_through_serve_search(tmp_path, monkeypatch,
                                                                                         fresh_connections):
    """The synthetic corpus served by `rlkit serve-search`, and the same episodes once through the built-in
    `retrieval` env and once through `env: mcp` pointed at that server: same tool schema, results and scores."""
    import json

    from rlkit.agents.rollout import rollout
    from rlkit.analyze import analyze
    from rlkit.data import multihop_rag
    from tests.scripted_server import ScriptedServer
    from tests.test_agents import _reader

    cache = tmp_path / "cache"
    monkeypatch.setenv("RLKIT_CACHE", str(cache))
    queries = multihop_rag.generate(12, seed=1).to_list()
    serve = _serve_command()
    mcp_env = json.dumps({"name": "mcp", "max_turns": 6, "server": {"command": serve[0], "args": serve[1:],
                                                                   "env": _server_env(cache)}})
    runs = {}
    for name, overrides in (("builtin", []), ("mcp", [f"env={mcp_env}"])):
        out = tmp_path / f"{name}.jsonl"
        with ScriptedServer(_reader(queries)) as server:
            rollout(MULTIHOP, endpoint=server.url, smoke=True, out=out, show_progress=False,
                    overrides=["data.eval.synthetic=12", *overrides])
        runs[name] = ([json.loads(line) for line in out.read_text().splitlines()], server.requests)
    (builtin, builtin_requests), (via_mcp, mcp_requests) = runs["builtin"], runs["mcp"]
    assert len(builtin) == len(via_mcp) == 12
    assert all(r["tools"] == builtin_requests[0]["tools"] for r in builtin_requests + mcp_requests)
    for a, b in zip(builtin, via_mcp, strict=True):
        assert _no_ids(a["messages"]) == _no_ids(b["messages"])  # the same calls and passages, byte for byte
        assert a["reward"] == b["reward"] and a["rewards"] == b["rewards"] and a["success"] == b["success"]
        for key in ("em", "f1", "accuracy"):
            assert a["metrics"].get(key) == b["metrics"].get(key)
        assert [c["content"] for c in a["tool_calls"]] == [c["content"] for c in b["tool_calls"]]
        assert b["metrics"]["calls"] == 1 and b["metrics"]["errors"] == 0
    assert all(r["tool_calls"][0]["content"].startswith("[1] ") for r in via_mcp)  # passages came back
    assert sum(r["success"] for r in via_mcp) == sum(r["success"] for r in builtin) > 0
    assert analyze(tmp_path / "mcp.jsonl")["tools"]["search"]["calls"] == 12


def _no_ids(messages):
    """Messages without tool-call ids (the scripted server numbers them in the order requests arrive)."""
    import json

    text = json.dumps(messages)
    for m in messages:
        for call in m.get("tool_calls") or []:
            text = text.replace(call["id"], "ID")
    return json.loads(text)


def test_grpo_trains_against_an_mcp_calculator(tmp_path, fresh_connections):
    """A 2-step GRPO whose only tool is the calculator served over MCP: tool results masked, LoRA changed."""
    import json

    import torch

    from rlkit.train import build_trainer
    from tests.helpers import episodes_by_mask, script_calculator
    from tests.test_agents import _golds

    recipe = load_recipe(CALCULATOR, ["trainer.max_steps=2", "trainer.learning_rate=1e-2",
                                      _calc_env(", tools: [calculate]")], smoke=True)
    trainer, tok = build_trainer(recipe, tmp_path, smoke=True)
    assert [t.__name__ for t in trainer.tools] == ["calculate"]
    batches = script_calculator(trainer, tok, _golds(32, seed=0), tool_turn="<tool_response>")
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()
    assert len(batches) == 2
    for model_text, tool_text, result in episodes_by_mask(tok, batches):
        assert model_text.startswith('<tool_call>\n{"name": "calculate"')
        assert tool_text.startswith(f"\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response>")
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "reward" in r]
    assert len(logged) == 2
    for row in logged:
        assert row["rewards/gsm8k_correct/mean"] == pytest.approx(0.5)
        assert row["tools/failure_frequency"] == 0.0
        assert row["env/calls"] == pytest.approx(1.0) and row["env/errors"] == 0.0
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before), "the LoRA did not train"


def test_eval_of_an_mcp_recipe_runs_its_episodes_against_the_server(tmp_path, fresh_connections):
    """`rlkit eval` of an env-mcp recipe (the tiny model, which never calls a tool: the plumbing, not the skill)."""
    import json
    from pathlib import Path

    from rlkit.envs.mcp_client import _CONNECTIONS
    from rlkit.evaluate import evaluate

    results = evaluate(CALCULATOR, None, limit=3, smoke=True, out=tmp_path / "eval.json",
                       overrides=[_calc_env(", tools: [calculate]")])
    assert results["n"] == 3 and results["accuracy"] is not None
    records = [json.loads(line) for line in Path(results["trajectories"]).read_text().splitlines()]
    assert len(records) == 3 and all(r["metrics"]["calls"] == 0 for r in records)  # McpEnv's metrics, recorded
    assert len(_CONNECTIONS) == 1  # the server the episodes used, started once
