"""Endpoint rollouts that tell the truth: a total deadline, counted retries, a preflight, an honest exit status."""

import json
import time

import pytest

from rlkit.agents.endpoint import EndpointPolicy
from rlkit.agents.engine import run_episodes
from rlkit.envs.calculator import CalculatorEnv
from rlkit.recipe import recipes_dir
from tests.scripted_server import ScriptedServer
from tests.test_cli import rlkit

CALCULATOR = recipes_dir() / "gsm8k_calculator_grpo.yaml"
ROWS = [{"prompt": [{"role": "user", "content": "2 + 2?"}], "answer": "4"}]


def test_a_trickling_server_meets_the_total_deadline_and_retries_are_recorded():
    # ~300 bytes at one byte per 0.05 s: every read succeeds, the whole answer would take ~15 s.
    with ScriptedServer(lambda request: {"trickle": 0.05, "content": "#### 4"}) as server:
        policy = EndpointPolicy(server.url, api_key=None, served_model=None, max_new_tokens=8, timeout=0.6,
                                max_retries=1, backoff=0.1)
        started = time.perf_counter()
        (episode,) = run_episodes(ROWS, CalculatorEnv, policy, max_turns=1, show_progress=False)
        seconds = time.perf_counter() - started
    assert episode.error == "endpoint error: DeadlineExceeded: no complete response within 0.6s"
    assert episode.turns[0]["retries"] == 1 and len(server.requests) == 2
    assert 1.2 <= seconds < 8.0  # two attempts of 0.6 s and a 0.1 s backoff (plus a loaded machine), not 15 s


def test_a_transient_failure_is_retried_and_the_retry_counted(tmp_path):
    calls = {"n": 0}

    def flaky(request):
        calls["n"] += 1
        return {"status": 503} if calls["n"] == 1 else {"content": "#### 4"}

    with ScriptedServer(flaky) as server:
        policy = EndpointPolicy(server.url, api_key=None, served_model=None, max_new_tokens=8, backoff=0.01)
        (episode,) = run_episodes(ROWS, CalculatorEnv, policy, max_turns=1, show_progress=False)
    assert episode.error is None and episode.messages[-1]["content"] == "#### 4"
    assert [t["retries"] for t in episode.turns] == [1]

    out = tmp_path / "t.jsonl"
    with ScriptedServer(lambda request: {"content": "#### 4"}) as server:
        res = rlkit("rollout", CALCULATOR, "--smoke", "--endpoint", server.url, "--limit", "2", "--out", out)
    assert res.returncode == 0, res.stderr
    assert [json.loads(line)["retries"] for line in out.read_text().splitlines()] == [0, 0]


def test_preflight_fails_fast_on_a_dead_endpoint_or_a_wrong_model_whatever_flags(tmp_path):
    res = rlkit("rollout", CALCULATOR, "--smoke", "--endpoint", "http://127.0.0.1:9/v1", "--served-model", "m",
                "--retries", "0", "--out", tmp_path / "t.jsonl")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "the preflight request to model 'm' failed (APIConnectionError" in res.stderr
    assert not (tmp_path / "t.jsonl").exists()

    with ScriptedServer(lambda request: {"content": "#### 4"}) as server:
        res = rlkit("rollout", CALCULATOR, "--smoke", "--endpoint", server.url, "--served-model", "wrong-model",
                    "--out", tmp_path / "t.jsonl")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "NotFoundError" in res.stderr and "wrong-model" in res.stderr and "--served-model" in res.stderr
    assert server.requests == [] and not (tmp_path / "t.jsonl").exists()


def test_a_run_that_mostly_fails_on_transport_errors_exits_non_zero_with_a_summary(tmp_path):
    out = tmp_path / "t.jsonl"
    with ScriptedServer(lambda request: {"status": 502}) as server:  # the preflight passes, then the server breaks
        res = rlkit("rollout", CALCULATOR, "--smoke", "--endpoint", server.url, "--limit", "4", "--retries", "1",
                    "--out", out)
    assert res.returncode == 1, res.stderr
    assert "4 of 4 episodes failed on endpoint errors (InternalServerError: 4)" in res.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4 and all(r["retries"] == 1 for r in records)  # kept, with their retries
    assert len(server.requests) == 8


def test_the_output_directory_is_named_after_the_served_model(tmp_path):
    with ScriptedServer(lambda request: {"content": "#### 4"}, model="org/Teacher-7B") as server:
        res = rlkit("rollout", CALCULATOR, "--smoke", "--endpoint", server.url, "--limit", "1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (path,) = (tmp_path / "rollouts").rglob("trajectories.jsonl")
    assert path.parent.relative_to(tmp_path).as_posix() == "rollouts/gsm8k_calculator_grpo/Teacher-7B"


@pytest.mark.parametrize("status", [401, 403])
def test_a_bad_key_stops_at_the_preflight(status, tmp_path):
    with ScriptedServer(lambda request: {}, preflight=lambda body: {"status": status}) as server:
        res = rlkit("rollout", CALCULATOR, "--smoke", "--endpoint", server.url, "--out", tmp_path / "t.jsonl")
    assert res.returncode == 2 and "--api-key" in res.stderr and server.requests == []
