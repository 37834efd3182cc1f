"""`rlkit optimize-prompt`: gepa evolves the arithmetic recipe's system prompt with the built-in tiny model as the task
model (`--smoke`) and a scripted OpenAI-compatible server on localhost as the reflection model (real HTTP). The
scripted reflections propose specific prompts; a reward that pays for one phrase in the system prompt makes the
right one win, so what gepa keeps, what is written and what the eval shows are known numbers."""

from __future__ import annotations

import json
import re
import shlex
import sys

import pytest

from rlkit.errors import UserError
from rlkit.recipe import recipes_dir
from tests.scripted_server import ScriptedServer
from tests.test_cli import rlkit

MODEL = "scripted-reflector"
ARITH = recipes_dir() / "smol_arith_grpo.yaml"
SECRET = "sk-secret-reflection-key"
FIRST = "Answer with the calculation, then `#### <number>`. Think."  # lacks the phrase: rejected
SECOND = "Be exact. Answer with the calculation, then `#### <number>`."  # has it: accepted
THIRD = "Answer briefly."


def house_style(prompts, completions, **kwargs):
    """1.0 when the system prompt asks the model to "Be exact", else 0.0: a reward a prompt alone can earn."""
    return [1.0 if "Be exact" in p[0]["content"] else 0.0 for p in prompts]


def small_answer(completions, answer, **kwargs):
    """0.5 for a row whose gold answer is below 10: a score that belongs to its row, so a score borrowed from another
    row shows (the smoke split's golds: train 28, 6, 3, then validation 36, 1, 14, 23; eval 14, 24, 2, 29, 27, 8)."""
    return [0.5 if int(a) < 10 else 0.0 for a in answer]


def proposing(*texts):
    """The scripted reflection model: the n-th reflection request gets the n-th text in a ``` block (the last one
    after that)."""
    def reply(body):
        text = texts[min(reply.calls, len(texts) - 1)]
        reply.calls += 1
        return {"content": f"Looking at the feedback, the assistant must be exact.\n```\n{text}\n```"}

    reply.calls = 0
    return reply


# smol_arith_grpo mixes prompt forms (`data.prompt: mix`); the optimiser works on one system line: its `short` form.
SMOKE = ["--set", "rewards=[{name: 'tests.test_optimize:house_style'}, {name: 'tests.test_optimize:small_answer'}]",
         "--set", "data.prompt=short"]


def optimize(server, out, **more):
    from rlkit.optimize import optimize_prompt

    kwargs = {"reflection_endpoint": server.url, "reflection_model": MODEL, "budget": 20, "limit_train": 3,
              "limit_val": 4, "limit_eval": 6, "minibatch": 3, "reflection_retries": 1, "reflection_timeout": 10.0,
              "overrides": SMOKE[1::2], "smoke": True, **more}
    return optimize_prompt(ARITH, out=out, **kwargs)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))


@pytest.mark.slow
def test_gepa_keeps_the_proposal_the_rewards_prefer_writes_it_and_evaluates_it(tmp_path, monkeypatch):
    from rlkit.data import gsm8k, load_rows, task_rows
    from rlkit.optimize.report import print_summary
    from rlkit.recipe import load_recipe

    monkeypatch.setenv("TEST_REFLECTION_KEY", SECRET)
    out = tmp_path / "prompts" / "arith.txt"
    with ScriptedServer(proposing(FIRST, SECOND, THIRD), model=MODEL) as server:
        s = optimize(server, out, reflection_key_env="TEST_REFLECTION_KEY")
    assert out.read_text() == SECOND + "\n" and s["prompt"] == SECOND and s["changed"]
    assert s["base_prompt"] == gsm8k.PROMPTS["short"] and s["shots"] == "short"
    # Reflection saw the seed prompt and, per row, the question, the completion and what the rewards said.
    first = server.requests[0]["messages"][0]["content"]
    assert f"```\n{gsm8k.PROMPTS['short']}\n```" in first and first.count("# Example ") == 3
    assert "Reward 0 in all (house_style 0, small_answer 0). The correct answer is 28." in first
    assert "Reward 0.5 in all (house_style 0, small_answer 0.5). The correct answer is 3." in first
    assert all(r["temperature"] == 1.0 and r["max_completion_tokens"] == 2048 for r in server.requests)
    assert all(h["authorization"] == f"Bearer {SECRET}" for h in server.headers)
    # gepa's trajectory: on the 4 validation rows (one gold below 10) the seed scores 0.5 / 4, SECOND 1 more; FIRST was
    # rejected on its minibatch. (Scores served from the train rows at the same positions, gepa-ai/gepa#424, give
    # 0.25 and 1.25.)
    assert [(t["candidate"], t["val_score"], t["best_so_far"]) for t in s["trajectory"]] == [(0, 0.125, 0.125),
                                                                                              (1, 1.125, 1.125)]
    assert s["trajectory"][1]["prompt"] == SECOND and s["trajectory"][1]["parents"] == [0]
    # Metric calls (one row generated and scored each): the seed on the 4 validation rows (4), then per iteration the
    # parent and the proposal on the 3 minibatch rows, an accepted proposal on the validation rows too: +6 = 10, then
    # +6 +4 = 20, the budget. Minibatch sums: the seed 0.5 + 0.5 (golds 6 and 3), SECOND 3 more.
    assert s["proposals"] == [
        {"iteration": 1, "accepted": False, "minibatch_before": 1.0, "minibatch_after": 1.0, "metric_calls": 10,
         "prompt": FIRST},
        {"iteration": 2, "accepted": True, "candidate": 1, "minibatch_after": 4.0, "metric_calls": 20,
         "prompt": SECOND}]
    o, c = s["optimizer"], s["cost"]
    assert (o["candidates"], o["proposals"], o["accepted"], o["best_candidate"], o["base_val_score"],
            o["best_val_score"], o["metric_calls"], o["budget"]) == (2, 2, 1, 1, 0.125, 1.125, 20, 20)
    assert c["metric_calls"] == 20 and c["rows_generated"] == 20 + 2 * 6  # every metric call and both eval passes
    assert c["reflection_calls"] == c["reflection_requests"] == len(server.requests) == 2 and c["reflection_retries"] == 0
    # The scripted server's usage: 10 prompt tokens per message, 1 completion token per 4 characters of the message.
    assert c["reflection_prompt_tokens"] == 20
    assert c["reflection_completion_tokens"] == sum(
        len(json.dumps({"role": "assistant", "content": proposing(t)({})["content"]})) // 4 for t in (FIRST, SECOND))
    # Eval split, 6 rows (golds 2 and 8 below 10): the reward goes 1/6 -> 7/6, +1 on every row; accuracy is the gsm8k
    # rule's, with Wilson intervals.
    ev = s["eval"]
    assert (ev["base"]["n"], ev["base"]["reward"], ev["optimized"]["reward"]) == pytest.approx((6, 1 / 6, 7 / 6))
    assert (ev["reward_gain"]["diff"], ev["reward_gain"]["low"], ev["reward_gain"]["high"]) == pytest.approx((1, 1, 1))
    assert ev["base"]["correct"] == 0 and ev["base"]["interval"] == pytest.approx([0.0, 0.390], abs=1e-3)
    assert ev["gain"]["test"] == "mcnemar"
    saved = json.loads((tmp_path / "prompts" / "arith.json").read_text())
    assert saved["prompt"] == SECOND and saved["use"]["set"] == [f"data.prompt={out}", "data.shots=short"]
    assert shlex.split(saved["use"]["command"]) == ["rlkit", "train", str(ARITH), "--smoke", *SMOKE,
                                                     "--set", f"data.prompt={out}", "--set", "data.shots=short"]
    assert saved["reflection"]["api_key_env"] == "TEST_REFLECTION_KEY"
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    # The recipe uses the file through data.prompt: its system line, then the shipped prompt's worked turns.
    recipe = load_recipe(ARITH, saved["use"]["set"], smoke=True)
    rows = task_rows(recipe, "grpo", load_rows("gsm8k", recipe.data.eval))
    assert rows[0]["prompt"][0] == {"role": "system", "content": SECOND}
    assert rows[0]["prompt"][1:5] == gsm8k.SHOTS["short"] and len(rows[0]["prompt"]) == 6
    print_summary(s)


@pytest.mark.slow
def test_nothing_beats_the_recipes_prompt_then_the_file_holds_it_unchanged(tmp_path, capsys):
    from rlkit.optimize.report import print_summary

    out = tmp_path / "same.md"
    with ScriptedServer(proposing(FIRST), model=MODEL) as server:
        s = optimize(server, out, budget=16)
    assert not s["changed"] and out.read_text().strip() == s["base_prompt"]
    assert [t["candidate"] for t in s["trajectory"]] == [0] and s["optimizer"]["accepted"] == 0
    assert s["eval"]["reward_gain"]["diff"] == 0.0 and s["eval"]["gain"]["diff"] == 0.0
    print_summary(s)
    printed = capsys.readouterr().out
    assert "no proposal beat the recipe's prompt" in printed and "+0.000" in printed
    # --overwrite replaces what rlkit wrote; a prompt file someone edited since is refused.
    with ScriptedServer(proposing(SECOND), model=MODEL) as server:
        assert optimize(server, out, budget=16, overwrite=True)["prompt"] == SECOND
        out.write_text("my own careful prompt\n")
        asked = len(server.requests) + len(server.preflights)
        with pytest.raises(UserError, match="is not a prompt file rlkit wrote"):
            optimize(server, out, budget=16, overwrite=True)
        assert out.read_text() == "my own careful prompt\n" and len(server.requests) + len(server.preflights) == asked


@pytest.mark.slow
@pytest.mark.parametrize("script, expected, requests", [
    ({"raw": "<html>502 Bad Gateway</html>"},
     r"reflection model .* failed after 1 retries \(last: malformed reply: not a chat completion: <html>502", 2),
    ({"content": "```\n```"}, r"failed after 1 retries \(last: malformed reply: no new prompt in the reply\)", 2),
    ({"status": 500}, r"failed after 1 retries \(last: InternalServerError", 2),
])
def test_a_reflection_model_that_fails_mid_run_stops_it_and_nothing_is_written(tmp_path, script, expected, requests):
    out = tmp_path / "p.txt"
    with ScriptedServer(lambda body: script, model=MODEL) as server:
        # The seed on the 4 validation rows, then on the first minibatch (3): the first reflection fails for good,
        # and the run stops there (a run going on would spend its budget of 20 with no proposal).
        with pytest.raises(UserError, match=expected + r".*; stopped after 7 metric calls, nothing written"):
            optimize(server, out)
        assert len(server.requests) == requests  # no request after the first failure for good
    assert not list(tmp_path.glob("p.*"))


def cli(monkeypatch, capsys, *args) -> tuple[int, str]:
    """`rlkit ARGS` in this process (so the test's reward imports): (exit code, stderr)."""
    import rlkit.cli

    monkeypatch.setattr(sys, "argv", ["rlkit", *map(str, args)])
    with pytest.raises(SystemExit) as exit_info:
        rlkit.cli.main()
    return exit_info.value.code or 0, capsys.readouterr().err


def test_an_unreachable_endpoint_is_one_line_and_exit_2_before_the_model_loads(tmp_path):
    out = tmp_path / "p.txt"
    res = rlkit("optimize-prompt", ARITH, "--smoke", *SMOKE[2:], "--reflection-model", MODEL, "--out", out,
                "--reflection-endpoint", "http://127.0.0.1:9/v1", "--reflection-retries", "0")
    assert res.returncode == 2 and res.stdout == ""
    assert re.fullmatch(r"rlkit: error: reflection model http://127\.0\.0\.1:9/v1 \(model 'scripted-reflector'\) "
                        r"cannot be reached: APIConnectionError: .*; start the server or fix --reflection-endpoint / "
                        r"--reflection-model\n", res.stderr), res.stderr
    assert not list(tmp_path.iterdir())


def test_bad_flags_files_and_endpoints_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    out = tmp_path / "p.txt"
    base = ["optimize-prompt", ARITH, "--smoke", *SMOKE, "--reflection-model", MODEL]
    with ScriptedServer(lambda body: {"content": "```\nx\n```"}, model="another-model") as server:
        code, err = cli(monkeypatch, capsys, *base, "--out", out, "--reflection-endpoint", server.url)
        assert code == 2 and "NotFoundError" in err and len(err.splitlines()) == 1, err
        assert server.requests == [] and len(server.preflights) == 0  # the 404 answers before the preflight counts
        for flags, message in [
            (["--reflection-key-env", "NO_SUCH_KEY_VAR"], "--reflection-key-env NO_SUCH_KEY_VAR: the environment "
                                                          "variable is not set"),
            (["--budget", "5"], "--budget 5: the recipe's prompt on the validation rows alone takes 4 metric calls "
                                "and one proposal 6 more; give at least 10"),
            (["--minibatch", "5"], "--minibatch 5: larger than --limit-train 4"),
            (["--set", "data.prompt=mix"], "data.prompt: mix picks a prompt form per row"),
            (["--set", "data.prompt=bare"], "data.prompt: bare has no system line to optimise"),
            (["--limit-train", "30", "--limit-val", "30", "--budget", "99"],
             "data.train: 32 rows; --limit-train 30 and --limit-val 30 take 60"),
        ]:
            code, err = cli(monkeypatch, capsys, *base, "--out", out, "--reflection-endpoint", server.url, *flags)
            assert code == 2 and err.startswith("rlkit: error: ") and message in err, err
            assert len(err.splitlines()) == 1
    (tmp_path / "mine.txt").write_text("keep me\n")
    for where, flags, message in [
        (tmp_path / "p.json", [], "the prompt file's name ends in .txt or .md"),
        (tmp_path / "mine.txt", [], "already exists; pass --overwrite"),
        (tmp_path / "mine.txt", ["--overwrite"], "is not a prompt file rlkit wrote"),
    ]:
        code, err = cli(monkeypatch, capsys, *base, "--out", where, *flags, "--reflection-endpoint", "http://x:9/v1")
        assert code == 2 and message in err and len(err.splitlines()) == 1, err
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "gepa", None)  # what `import gepa` meets where the extra is not installed
        code, err = cli(monkeypatch, capsys, *base, "--out", out, "--reflection-endpoint", "http://x:9/v1")
        assert code == 2 and err == "rlkit: error: optimize-prompt needs the gepa package: pip install 'rlkit[gepa]'\n"
    code, err = cli(monkeypatch, capsys, "optimize-prompt", recipes_dir() / "smol_calc_grpo.yaml", "--smoke",
                    "--reflection-endpoint", "http://x:9/v1", "--reflection-model", MODEL, "--out", out)
    assert code == 2 and "optimize-prompt evaluates plain generations" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
    assert (tmp_path / "mine.txt").read_text() == "keep me\n"
