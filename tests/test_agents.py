"""Tool agents end to end: GRPO with an environment, rollouts against a scripted OpenAI server and a local model."""

import json
from pathlib import Path

import pytest
import torch

from rlkit.data import gsm8k
from rlkit.recipe import load_recipe, recipes_dir
from tests.helpers import episodes_by_mask, script_calculator
from tests.scripted_server import ScriptedServer

CALCULATOR = recipes_dir() / "gsm8k_calculator_grpo.yaml"


def _golds(n, seed):
    rows = gsm8k.generate(n, seed=seed)
    return {row["question"]: gsm8k.gold(row["answer"]) for row in rows}


def test_grpo_with_calculator_masks_exactly_the_tool_result_and_rewards_reach_the_trainer(tmp_path):
    """Scripted generation: each completion calls the calculator, then answers; half the answers are right."""
    from rlkit.train import build_trainer

    recipe = load_recipe(CALCULATOR, ["trainer.max_steps=2", "trainer.learning_rate=1e-2"], smoke=True)
    trainer, tok = build_trainer(recipe, tmp_path, smoke=True)
    batches = script_calculator(trainer, tok, _golds(32, seed=0), tool_turn="<tool_response>")
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()

    assert len(batches) == 2
    for model_text, tool_text, result in episodes_by_mask(tok, batches):
        assert model_text.startswith('<tool_call>\n{"name": "calculate"')
        assert model_text.endswith(f"#### {int(result) + 0}<|im_end|>") or model_text.endswith(
            f"#### {int(result) + 1}<|im_end|>")
        # Masked: exactly the tool result block and the template glue around it, nothing the model wrote.
        assert tool_text == (f"\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n"
                             "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "reward" in r]
    assert len(logged) == 2
    for row in logged:
        assert row["rewards/gsm8k_correct/mean"] == pytest.approx(0.5)
        assert row["tools/call_frequency"] == pytest.approx(1.0)
        assert row["tools/failure_frequency"] == 0.0
        assert row["env/calls"] == pytest.approx(1.0) and row["env/errors"] == 0.0
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before), "the LoRA did not train"


MALFORMED_CALLS = [  # what a model writes, and what TRL shows it back (issue 49: no Python internals)
    ({"expression": 12}, "expression must be a string, not an integer"),
    ({"expression": None}, "expression must be a string, not null"),
    ({}, "missing argument expression; calculate takes: expression"),
    ({"expr": "1 + 1"}, "unknown argument 'expr'; calculate takes: expression"),
]


def test_grpo_malformed_tool_calls_read_as_one_line_and_earn_what_a_failed_call_earns(tmp_path):
    """Every first turn calls the calculator with arguments off its schema; the second answers (half right).
    Training goes on, TRL counts each as a failed call, and the model reads why in one line."""
    from rlkit.train import build_trainer
    from tests.helpers import script_and_capture

    recipe = load_recipe(CALCULATOR, ["trainer.max_steps=2"], smoke=True)
    trainer, tok = build_trainer(recipe, tmp_path, smoke=True)
    golds, turns = _golds(32, seed=0), {"first": 0, "second": 0}

    def scripted(prompt_ids, *args, **kwargs):
        completions = []
        for ids in prompt_ids:
            text = tok.decode(ids)
            if "<tool_response>" not in text:
                arguments = MALFORMED_CALLS[turns["first"] % len(MALFORMED_CALLS)][0]
                turns["first"] += 1
                reply = f"<tool_call>\n{json.dumps({'name': 'calculate', 'arguments': arguments})}\n</tool_call>"
            else:
                gold = next(g for q, g in golds.items() if q in text)
                turns["second"] += 1
                reply = f"#### {int(gold) + turns['second'] % 2}"
            completions.append(tok(reply + "<|im_end|>", add_special_tokens=False)["input_ids"])
        return completions, None

    batches = script_and_capture(trainer, scripted)
    trainer.train()
    shown = [result for _, _, result in episodes_by_mask(tok, batches)]
    assert len(shown) == 8 and set(shown) == {str({"error": message}) for _, message in MALFORMED_CALLS}
    logged = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "reward" in r]
    assert len(logged) == 2
    for row in logged:
        assert row["tools/call_frequency"] == pytest.approx(1.0) and row["tools/failure_frequency"] == 1.0
        assert row["rewards/gsm8k_correct/mean"] == pytest.approx(0.5)  # what the answers earn, as for any failed call
        assert row["env/calls"] == 0.0  # the calculator itself never ran


def _teacher(golds, fail=(), wrong=(), divide_by_zero=()):
    """A calculator teacher: computes the gold with the tool, then answers (or fails as told)."""

    def reply(request):
        messages = request["messages"]
        question = next(m["content"] for m in messages if m["role"] == "user")
        gold = golds[question]
        if question in fail:
            return {"status": 500}
        if messages[-1]["role"] == "user":
            expression = "1/0" if question in divide_by_zero else f"{gold} * 1"
            return {"tool_calls": [{"name": "calculate", "arguments": {"expression": expression}}]}
        answer = int(gold) + 1 if question in wrong else gold
        return {"content": f"Using the calculator.\n#### {answer}"}

    return reply


def test_rollout_against_a_scripted_openai_server(tmp_path):
    from rlkit.agents.rollout import rollout
    from rlkit.analyze import analyze

    golds = _golds(8, seed=1)  # the smoke eval split
    questions = list(golds)
    teacher = _teacher(golds, fail=questions[:1], wrong=questions[1:2], divide_by_zero=questions[2:3])
    out = tmp_path / "trajectories.jsonl"
    with ScriptedServer(teacher) as server:
        result = rollout(CALCULATOR, endpoint=server.url, api_key="sk-test-secret", concurrency=3, smoke=True,
                         out=out, sft_out=tmp_path / "sft.jsonl", show_progress=False)
    assert server.headers[0]["authorization"] == "Bearer sk-test-secret"
    assert "sk-test-secret" not in out.read_text()
    # Tools go out as the API's `tools`; the calculator's schema is there.
    assert server.requests[0]["tools"][0]["function"]["name"] == "calculate"
    assert server.requests[0]["model"] == "scripted-teacher"

    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 8 and result["episodes"] == 8
    by_question = {r["messages"][1]["content"]: r for r in records}
    failed = by_question[questions[0]]
    assert failed["error"].startswith("endpoint error: InternalServerError") and not failed["success"]
    wrong = by_question[questions[1]]
    assert wrong["error"] is None and not wrong["success"] and wrong["metrics"]["accuracy"] == 0.0
    zero = by_question[questions[2]]
    assert zero["tool_calls"][0]["error"] and "division by zero" in zero["tool_calls"][0]["content"]
    assert zero["metrics"]["errors"] == 1 and zero["metrics"]["calls"] == 1
    good = [by_question[q] for q in questions[3:]]
    for r in good:
        assert r["success"] and r["rounds"] == 2 and r["error"] is None
        assert [m["role"] for m in r["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
        assert r["tool_calls"][0]["name"] == "calculate" and r["tool_calls"][0]["error"] is None
        assert r["messages"][3]["content"] == golds[r["messages"][1]["content"]]  # the tool really ran
        assert r["rewards"]["gsm8k_correct"] == 1.0 and r["rewards"]["answer_format"] == 1.0
        assert r["reward"] == pytest.approx(1.0 + 0.2 * 1.0)
        # Usage per turn from the server: 10 prompt tokens per message sent (2, then 4 messages).
        assert [t["prompt_tokens"] for t in r["turns"]] == [20, 40]
        assert r["usage"]["prompt_tokens"] == 60
        assert r["usage"]["total_tokens"] == sum(t["total_tokens"] for t in r["turns"])
    assert result["successes"] == len(good) + 1  # the division-by-zero episode still answers right

    report = analyze(out)
    assert report["answers"]["all"]["accuracy"] == pytest.approx(6 / 8)
    sft = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert len(sft) == result["sft_rows"] == 5  # not the division by zero: its tool call failed
    assert json.loads(sft[0]["tools"])[0]["function"]["name"] == "calculate"
    assert all(row["messages"][-1]["role"] == "assistant" for row in sft)


def test_max_turns_stops_a_model_that_never_answers(tmp_path):
    from rlkit.agents.rollout import rollout

    def always_calls(request):
        return {"tool_calls": [{"name": "calculate", "arguments": {"expression": "2 + 2"}}]}

    out = tmp_path / "t.jsonl"
    with ScriptedServer(always_calls) as server:
        rollout(CALCULATOR, endpoint=server.url, smoke=True, limit=2, out=out, show_progress=False,
                overrides=["env.max_turns=3"])
    for r in map(json.loads, out.read_text().splitlines()):
        assert r["stopped_by"] == "max_turns" and not r["success"]
        assert len(r["tool_calls"]) == 3 and r["rounds"] == 4  # 3 tool rounds, the 4th turn's calls not run
    assert len(server.requests) == 2 * 4


def test_a_turn_cap_stops_each_reply_not_the_episode(tmp_path):
    """``trainer.generation_kwargs.max_new_tokens`` caps every tool turn's reply (TRL's own cap for a turn is the
    episode's whole ``max_completion_length``): the tiny model, which does not stop by itself, writes 6 tokens, not
    the smoke recipe's 160."""
    from rlkit.train import build_trainer

    recipe = load_recipe(CALCULATOR, ["trainer.max_steps=1", "trainer.generation_kwargs={max_new_tokens: 6}"],
                         smoke=True)
    trainer, _ = build_trainer(recipe, tmp_path, smoke=True)
    trainer.train()
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert trainer.args.max_completion_length == 160
    assert [row["completions/max_length"] for row in logged if "reward" in row] == [6.0]


def test_request_timeout_and_bad_tool_arguments_are_recorded_not_fatal():
    from rlkit.agents.endpoint import EndpointPolicy
    from rlkit.agents.engine import run_episodes
    from rlkit.envs.calculator import CalculatorEnv

    def reply(request):
        question = request["messages"][-1]["content"]
        if question == "slow":
            return {"sleep": 3.0, "content": "late"}
        if request["messages"][-1]["role"] == "user":
            return {"tool_calls": [{"name": "calculate", "arguments": "{not json"}]}
        return {"content": "#### 4"}

    rows = [{"prompt": [{"role": "user", "content": q}], "answer": "4"} for q in ("slow", "fast")]
    with ScriptedServer(reply) as server:
        policy = EndpointPolicy(server.url, api_key=None, served_model=None, max_new_tokens=16, timeout=2.0,
                                max_retries=0)
        slow, fast = run_episodes(rows, CalculatorEnv, policy, max_turns=2, show_progress=False)
    assert slow.error == "endpoint error: DeadlineExceeded: no complete response within 2s" and slow.done
    assert fast.error is None and fast.tool_calls[0]["error"] and fast.messages[-1]["content"] == "#### 4"


def test_parsed_turn_reads_tool_calls_like_trl(tiny_model_dir):
    from transformers import AutoTokenizer

    from rlkit.agents.turns import parsed_turn, require_response_parser

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    require_response_parser(tok)
    prompt = tok.apply_chat_template([{"role": "user", "content": "6 times 7?"}], add_generation_prompt=True,
                                     enable_thinking=False, tokenize=True, return_dict=False)
    text = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "6*7"}}\n</tool_call><|im_end|>'
    ids = tok(text, add_special_tokens=False)["input_ids"]
    turn = parsed_turn(tok, ids, prompt, cut=False, seconds=0.1)
    assert turn.finish_reason == "tool_calls"
    assert turn.message["tool_calls"][0]["function"] == {"name": "calculate", "arguments": {"expression": "6*7"}}
    assert turn.prompt_tokens == len(prompt) and turn.completion_tokens == len(ids)
    answer = tok("#### 4", add_special_tokens=False)["input_ids"]
    cut = parsed_turn(tok, answer, prompt, cut=True, seconds=0)
    assert cut.finish_reason == "length" and cut.message["content"] == "#### 4"
    # Whether the limit ended it is the generator's word, not a count: vLLM gives a turn near the context's end fewer
    # tokens than max_new_tokens, and an hf reply may stop on its last allowed token.
    assert parsed_turn(tok, answer, prompt, cut=False, seconds=0).finish_reason == "stop"


def test_a_turn_ends_at_its_first_stop_token_of_any_kind():
    from rlkit.agents.turns import until_stop

    assert until_stop([5, 7, 2, 0, 0], {2, 7}) == [5, 7]  # the generation config may list several EOS ids
    assert until_stop([5, 6, 2, 2], {2}) == [5, 6, 2] and until_stop([5, 6], {2}) == [5, 6]


def test_the_hf_policy_plays_episodes_in_waves_and_reads_each_turn_once(tmp_path, monkeypatch):
    """Episodes play in waves of eval.batch_size, each to its end, so the turn cache holds one batch; a second
    turn reads only what its first prompt did not (the reply and the tool result), and scores as without the
    cache."""
    from rlkit.agents import hf as hf_policy
    from rlkit.evaluate import evaluate
    from rlkit.inference import generate as gen

    call = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+3"}}\n</tool_call><|im_end|>'
    calls, reads = [], []
    real_generate_ids, real_cached = hf_policy.generate_ids, gen._generate_cached

    def scripted(model, tokenizer, prompts, **kwargs):
        calls.append([list(p) for p in prompts])
        generations = real_generate_ids(model, tokenizer, prompts, **kwargs)
        if len(calls) == 1:  # the first wave's two episodes call the calculator, so they take a second turn
            for g in generations:
                g.ids = tokenizer(call, add_special_tokens=False)["input_ids"]
        return generations

    def cached(model, tokenizer, prompts, *args, heads, **kwargs):
        reads.append([len(p) - (h.used if h else 0) for p, h in zip(prompts, heads or [None] * len(prompts),
                                                                       strict=True)])
        return real_cached(model, tokenizer, prompts, *args, heads=heads, **kwargs)

    monkeypatch.setattr(hf_policy, "generate_ids", scripted)
    monkeypatch.setattr(gen, "_generate_cached", cached)
    # float32: a cached turn's prefill (SDPA from 256 tokens) and generate() (the recipe's eager) sum in other orders;
    # on a CPU with bf16 units the smoke model runs in bf16, where that flipped a near-tied token of the tiny random
    # model (episode 4; with the SDPA prefill off the two matched in bf16 too).
    options = dict(smoke=True, limit=5, overrides=["eval.batch_size=2", "model.dtype=float32"], show_progress=False)
    results = evaluate(CALCULATOR, out=tmp_path / "eval.json", **options)
    records = [json.loads(line) for line in Path(results["trajectories"]).read_text().splitlines()]
    assert [len(r["turns"]) for r in records] == [2, 2, 1, 1, 1]
    assert [len(c) for c in calls] == [2, 2, 2, 1]  # wave 1 (episodes 0-1) for two turns, then 2-3, then 4
    assert all(calls[1][i][:len(calls[0][i])] == calls[0][i] for i in (0, 1))
    grown = [len(calls[1][i]) - len(calls[0][i]) for i in (0, 1)]
    assert reads[1] == grown  # only the new tokens: the reply (here not what the model said) and the tool result
    calls.clear()
    monkeypatch.setattr(hf_policy, "TurnCache", lambda: None)  # the policy without a turn cache
    plain = evaluate(CALCULATOR, out=tmp_path / "plain.json", **options)
    assert [json.loads(line)["messages"] for line in Path(plain["trajectories"]).read_text().splitlines()] == \
        [r["messages"] for r in records]


def test_local_model_rollout_and_agent_eval(tmp_path, capsys, monkeypatch):
    """The hf policy batches every live episode per turn; `rlkit eval` of an agent recipe scores rollouts."""
    from rlkit.agents import hf as hf_policy
    from rlkit.evaluate import evaluate
    from rlkit.evaluate.show import print_eval

    # The real engine and model; on the first turn episodes 0 and 1 call the calculator (the tiny model never
    # does, so every episode would end at turn 1), which gives them a second turn.
    call = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+3"}}\n</tool_call><|im_end|>'
    calls = []  # (prompts, batch_size) of each generation call the policy makes
    real_generate_ids = hf_policy.generate_ids

    def scripted(model, tokenizer, prompts, **kwargs):
        calls.append(([list(p) for p in prompts], kwargs["batch_size"]))
        generations = real_generate_ids(model, tokenizer, prompts, **kwargs)
        if len(calls) == 1:
            for g in generations[:2]:
                g.ids = tokenizer(call, add_special_tokens=False)["input_ids"]
        return generations

    monkeypatch.setattr(hf_policy, "generate_ids", scripted)
    results = evaluate(CALCULATOR, smoke=True, limit=4, out=tmp_path / "eval.json", show_progress=False)
    records = [json.loads(line) for line in Path(results["trajectories"]).read_text().splitlines()]
    assert results["n"] == len(records) == 4
    assert [len(r["turns"]) for r in records] == [2, 2, 1, 1]
    assert [m["content"] for m in records[0]["messages"] if m["role"] == "tool"] == ["5"]
    # One generation call per turn holding every episode still live at that turn, in one model batch.
    live = [sum(len(r["turns"]) > t for r in records) for t in range(max(len(r["turns"]) for r in records))]
    assert live == [4, 2] and [len(prompts) for prompts, _ in calls] == live, ([len(p) for p, _ in calls], live)
    assert all(size >= 4 for _, size in calls)
    # The second turn's batch is episodes 0 and 1, each its first prompt grown by the call and the tool result.
    (first, _), (second, _) = calls
    assert all(len(second[i]) > len(first[i]) and second[i][:len(first[i])] == first[i] for i in (0, 1))
    assert results["accuracy"] == sum(r["metrics"]["accuracy"] for r in records) / 4
    assert results["f1"] is None  # GSM8K answers are right or wrong
    print_eval(results)
    assert "│ all           │ 4 │" in capsys.readouterr().out.replace("─", "")
    for r in records:
        assert r["turns"] and all(t["completion_tokens"] <= 24 for t in r["turns"])  # smoke max_new_tokens
        # A reply the limit ended says so (hf's Generation.cut), and only one with all 24 tokens can be one.
        assert all(t["completion_tokens"] == 24 for t in r["turns"] if t["finish_reason"] == "length")
        assert r["turns"][0]["prompt_tokens"] > 50  # system prompt, tool schema and question
        assert r["messages"][0]["role"] == "system" and r["messages"][2]["role"] == "assistant"
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["by_question_type"]["all"]["n"] == 4


def test_agent_recipe_errors_are_one_line(tmp_path):
    from rlkit.errors import UserError

    cases = [
        (["env.name=calculatr"], "env.name: unknown environment 'calculatr' (did you mean 'calculator'?)"),
        (["env.args={precision: 3}"], "env.args"),
        (["data.prompt=calculater"], "data.prompt: task 'gsm8k' has no prompt 'calculater' (did you mean 'calculator'?)"),
        (["trainer.max_tool_calling_iterations=3"], "trainer.max_tool_calling_iterations: set by rlkit; set `env.max_turns`"),
        (["env.max_turns=0"], "env.max_turns"),
    ]
    for overrides, expected in cases:
        with pytest.raises(UserError) as e:
            load_recipe(CALCULATOR, overrides)
        assert expected in str(e.value), str(e.value)
        assert "\n" not in str(e.value)


MULTIHOP = recipes_dir() / "multihop_rag_grpo.yaml"


def _reader(queries):
    """A retrieval teacher: searches the question, answers the gold when a gold fact came back, else abstains."""
    by_query = {q["query"]: q for q in queries}

    def reply(request):
        messages = request["messages"]
        query = by_query[next(m["content"] for m in messages if m["role"] == "user")]
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if not results:
            return {"tool_calls": [{"name": "search", "arguments": {"query": query["query"]}}]}
        found = any(e["fact"] in "".join(results) for e in query["evidence_list"])
        answer = query["answer"] if found or query["question_type"] == "null_query" else "Insufficient information."
        return {"content": f"<answer>{answer}</answer>"}

    return reply


def test_multihop_rollout_with_the_retrieval_env_and_analyze(tmp_path, monkeypatch, capsys):
    from rlkit.agents.rollout import rollout
    from rlkit.analyze import main as analyze_main
    from rlkit.data import multihop_rag

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    queries = multihop_rag.generate(16, seed=1).to_list()
    out = tmp_path / "trajectories.jsonl"
    with ScriptedServer(_reader(queries)) as server:
        rollout(MULTIHOP, endpoint=server.url, smoke=True, out=out, show_progress=False,
                overrides=["data.eval.synthetic=16"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 16
    for r, q in zip(records, queries, strict=True):
        assert r["question_type"] == q["question_type"] and r["answer"] == q["answer"]
        assert r["metrics"]["searches"] == 1 and r["tool_calls"][0]["name"] == "search"
        passages = r["messages"][3]["content"]
        found = any(e["fact"] in passages for e in q["evidence_list"])
        assert r["success"] == (found or q["question_type"] == "null_query")
        expected_f1 = 1.0 if r["success"] else r["metrics"]["f1"]
        assert r["rewards"]["qa_correct"] == pytest.approx(2.0 * expected_f1)
        assert r["rewards"]["answer_format"] == 0.5
    analyze_main(str(out), markdown=True)
    markdown = capsys.readouterr().out
    for question_type in {q["question_type"] for q in queries}:
        assert f"| {question_type} |" in markdown


def test_endpoint_misconfiguration_stops_the_run_and_reasoning_is_kept(tmp_path):
    from rlkit.agents.endpoint import EndpointPolicy
    from rlkit.agents.engine import run_episodes
    from rlkit.agents.rollout import rollout
    from rlkit.envs.calculator import CalculatorEnv
    from rlkit.errors import UserError

    with ScriptedServer(lambda request: {"status": 401}) as server, pytest.raises(UserError) as e:
        rollout(CALCULATOR, endpoint=server.url, smoke=True, limit=2, out=tmp_path / "t.jsonl", show_progress=False)
    assert "AuthenticationError" in str(e.value) and "--api-key" in str(e.value)
    assert not (tmp_path / "t.jsonl").exists()

    def thinking(request):
        return {"content": "#### 4", "reasoning": "2 + 2 is 4."}

    rows = [{"prompt": [{"role": "user", "content": "2 + 2?"}], "answer": "4"}]
    with ScriptedServer(thinking) as server:
        policy = EndpointPolicy(server.url, api_key=None, served_model=None, max_new_tokens=16)
        (episode,) = run_episodes(rows, CalculatorEnv, policy, max_turns=1, show_progress=False)
    assert episode.messages[-1] == {"role": "assistant", "content": "#### 4", "reasoning_content": "2 + 2 is 4."}
    assert server.requests[0]["max_completion_tokens"] == 16 and "chat_template_kwargs" not in server.requests[0]
    (tmp_path / "exists.jsonl").write_text("")
    with pytest.raises(UserError, match="already exists"):
        rollout(CALCULATOR, endpoint="http://127.0.0.1:9/v1", smoke=True, out=tmp_path / "exists.jsonl")


class _SlowEnv:
    def reset(self, **row):
        self.metrics = {}

    def wait(self, seconds: float) -> str:
        """Wait.

        Args:
            seconds: how long
        """
        import time

        time.sleep(seconds)
        return "done"


def test_a_tool_timeout_ends_the_episode_and_async_rewards_keep_their_kind(tmp_path, monkeypatch):
    import inspect

    from rlkit.agents.endpoint import EndpointPolicy
    from rlkit.agents.engine import run_episodes
    from rlkit.trainers.grpo import LogEnvMetrics, reward_functions

    def reply(request):
        return {"tool_calls": [{"name": "wait", "arguments": {"seconds": 0.0 if len(request["messages"]) < 2 else 1.0}}]}

    rows = [{"prompt": [{"role": "user", "content": "wait"}]}]
    with ScriptedServer(reply) as server:
        policy = EndpointPolicy(server.url, api_key=None, served_model=None, max_new_tokens=8)
        (episode,) = run_episodes(rows, _SlowEnv, policy, max_turns=5, tool_timeout=0.2, show_progress=False)
    assert episode.error == "tool timeout: wait timed out after 0.2s" and episode.done
    # The fast first call went on to a second turn; the slow second call ended the episode there.
    assert len(server.requests) == 2 and episode.tool_calls[0]["error"] is None
    assert episode.tool_calls[1]["error"] == "timed out after 0.2s"

    # An async first reward stays async (TRL awaits it); the env metrics ride on the first sync one.
    (tmp_path / "judge_rewards.py").write_text("async def judge(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    recipe = load_recipe(CALCULATOR, ["rewards=[{name: 'judge_rewards:judge'}, {name: gsm8k_correct}]"], smoke=True)
    judge, correct = reward_functions(recipe)
    assert inspect.iscoroutinefunction(judge) and isinstance(correct, LogEnvMetrics)
