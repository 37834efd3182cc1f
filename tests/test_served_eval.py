"""`rlkit eval` of a model at an OpenAI-compatible endpoint (`--model URL`, or the URL as TARGET): the suite, a plain
eval, IFEval and an agent recipe score it with the training prompt and answer rule over real HTTP (the scripted
local server), a request that keeps failing stops the eval in one line, and --resume continues after the replies
already written."""

import json
from pathlib import Path

from rlkit.data import gsm8k
from rlkit.evaluate.ifeval_checks import load_prompts, score
from rlkit.recipe import recipes_dir
from tests.scripted_server import ScriptedServer
from tests.test_bad_input import run_main
from tests.test_ifeval import _prompts_file

ARITH = recipes_dir() / "smol_arith_grpo.yaml"
SETS = {"sums": {"synthetic": 7, "seed": 5, "generator": {"max_value": 20, "max_steps": 1}},
        "products": {"synthetic": 6, "seed": 6, "generator": {"ops": "*", "max_factor": 9, "max_steps": 1}}}


def _golds():
    """Each set's questions, in row order, with their gold answers (the rows the suite draws)."""
    out = {}
    for name, source in SETS.items():
        rows = gsm8k.generate(source["synthetic"], seed=source["seed"], **source["generator"])
        out[name] = [(q.strip(), gsm8k.gold(a)) for q, a in zip(rows["question"], rows["answer"], strict=True)]
    return out


def _half_right(golds):
    """A server that answers the even-numbered problems of each set right and the odd ones one too high, those
    cut by its token limit."""
    where = {q: (i, g) for rows in golds.values() for i, (q, g) in enumerate(rows)}

    def reply(request):
        i, g = where[request["messages"][-1]["content"]]
        return {"content": f"#### {int(g) + i % 2}", "finish_reason": "length" if i % 2 else "stop"}

    return reply


def test_a_suite_scores_an_endpoint_model_with_the_training_prompt(tmp_path, capsys):
    golds = _golds()
    suite = tmp_path / "mine.yaml"
    suite.write_text(json.dumps({"name": "mine", "recipe": "smol_arith_grpo", "sets": [
        {"name": name, "eval": source, "prompt": "short"} for name, source in SETS.items()]}))
    with ScriptedServer(_half_right(golds), model="org/served-7b") as server:
        code, captured = run_main(capsys, "eval", server.url, "--suite", suite, "--no-base", "--out", tmp_path / "o")
    assert code == 0, captured.err
    summary = json.loads((tmp_path / "o" / "suite.json").read_text())
    (row,) = summary["rows"]
    assert row["role"] == "trained" and row["model"] == "org/served-7b"
    assert {name: (c["correct"], c["n"]) for name, c in row["sets"].items()} == {"sums": (4, 7), "products": (3, 6)}
    for name, rows in golds.items():
        res = json.loads(Path(row["sets"][name]["results"]).read_text())
        assert [(e["gold"], e["prediction"], e["correct"], e["cut"]) for e in res["examples"]] == [
            (g, str(int(g) + i % 2), i % 2 == 0, i % 2 == 1) for i, (_, g) in enumerate(rows)]
        assert res["cut"] == row["sets"][name]["cut"] == (len(rows) // 2) / len(rows)  # the server's "length"
    # the training prompt (system line, worked turns, question), greedy, the recipe's token budget
    asked = {r["messages"][-1]["content"]: r for r in server.requests}
    assert len(server.requests) == 13 == len(asked)
    for question, _ in golds["products"]:
        request = asked[question]
        assert request["messages"] == gsm8k.chat_prompt(question, "short")
        assert request["temperature"] == 0.0 and request["max_completion_tokens"] == 20
    assert "org/served-7b" in captured.out
    assert "| cut by token limit |" in (tmp_path / "o" / "suite.md").read_text()  # a column of the suite's table


def test_a_failing_server_stops_the_eval_in_one_line_and_resume_continues(tmp_path, capsys):
    golds = _golds()
    out = tmp_path / "sums.json"
    args = ["eval", ARITH, "--model", None, "--set", f"data.eval={json.dumps(SETS['sums'])}", "--out", out]
    right = _half_right(golds)
    broken = {q for q, _ in golds["sums"][3:]}

    def breaks_at_the_fourth(request):
        return {"status": 500} if request["messages"][-1]["content"] in broken else right(request)

    with ScriptedServer(breaks_at_the_fourth) as server:
        args[3] = server.url
        code, captured = run_main(capsys, *args)
    assert code == 2 and "Traceback" not in captured.err
    (line,) = [x for x in captured.err.splitlines() if x.startswith("rlkit: error")]  # (datasets' Map bar aside)
    assert f"--model {server.url}: prompt 4 of 7 failed after 2 retries (endpoint error: InternalServerError" in line
    assert len(server.requests) == 3 + 4 * 3  # the four failing prompts, each tried three times
    written = [json.loads(x) for x in out.with_name("sums.examples.jsonl").read_text().splitlines()]
    assert [e["correct"] for e in written] == [True, False, True] and not out.exists()

    with ScriptedServer(right) as server:
        args[3] = server.url
        code, captured = run_main(capsys, *args, "--resume")
    assert code == 0, captured.err
    res = json.loads(out.read_text())
    assert res["n"] == 7 and [e["correct"] for e in res["examples"]] == [i % 2 == 0 for i in range(7)]
    assert len(server.requests) == 4  # only the prompts not yet answered


def test_ifeval_and_an_agent_recipe_through_an_endpoint(tmp_path, capsys):
    prompts = _prompts_file(tmp_path)
    with ScriptedServer(lambda request: {"content": "hello there, friend."}) as server:
        code, captured = run_main(capsys, "eval", server.url, "--ifeval", prompts, "--out", tmp_path / "if")
    assert code == 0, captured.err
    res = json.loads((tmp_path / "if" / "model.json").read_text())
    assert res["model"] == "scripted-teacher" and res["n"] == 3
    for e, source in zip(res["examples"], load_prompts(prompts), strict=True):
        assert e["response"] == "hello there, friend." and e["strict"] == score(source, e["response"])["strict"]
    assert [e["prompt_strict"] for e in res["examples"]] == [False, True, True]  # a comma; one sentence; lowercase

    out = tmp_path / "calc.json"
    with ScriptedServer(lambda request: {"content": "#### 4"}) as server:
        code, captured = run_main(capsys, "eval", recipes_dir() / "gsm8k_calculator_grpo.yaml", "--smoke", "--model",
                                  server.url, "--limit", "2", "--out", out)
    assert code == 0, captured.err
    res = json.loads(out.read_text())
    assert res["model"] == "scripted-teacher" and res["n"] == 2 and len(server.requests) == 2


def test_an_endpoint_beside_a_run_directory_is_refused_in_one_line(tmp_path, capsys, sft_run):
    code, captured = run_main(capsys, "eval", sft_run, "--model", "http://127.0.0.1:9/v1", "--out", tmp_path / "x")
    assert code == 2 and len(captured.err.strip().splitlines()) == 1
    assert "an endpoint serves its own weights; give a recipe as TARGET" in captured.err


def test_endpoint_flags_without_an_endpoint_are_one_line(tmp_path, capsys):
    code, captured = run_main(capsys, "eval", ARITH, "--served-model", "m", "--out", tmp_path / "x.json")
    assert code == 2 and len(captured.err.strip().splitlines()) == 1
    assert "--served-model/--api-key reach a model at an endpoint" in captured.err and not (tmp_path / "x.json").exists()
