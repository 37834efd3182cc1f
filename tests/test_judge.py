"""The `judge` and `rank` rewards against a scripted OpenAI-compatible server on localhost (real HTTP):
verdicts, grades and group ranks; the cache; malformed replies, timeouts, a dead server; the doctor's
preflight; and a 2-step GRPO run trained against the judge from YAML and an environment variable."""

from __future__ import annotations

import json
import math
import re
import threading
import time

import pytest

from rlkit.errors import UserError
from rlkit.rewards import resolve_reward
from tests.scripted_server import ScriptedServer

MODEL = "scripted-judge"


def judged(body: dict) -> str:
    """The scripted judge: right when the response's last `#### N` (or bare answer) equals the reference."""
    text = body["messages"][-1]["content"]
    reference = re.search(r"Reference answer: (.*)", text).group(1).split(" (also accepted: ")
    accepted = {reference[0].strip(), *(reference[1].rstrip(")").split("; ") if len(reference) > 1 else [])}
    response = text.split("Response:\n", 1)[1].rsplit("\n\nIs the response", 1)[0].rsplit("\n\nHow right", 1)[0]
    answers = re.findall(r"####\s*(\S+)", response) or re.findall(r"<answer>(.*?)</answer>", response) or [
        response.strip()]
    return "VERDICT: CORRECT" if answers[-1] in accepted else "VERDICT: INCORRECT"


def graded(body: dict) -> dict:
    """Right: 1; otherwise a little credit for digits, so a random model's completions differ."""
    if judged(body).endswith(" CORRECT"):
        return {"content": "SCORE: 1"}
    response = body["messages"][-1]["content"].split("Response:\n", 1)[1].rsplit("\n\nHow right", 1)[0]
    share = sum(ch.isdigit() for ch in response) / max(len(response), 1)
    return {"content": f"Mostly wrong.\nSCORE: {round(0.5 * share, 3)}"}


def args(server: ScriptedServer, tmp_path, **more) -> dict:
    return {"endpoint": server.url, "model": MODEL, "cache": str(tmp_path / "judge-cache.jsonl"),
            "timeout": 5.0, "max_retries": 2, **more}


def call(reward, completions, answers, **columns):
    return reward(prompts=[[{"role": "user", "content": f"Question {i}?"}] for i in range(len(completions))],
                  completions=completions, answer=answers, **columns)


def test_judge_verdicts_aliases_cache_and_metrics(tmp_path):
    with ScriptedServer(lambda body: {"content": "Reasoning...\n" + judged(body)}, model=MODEL) as server:
        reward = resolve_reward("judge", args(server, tmp_path, concurrency=3))
        logged: list[tuple[str, float]] = []
        texts = ["2 + 2 = 4\n#### 4", "#### 5", "<answer>four</answer>", "I give up"]
        values = call(reward, texts, ["4", "4", "4", "4"], aliases=[None, None, ["four", "IV"], None],
                      log_metric=lambda k, v: logged.append((k, v)))
        assert values == [1.0, 0.0, 1.0, 0.0]
        assert len(server.requests) == 4 and all(r["temperature"] == 0.0 for r in server.requests)
        (alias,) = [r for r in server.requests if "also accepted" in r["messages"][0]["content"]]
        assert "Reference answer: 4 (also accepted: four; IV)" in alias["messages"][0]["content"]
        metrics = dict(logged)
        assert metrics["judge/requests"] == 4 and metrics["judge/cache_hits"] == 0 and metrics["judge/failures"] == 0
        assert 0 < metrics["judge/latency_s"] < 5
        # A rerun (a new process reads the same file) costs nothing: every answer comes from the cache.
        from rlkit.rewards import judge_client

        judge_client._LOADED.clear()
        logged.clear()
        assert call(reward, texts, ["4"] * 4, aliases=[None, None, ["four", "IV"], None],
                    log_metric=lambda k, v: logged.append((k, v))) == values
        assert len(server.requests) == 4 and dict(logged)["judge/cache_hits"] == 4
        cache = tmp_path / "judge-cache.jsonl"
        assert len(cache.read_text().splitlines()) == 4
        # A run killed mid-line leaves a torn last line: it is skipped, and the next answers start a fresh line.
        cache.write_text(cache.read_text() + '{"key": "torn')
        judge_client._LOADED.clear()
        assert call(reward, ["#### 9"], ["9"]) == [1.0] and len(server.requests) == 5
        judge_client._LOADED.clear()
        assert call(reward, ["#### 9"], ["9"]) == [1.0] and len(server.requests) == 5
        assert len(cache.read_text().splitlines()) == 6


def test_graded_judge_and_a_replaced_rubric(tmp_path):
    with ScriptedServer(graded, model=MODEL) as server:
        reward = resolve_reward("judge", args(server, tmp_path, graded=True))
        values = call(reward, ["#### 7", "12 apples, 3 left", "no"], ["7", "9", "9"])
        assert values[0] == 1.0 and values[1] == pytest.approx(0.5 * 3 / 17, abs=1e-3) and values[2] == 0.0
    rubric = "Q: {question}\nGold: {reference}\nSaid: {completion}\nVERDICT?"
    with ScriptedServer(lambda body: {"content": "VERDICT: CORRECT"}, model=MODEL) as server:
        reward = resolve_reward("judge", args(server, tmp_path, rubric=rubric))
        assert call(reward, ["#### 3"], ["3"]) == [1.0]
        assert server.requests[0]["messages"][0]["content"] == "Q: Question 0?\nGold: 3\nSaid: #### 3\nVERDICT?"
    with pytest.raises(UserError, match=r"rubric: cannot fill it.*\{question\}, \{reference\}, \{completion\}"):
        resolve_reward("judge", {"endpoint": "http://localhost:1/v1", "model": MODEL, "rubric": "{gold}"})


def test_malformed_replies_are_retried_then_stop_or_skip_as_the_recipe_says(tmp_path):
    replies = iter(["I think it's fine", "VERDICT: CORRECT"])
    with ScriptedServer(lambda body: {"content": next(replies)}, model=MODEL) as server:
        logged: list = []
        reward = resolve_reward("judge", args(server, tmp_path))
        assert call(reward, ["#### 1"], ["1"], log_metric=lambda k, v: logged.append((k, v))) == [1.0]
        assert len(server.requests) == 2 and dict(logged)["judge/retries"] == 1
    with ScriptedServer(lambda body: {"content": "Looks right to me."}, model=MODEL) as server:
        stop = resolve_reward("judge", args(server, tmp_path, max_retries=1, cache=False))
        with pytest.raises(UserError, match=r"1 of 1 judge requests .* failed after 1 retries \(last: malformed reply: "
                                            r"no 'VERDICT: CORRECT/INCORRECT' line.*stopped rather than pay"):
            call(stop, ["#### 1"], ["1"])
        assert len(server.requests) == 2
    with ScriptedServer(lambda body: {"content": "VERDICT: CORRECT" if "#### 1" in body["messages"][0]["content"]
                                      else "hmm"}, model=MODEL) as server:
        skip = resolve_reward("judge", args(server, tmp_path, max_retries=1, on_failure="skip"))
        assert call(skip, ["#### 1", "#### 2"], ["1", "2"]) == [1.0, None]  # unscored, never paid 0
        assert len(server.requests) == 2  # "#### 1" was cached by the first server; "#### 2" tried twice
        stop = resolve_reward("judge", args(server, tmp_path, max_retries=0, cache=False))
        with pytest.raises(UserError, match=r"1 of 2 judge requests"):
            call(stop, ["#### 1", "#### 2"], ["1", "2"])


def test_a_body_that_is_not_a_chat_completion_is_retried_as_malformed_then_stops(tmp_path):
    """An HTML error page (the client hands back its raw text) and broken JSON under a JSON content type (the client
    raises JSONDecodeError) count as malformed replies: retried, then the one-line stop, never a traceback."""
    bodies = iter([{"raw": "<html>502 Bad Gateway</html>"}, {"raw": "{not json", "content_type": "application/json"},
                   {"content": "VERDICT: CORRECT"}])
    with ScriptedServer(lambda body: next(bodies), model=MODEL) as server:
        logged: list = []
        reward = resolve_reward("judge", args(server, tmp_path, cache=False))
        assert call(reward, ["#### 1"], ["1"], log_metric=lambda k, v: logged.append((k, v))) == [1.0]
        assert len(server.requests) == 3 and dict(logged)["judge/retries"] == 2
    with ScriptedServer(lambda body: {"raw": "<html>502 Bad Gateway</html>"}, model=MODEL) as server:
        reward = resolve_reward("judge", args(server, tmp_path, max_retries=1, cache=False))
        with pytest.raises(UserError, match=r"failed after 1 retries \(last: malformed reply: not a chat completion: "
                                            r"<html>502 Bad Gateway</html>\)"):
            call(reward, ["#### 1"], ["1"])
        assert len(server.requests) == 2


def test_a_judge_past_its_deadline_is_retried_then_stops(tmp_path):
    with ScriptedServer(lambda body: {"sleep": 2.0, "content": "VERDICT: CORRECT"}, model=MODEL) as server:
        reward = resolve_reward("judge", args(server, tmp_path, timeout=0.2, max_retries=1))
        started = time.perf_counter()
        with pytest.raises(UserError, match=r"failed after 1 retries \(last: no complete reply within 0.2s\)"):
            call(reward, ["#### 1"], ["1"])
        assert time.perf_counter() - started < 3.5  # two deadlines and a backoff, not the server's 2 s each (4 s)
        # a server that trickles its answer byte by byte is cut off by the same total deadline
    with ScriptedServer(lambda body: {"trickle": 0.05, "content": "VERDICT: CORRECT"}, model=MODEL) as server:
        reward = resolve_reward("judge", args(server, tmp_path, timeout=0.5, max_retries=0))
        with pytest.raises(UserError, match="no complete reply within 0.5s"):
            call(reward, ["#### 1"], ["1"])


def test_a_server_that_dies_mid_run_stops_the_run_and_fails_the_preflight(tmp_path):
    from rlkit.rewards.judge import settings_of
    from rlkit.rewards.judge_client import preflight

    server = ScriptedServer(lambda body: {"content": judged(body)}, model=MODEL).__enter__()
    reward = resolve_reward("judge", args(server, tmp_path, max_retries=1))
    assert call(reward, ["#### 1"], ["1"]) == [1.0]
    preflight(settings_of(args(server, tmp_path)))
    server.__exit__(None, None, None)
    with pytest.raises(UserError, match=r"failed after 1 retries \(last: APIConnectionError"):
        call(reward, ["#### 2"], ["2"])
    with pytest.raises(UserError, match=f"judge {re.escape(server.url)} .* cannot be reached: APIConnectionError"):
        preflight(settings_of(args(server, tmp_path)))


def test_a_wrong_model_or_missing_key_stops_at_once(tmp_path, monkeypatch):
    with ScriptedServer(lambda body: {"content": "VERDICT: CORRECT"}, model=MODEL) as server:
        reward = resolve_reward("judge", {**args(server, tmp_path), "model": "other-judge"})
        with pytest.raises(UserError, match="NotFoundError.*check endpoint, model and the key"):
            call(reward, ["#### 1", "#### 2"], ["1", "2"])
        assert len(server.requests) == 0  # the 404 is not retried (the scripted server, like vLLM, refuses it)
        monkeypatch.delenv("MY_JUDGE_KEY", raising=False)
        keyed = resolve_reward("judge", args(server, tmp_path, api_key_env="MY_JUDGE_KEY"))
        with pytest.raises(UserError, match="environment variable MY_JUDGE_KEY"):
            call(keyed, ["#### 1"], ["1"])
        monkeypatch.setenv("MY_JUDGE_KEY", "sk-test-123")
        assert call(keyed, ["#### 1"], ["1"]) == [1.0]
        assert server.headers[-1]["authorization"] == "Bearer sk-test-123"


def test_concurrency_is_bounded(tmp_path):
    lock, state = threading.Lock(), {"now": 0, "most": 0}

    def slow(body):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.2)
        with lock:
            state["now"] -= 1
        return {"content": judged(body)}

    with ScriptedServer(slow, model=MODEL) as server:
        reward = resolve_reward("judge", args(server, tmp_path, concurrency=3, cache=False))
        assert call(reward, [f"#### {i}" for i in range(9)], [str(i) for i in range(9)]) == [1.0] * 9
    assert state["most"] == 3


def test_rank_scores_each_group_relative_to_itself(tmp_path):
    def ranker(body):
        text = body["messages"][0]["content"]
        n = len(re.findall(r"^Response \d+:", text, re.MULTILINE))
        if "bad reply" in text and not ranker.retried:
            ranker.retried = True
            return {"content": '{"scores": [0.5]}'}  # the wrong count: retried
        scores = [len(r) / 100 for r in re.findall(r"Response \d+:\n(.*)", text)][:n]
        return {"content": "```json\n" + json.dumps({"scores": scores}) + "\n```"}

    ranker.retried = False
    with ScriptedServer(ranker, model=MODEL) as server:
        reward = resolve_reward("rank", args(server, tmp_path))
        prompts = [[{"role": "user", "content": "A"}]] * 3 + [[{"role": "user", "content": "B"}]] * 2 + [
            [{"role": "user", "content": "C"}]]
        completions = ["x" * 10, "x" * 30, "x" * 20, "bad reply", "bad reply, longer", "alone"]
        values = reward(prompts=prompts, completions=completions)
        assert values[:5] == pytest.approx([0.0, 1.0, 0.5, 0.0, 1.0])
        assert values[5] is None  # one completion: nothing to rank it against
        assert len(server.requests) == 3 and ranker.retried  # one request per group, plus the retry


@pytest.fixture
def judge_recipe(tmp_path):
    def write(server_url: str, more_args: str = "", more_rewards: str = "") -> str:
        path = tmp_path / "judge_grpo.yaml"
        path.write_text(f"""
name: judge_grpo
algorithm: grpo
model: {{name_or_path: rlkit/tiny-qwen3, backend: hf, dtype: float32, max_seq_length: 256}}
lora: {{r: 8, alpha: 16, target_modules: all-linear}}
data:
  task: gsm8k
  train: {{synthetic: 16, seed: 1, generator: {{max_value: 9, max_steps: 1}}}}
rewards:
  - name: judge
    args: {{endpoint: "{server_url}", model: {MODEL}, api_key_env: TEST_JUDGE_KEY, graded: true,
            cache: "{tmp_path / 'cache.jsonl'}"{more_args}}}
{more_rewards}
trainer: {{learning_rate: 1.0e-2, max_steps: 2, num_generations: 4, per_device_train_batch_size: 8,
          max_completion_length: 16, temperature: 1.0, logging_steps: 1, save_steps: 2, seed: 0, report_to: none}}
""")
        return str(path)
    return write


def test_grpo_trains_two_steps_against_the_judge_from_yaml_and_an_environment_variable(tmp_path, judge_recipe,
                                                                                       monkeypatch):
    from rlkit.train import train

    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-secret-judge-key")
    with ScriptedServer(graded, model=MODEL) as server:
        run = train(judge_recipe(server.url), output_dir=tmp_path / "run")
    assert server.preflights and server.requests  # the doctor's preflight, then the card and training
    assert all(h["authorization"] == "Bearer sk-secret-judge-key" for h in server.headers)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rewards/judge/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["judge/requests"] + r["judge/cache_hits"] == 8 and r["judge/failures"] == 0 for r in steps)
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    resolved = (run / "recipe.resolved.yaml").read_text()
    assert "TEST_JUDGE_KEY" in resolved
    assert not [p for p in run.rglob("*") if p.is_file() and b"sk-secret-judge-key" in p.read_bytes()]


def test_an_unreachable_judge_fails_the_pre_launch_doctor_in_one_line(tmp_path, judge_recipe, monkeypatch):
    from rlkit.doctor import run as doctor

    monkeypatch.delenv("TEST_JUDGE_KEY", raising=False)
    recipe = judge_recipe("http://127.0.0.1:9/v1")
    for evidence in ("environment variable TEST_JUDGE_KEY (api_key_env) is not set", "cannot be reached"):
        verdict = doctor(recipe, families=("rewards",), limit=2)
        assert not verdict.go
        (fail,) = [c for c in verdict.checks if c.verdict == "fail"]
        assert fail.name == "judge: endpoint" and evidence in fail.evidence and "\n" not in fail.evidence
        monkeypatch.setenv("TEST_JUDGE_KEY", "sk-x")


def test_the_doctors_reward_card_scores_the_judge_and_shows_its_rows(tmp_path, judge_recipe, monkeypatch):
    """The card puts `judge` (0/1 verdicts) next to `answer_format` through the scripted judge: the gold forms
    earn 1, and so do the probes whose last answer line is the gold (the scripted judge, like many, reads the
    last answer), which answer_format's half credit for "several answers" keeps below the gold. Under `on_failure: skip` a probe the judge cannot grade shows `-` (unscored) for the judge, and
    the weighted total counts it as 0, as RewardSet does."""
    from rlkit.doctor import run as doctor
    from rlkit.doctor.render import markdown

    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-x")

    def rewards(server, cache, **more):
        extra = "".join(f", {k}: {v}" for k, v in more.items())
        return (f"rewards=[{{name: judge, args: {{endpoint: '{server.url}', model: {MODEL}, api_key_env: "
                f"TEST_JUDGE_KEY, cache: '{tmp_path / cache}'{extra}}}}}, {{name: answer_format, weight: 0.5}}]")

    with ScriptedServer(lambda body: {"content": judged(body)}, model=MODEL) as server:
        report = doctor(judge_recipe(server.url), [rewards(server, "card.jsonl")], families=("rewards",), limit=2)
    card = {row["completion"]: row for row in report.tables["reward card"]}
    assert server.preflights and len(server.requests) == 2 * 11  # 3 gold forms + 8 probes, 2 rows, no repeats
    assert card["gold"] == {"completion": "gold", "judge": 1.0, "answer_format": 1.0, "total": 1.5}
    assert {label: row["judge"] for label, row in card.items()} == {
        "gold": 1.0, "empty": 0.0, "format only, wrong answer": 0.0, "wrong answer tag": 0.0, "several answers": 1.0,
        "question copied": 0.0, "unicode digits": 0.0, "answer in unclosed think": 1.0, "huge": 0.0}
    assert card["format only, wrong answer"]["total"] == 0.5 and card["empty"]["total"] == 0.0
    checks = {c.name: c for c in report.checks}
    assert checks["judge: endpoint"].verdict == "ok" and checks["judge"].verdict == "ok"
    # answer_format pays "several answers" half, so the total still ranks the gold first
    assert checks["weighted total"].verdict == "ok" and "the best wrong probe 1.25" in checks["weighted total"].evidence
    shown = markdown(report)
    assert "| gold | 1 | 1 | 1.5 |" in shown and "| several answers | 1 | 0.5 | 1.25 |" in shown
    assert "| format only, wrong answer | 0 | 1 | 0.5 |" in shown

    def no_verdict_for_huge(body):  # the huge probe's tail is all sevens
        return {"content": "hmm" if "7 7 7 7" in body["messages"][0]["content"] else judged(body)}

    with ScriptedServer(no_verdict_for_huge, model=MODEL) as server:
        report = doctor(judge_recipe(server.url), [rewards(server, "skip.jsonl", on_failure="skip", max_retries=0)],
                        families=("rewards",), limit=2)
    huge = next(row for row in report.tables["reward card"] if row["completion"] == "huge")
    assert math.isnan(huge["judge"]) and huge["answer_format"] == 1.0 and huge["total"] == 0.5
    assert "| huge | - | 1 | 0.5 |" in markdown(report)


def test_the_judge_works_inside_a_running_event_loop(tmp_path):
    """A notebook already runs an event loop; the reward is still a plain synchronous call."""
    import asyncio

    with ScriptedServer(lambda body: {"content": judged(body)}, model=MODEL) as server:
        reward = resolve_reward("judge", args(server, tmp_path))

        async def inside():
            return call(reward, ["#### 3", "#### 4"], ["3", "3"])

        assert asyncio.run(inside()) == [1.0, 0.0]


def test_rlkit_pairs_and_ppo_score_with_the_judge(judge_recipe, monkeypatch):
    """RewardSet (what `rlkit pairs` and PPO's rule-reward model call) pays the judge's grades."""
    from rlkit.recipe import load_recipe
    from rlkit.rewards import RewardSet

    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-x")
    with ScriptedServer(graded, model=MODEL) as server:
        rewards = RewardSet(load_recipe(judge_recipe(server.url)).rewards)
        totals, per_reward = rewards(["What is 2+5?", "What is 1+1?"], ["#### 7", "#### 3"], answer=["7", "2"])
    assert per_reward["judge"][0] == 1.0 and 0 <= per_reward["judge"][1] < 0.5 and totals == per_reward["judge"]


def test_under_skip_reward_set_pays_a_failed_judge_call_0(tmp_path, judge_recipe, monkeypatch):
    """What docs/agents.md says of `on_failure: skip` outside GRPO: RewardSet (pairs, PPO, agent trajectories, the
    doctor's probe) counts the judge's None as 0, so the total is the other rewards' alone."""
    from rlkit.recipe import load_recipe
    from rlkit.rewards import RewardSet

    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-x")
    with ScriptedServer(lambda body: {"content": "hmm" if "#### 3" in body["messages"][0]["content"]
                                      else judged(body)}, model=MODEL) as server:
        judge = (f"{{name: judge, args: {{endpoint: '{server.url}', model: {MODEL}, api_key_env: TEST_JUDGE_KEY, "
                 f"cache: false, on_failure: skip, max_retries: 0}}}}")
        recipe = load_recipe(judge_recipe(server.url), [f"rewards=[{judge}, {{name: answer_format, weight: 0.5}}]"])
        totals, per_reward = RewardSet(recipe.rewards)(["What is 2+5?", "What is 1+2?"], ["#### 7", "#### 3"],
                                                        answer=["7", "3"])
    assert per_reward == {"judge": [1.0, 0.0], "answer_format": [1.0, 1.0]} and totals == [1.5, 0.5]
    assert len(server.requests) == 2  # one try each (max_retries 0): "#### 3" got no verdict


def test_a_plain_task_eval_scores_with_the_answer_rule_and_never_asks_the_judge(tmp_path, judge_recipe, monkeypatch):
    """`rlkit eval` of a recipe whose reward is the judge: a judge that would pass everything is never called, and the
    accuracy is the gsm8k answer rule's."""
    from rlkit.evaluate import evaluate
    from rlkit.rewards.math import gsm8k_correct

    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-x")
    with ScriptedServer(lambda body: {"content": "VERDICT: CORRECT\nSCORE: 1"}, model=MODEL) as server:
        res = evaluate(judge_recipe(server.url), overrides=["data.eval={synthetic: 4, seed: 3}",
                                                            "eval.max_new_tokens=8"],
                       out=tmp_path / "eval.json", show_progress=False)
    assert server.requests == [] and server.preflights == []
    rule = gsm8k_correct([e["completion"] for e in res["examples"]], answer=[e["gold"] for e in res["examples"]])
    assert res["n"] == 4 and res["accuracy"] == sum(rule) / 4 < 1.0  # the random tiny model does not solve them


def test_garbage_text_reaches_the_judge_intact(tmp_path):
    """Braces, empty and None contents, odd gold values: the reward still asks the judge and returns floats."""
    seen = []

    def echo(body):
        seen.append(body["messages"][0]["content"])
        return {"content": "VERDICT: INCORRECT"}

    completions = ["{0} {question} }{", "", [{"role": "assistant", "content": None}], "\x00\ud7ff" * 3]
    with ScriptedServer(echo, model=MODEL) as server:
        reward = resolve_reward("judge", args(server, tmp_path, cache=False))
        assert call(reward, completions, [None, 3, "", "{x}"]) == [0.0] * 4
        ranked = resolve_reward("rank", args(server, tmp_path, cache=False, on_failure="skip", max_retries=0))
        assert ranked(prompts=["same"] * 4, completions=completions) == [None] * 4  # "VERDICT" is not JSON scores
    assert any("Response:\n{0} {question} }{\n" in text for text in seen)
    assert any("Reference answer: {x}" in text for text in seen)


# ---------------------------------------------------------------------------------------------
# A judge that misbehaves (issue 49): slow, 429 with Retry-After, 5xx, broken JSON, scores out of range


FAULTS = {  # what the judge sends instead of an answer; `always`: every try of that request fails
    "timeout": {"sleep": 12.0, "content": "SCORE: 1"},  # past the tests' 10 s deadline, generous for a loaded machine
    "rate_limited": {"status": 429, "headers": {"Retry-After": "2"}, "message": "Rate limit reached"},
    "server_error": {"status": 500},
    "rejected": {"status": 422},
    "bad_body": {"raw": "{not json", "content_type": "application/json"},
    "out_of_range": {"content": "Very good.\nSCORE: 7"},
    "malformed": {"content": "Looks fine to me."},
    "always": {"status": 503},
}


class Flaky:
    """A scripted judge answering "SCORE: 1", except that each new request (its text) is given a fault of FAULTS in
    turn for its first try (`always`: for every try). Thread-safe; keeps what it served by fault and when."""

    def __init__(self, faults=tuple(FAULTS)):
        self.faults, self.lock = faults, threading.Lock()
        self.assigned: dict[str, str | None] = {}
        self.served: dict[str, int] = dict.fromkeys(FAULTS, 0)
        self.times: dict[str, list[float]] = {}

    def __call__(self, body: dict) -> dict:
        text = body["messages"][-1]["content"]
        with self.lock:
            first = text not in self.assigned
            if first:
                self.assigned[text] = self.faults[len(self.assigned) % len(self.faults)]
            self.times.setdefault(text, []).append(time.monotonic())
            fault = self.assigned[text]
            if fault is not None and (first or fault == "always"):
                self.served[fault] += 1
                return FAULTS[fault]
        return {"content": "SCORE: 1"}

    def tries(self) -> dict[str, int]:
        """The failed tries the client should count, by its kinds (`always` is a 5xx)."""
        counts = {k: n for k, n in self.served.items() if k != "always"}
        counts["server_error"] += self.served["always"]
        return counts


def test_each_kind_of_judge_failure_is_retried_and_counted_and_a_429_waits_its_retry_after(tmp_path):
    flaky = Flaky(faults=[k for k in FAULTS if k != "always"])
    completions = [f"#### {i}" for i in range(len(flaky.faults))]
    with ScriptedServer(flaky, model=MODEL) as server:
        reward = resolve_reward("judge", args(server, tmp_path, graded=True, timeout=10.0, max_retries=2, cache=False))
        logged: list = []
        values = call(reward, completions, [str(i) for i in range(len(completions))],
                      log_metric=lambda k, v: logged.append((k, v)))
    assert values == [1.0] * len(completions)  # each fault was retried, then scored
    metrics = dict(logged)
    assert {k: metrics[f"judge/errors/{k}"] for k in flaky.faults} == dict.fromkeys(flaky.faults, 1)
    assert metrics["judge/errors/connection"] == 0 and metrics["judge/skipped"] == 0
    assert (metrics["judge/requests"], metrics["judge/retries"], metrics["judge/failures"]) == (14, 7, 0)
    limited = next(t for text, t in flaky.times.items() if flaky.assigned[text] == "rate_limited")
    assert limited[1] - limited[0] >= 2.0  # its Retry-After: 2, not the first retry's 0.5 s backoff


def test_the_cache_never_serves_a_malformed_answer(tmp_path):
    from rlkit.rewards import judge_client

    cache = tmp_path / "judge-cache.jsonl"
    completions, answers = [f"#### {i}" for i in range(4)], ["0", "1", "2", "3"]
    with ScriptedServer(lambda body: {"content": "SCORE: 0.5"}, model=MODEL) as server:
        assert call(resolve_reward("judge", args(server, tmp_path, graded=True)), completions, answers) == [0.5] * 4
    records = [json.loads(line) for line in cache.read_text().splitlines()]
    records[0] |= {"value": 7.0, "reply": "SCORE: 7"}  # a score outside [0, 1]
    records[1] |= {"value": 0.9, "reply": "no score here"}  # a reply the parser rejects, whatever the value says
    records[2] = {"key": records[2]["key"], "value": "garbage"}  # no reply to parse (an older rlkit's record)
    cache.write_text("".join(json.dumps(r) + "\n" for r in records))
    judge_client._LOADED.pop(cache, None)  # read once per process: as a new run would read it
    with ScriptedServer(lambda body: {"content": "SCORE: 1"}, model=MODEL) as server:
        assert call(resolve_reward("judge", args(server, tmp_path, graded=True)), completions, answers) == [
            1.0, 1.0, 1.0, 0.5]  # the three asked again; the sound record served
        assert len(server.requests) == 3


def _judge_table(report: str) -> dict[str, float]:
    lines = report.split("## Judge requests", 1)[1].strip().splitlines()
    header, row = (line.strip("|").split("|") for line in (lines[2], lines[4]))
    return {h.strip(): float(v) for h, v in zip(header[1:], row[1:], strict=True)}


@pytest.mark.report
@pytest.mark.timeout(1200)  # a GRPO run: minutes on a 2-core machine shared with other jobs
def test_a_grpo_run_against_a_misbehaving_judge_finishes_and_its_report_counts_each_failure(
        tmp_path, judge_recipe, monkeypatch):
    """Each new request's first try gets one of the faults in turn, and every eighth request fails every try: the
    run finishes, those completions are shown as skipped (their judge reward None, never a 0 of the judge's), the
    report counts each kind of failed try as the server served it, and nothing malformed reached the cache."""
    from rlkit.train import train

    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-x")
    flaky = Flaky()
    with ScriptedServer(flaky, model=MODEL) as server:
        recipe = judge_recipe(server.url, ", timeout: 10.0, max_retries: 2, on_failure: skip, concurrency: 8",
                              "  - {name: answer_format, weight: 0.5}")
        run = train(recipe, output_dir=tmp_path / "run", doctor=False)
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    rows = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "judge/requests" in r]
    assert [r["step"] for r in rows] == [1, 2]
    always = flaky.served["always"] // 3  # requests that failed all three tries
    assert always >= 1 and sum(r["judge/skipped"] for r in rows) == sum(r["judge/failures"] for r in rows) == always
    assert all(r["rewards/judge/mean"] == 1.0 for r in rows)  # the skipped ones are not in the mean as 0s
    table = _judge_table((run / "report.md").read_text())
    tries = flaky.tries()
    assert {k: table[f"failed tries: {k}"] for k in tries} == tries
    assert table["requests"] == len(server.requests) and table["failures"] == table["skipped"] == always
    assert table["retries"] == sum(tries.values()) - always  # every failed try is retried but a request's last
    cached = [json.loads(line) for line in (tmp_path / "cache.jsonl").read_text().splitlines()]
    assert cached and all(r["reply"] == "SCORE: 1" and r["value"] == 1.0 for r in cached)


@pytest.mark.timeout(1200)
def test_a_judge_that_fails_during_a_grpo_run_under_stop_ends_it_in_one_line(tmp_path, judge_recipe, capsys,
                                                                             monkeypatch):
    from tests.test_bad_input import run_cli

    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-x")
    with ScriptedServer(lambda body: {"status": 500}, model=MODEL) as server:
        recipe = judge_recipe(server.url, ", timeout: 10.0, max_retries: 1")
        code, err = run_cli(capsys, "train", recipe, "--no-doctor", "--output-dir", tmp_path / "run")
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"rlkit: error: judge reward: 8 of 8 judge requests to {server.url} (model '{MODEL}') failed after 1 retries "
        "(last: InternalServerError: Error code: 500 - scripted failure); failed tries: 16 server_error; stopped rather than pay those "
        "completions 0. Check the judge server, raise `timeout`/`max_retries`, or set `on_failure: skip` (None for "
        "them, which most callers count as 0: docs/agents.md)")
    assert len(server.requests) == 16 and not (tmp_path / "run").exists()  # nothing half-written left behind
