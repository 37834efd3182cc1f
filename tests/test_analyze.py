import io
import json

import pytest
from rich.console import Console

from rlkit.analyze import analyze, main, render, to_markdown
from rlkit.errors import UserError
from rlkit.stats import wilson


def turn(prompt, completion, finish):
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "finish_reason": finish, "seconds": 0.5}


def call(name, seconds, error=None):
    return {"turn": 1, "name": name, "arguments": {"query": "q"}, "content": "...", "error": error, "seconds": seconds}


def episode(i, question_type, success, metrics, reward, turns, calls, error=None, **extra):
    record = {
        "id": str(i), "question_type": question_type, "success": success, "reward": reward, "error": error,
        "metrics": metrics, "turns": turns, "tool_calls": calls, "rounds": len(turns),
        "usage": {f"{k}_tokens": sum(t[f"{k}_tokens"] for t in turns) for k in ("prompt", "completion", "total")},
        "messages": [{"role": "user", "content": "q"}] + [{"role": "assistant", "content": "a"}] * len(turns),
        "answer": "gold", "prediction": "p", "rewards": {"qa_correct": reward},
    }
    return record | extra


def qa(em, f1, accuracy):
    return {"em": em, "f1": f1, "accuracy": accuracy, "searches": 1, "empty_results": 0, "repeated_queries": 0}


EPISODES = [
    episode(0, "comparison_query", True, qa(1.0, 1.0, 1.0), 2.5,
            [turn(800, 40, "tool_calls"), turn(900, 30, "tool_calls"), turn(1000, 20, "stop")],
            [call("search", 0.1), call("search", 0.3)]),
    episode(1, "comparison_query", False, qa(0.0, 0.5, 1.0), 1.0,
            [turn(700, 50, "tool_calls"), turn(760, 10, "stop")], [call("search", 2.0, "search timed out")]),
    episode(2, "inference_query", True, qa(1.0, 1.0, 1.0), 2.5,
            [turn(600, 30, "tool_calls"), turn(700, 20, "stop")], [call("search", 0.2)]),
    episode(3, "inference_query", False, qa(0.0, 0.25, 0.0), 0.5,
            [turn(500, 40, "tool_calls"), turn(600, 40, "tool_calls"), turn(700, 40, "tool_calls"),
             turn(800, 100, "length")],
            [call("search", 0.1), call("search", 0.1), call("calculator", 0.0, "ZeroDivisionError")]),
    episode(4, "null_query", True, qa(1.0, 1.0, 1.0), 2.5, [turn(400, 10, "stop")], []),
    # no metrics (the endpoint failed before an answer)
    episode(5, "null_query", False, None, 0.0, [turn(400, 0, "error")], [], error="endpoint error: 502 Bad Gateway"),
    # a GSM8K episode: no question type, no QA metrics, and no `usage` (summed from `turns`)
    episode(6, None, True, {"searches": 0}, 1.0, [turn(300, 20, "tool_calls"), turn(350, 10, "stop")],
            [call("calculator", 0.05)], some_future_key=[1, 2]),
    # no `rounds` (counted from the assistant messages)
    episode(7, "comparison_query", False, qa(0.0, 0.0, 0.0), 0.0, [turn(650, 25, "tool_calls"), turn(700, 5, "error")],
            [call("search", 0.4)], error="timeout: episode exceeded 120 s"),
]
del EPISODES[6]["usage"], EPISODES[7]["rounds"]


@pytest.fixture
def trajectories(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in EPISODES) + "\n")
    return path


def flat(tree, path=()):
    if isinstance(tree, dict):
        return {key: value for name, sub in tree.items() for key, value in flat(sub, (*path, name)).items()}
    return {path: tree}


def assert_close(actual, expected):
    """Equal nested dicts, numbers within 1e-9."""
    assert flat(actual) == pytest.approx(flat(expected), abs=1e-9)


def test_answers_per_question_type(trajectories):
    answers = analyze(trajectories)["answers"]
    assert list(answers) == ["comparison_query", "inference_query", "null_query", "all"]
    intervals = {name: row.pop("intervals") for name, row in answers.items()}
    # 95% intervals: Wilson for accuracy and EM (0/1), a seeded bootstrap for F1
    assert intervals["all"]["accuracy"] == pytest.approx(wilson(4, 6))
    assert intervals["all"]["em"] == pytest.approx(wilson(3, 6))
    assert intervals["all"]["f1"][0] < 3.75 / 6 < intervals["all"]["f1"][1] < 1.0
    assert_close(answers["comparison_query"],
        {"n": 3, "em": 1 / 3, "f1": 0.5, "accuracy": 2 / 3, "reward": 3.5 / 3, "success_rate": 1 / 3})
    assert_close(answers["inference_query"],
        {"n": 2, "em": 0.5, "f1": 0.625, "accuracy": 0.5, "reward": 1.5, "success_rate": 0.5})
    # episode 5 has no metrics: the means are over episode 4 alone
    assert_close(answers["null_query"],
        {"n": 2, "em": 1.0, "f1": 1.0, "accuracy": 1.0, "reward": 1.25, "success_rate": 0.5})
    assert_close(answers["all"],
        {"n": 8, "em": 0.5, "f1": 3.75 / 6, "accuracy": 4 / 6, "reward": 1.25, "success_rate": 0.5})


def test_quality_split_by_success(trajectories):
    outcomes = analyze(trajectories)["outcomes"]
    quality = ("n", "em", "f1", "accuracy", "reward", "success_rate")
    assert_close({k: outcomes["success"][k] for k in quality},
        {"n": 4, "em": 1.0, "f1": 1.0, "accuracy": 1.0, "reward": 2.125, "success_rate": 1.0})
    assert_close({k: outcomes["failure"][k] for k in quality},
        {"n": 4, "em": 0.0, "f1": 0.25, "accuracy": 1 / 3, "reward": 0.375, "success_rate": 0.0})


def test_rounds_and_tool_call_distributions(trajectories):
    outcomes = analyze(trajectories)["outcomes"]
    # rounds: all [1, 1, 2, 2, 2, 2, 3, 4]; success [1, 2, 2, 3]; failure [1, 2, 2, 4]; p90 interpolates linearly
    assert_close(outcomes["all"]["rounds"],
        {"mean": 2.125, "median": 2.0, "p90": 3.3, "max": 4, "histogram": {1: 2, 2: 4, 3: 1, 4: 1}})
    assert_close(outcomes["success"]["rounds"],
        {"mean": 2.0, "median": 2.0, "p90": 2.7, "max": 3, "histogram": {1: 1, 2: 2, 3: 1}})
    assert_close(outcomes["failure"]["rounds"],
        {"mean": 2.25, "median": 2.0, "p90": 3.4, "max": 4, "histogram": {1: 1, 2: 2, 4: 1}})
    # tool calls: all [0, 0, 1, 1, 1, 1, 2, 3]; success [0, 1, 1, 2]; failure [0, 1, 1, 3]
    assert_close(outcomes["all"]["tool_calls"],
        {"mean": 1.125, "median": 1.0, "p90": 2.3, "max": 3, "histogram": {0: 2, 1: 4, 2: 1, 3: 1}})
    assert_close(outcomes["success"]["tool_calls"],
        {"mean": 1.0, "median": 1.0, "p90": 1.7, "max": 2, "histogram": {0: 1, 1: 2, 2: 1}})
    assert_close(outcomes["failure"]["tool_calls"],
        {"mean": 1.25, "median": 1.0, "p90": 2.4, "max": 3, "histogram": {0: 1, 1: 2, 3: 1}})


def test_token_usage_last_turn_and_cumulative(trajectories):
    outcomes = analyze(trajectories)["outcomes"]
    means = {split: {scope: {kind: stats["mean"] for kind, stats in outcomes[split]["tokens"][scope].items()}
                     for scope in ("last_turn", "cumulative")} for split in ("all", "success", "failure")}
    assert_close(means, {
        "all": {"last_turn": {"prompt": 638.75, "completion": 21.875, "total": 660.625},
                "cumulative": {"prompt": 1357.5, "completion": 61.25, "total": 1418.75}},
        "success": {"last_turn": {"prompt": 612.5, "completion": 15.0, "total": 627.5},
                    "cumulative": {"prompt": 1262.5, "completion": 45.0, "total": 1307.5}},
        "failure": {"last_turn": {"prompt": 665.0, "completion": 28.75, "total": 693.75},
                    "cumulative": {"prompt": 1452.5, "completion": 77.5, "total": 1530.0}},
    })
    # last-turn prompts [350, 400, 400, 700, 700, 760, 800, 1000]; totals [400, 410, 680, 1350, 1380, 1520, 2790, 2820]
    assert_close(outcomes["all"]["tokens"]["last_turn"]["prompt"],
        {"mean": 638.75, "median": 700.0, "p90": 860.0, "max": 1000})
    assert_close(outcomes["all"]["tokens"]["cumulative"]["total"],
        {"mean": 1418.75, "median": 1365.0, "p90": 2799.0, "max": 2820})


def test_tools_errors_and_finish_reasons(trajectories):
    report = analyze(trajectories)
    assert report["episodes"] == 8
    assert_close(report["tools"], {
        "calculator": {"calls": 2, "failures": 1, "failure_rate": 0.5, "mean_seconds": 0.025},
        "search": {"calls": 7, "failures": 1, "failure_rate": 1 / 7, "mean_seconds": 3.2 / 7},
    })
    assert report["errors"] == {"endpoint error": 1, "timeout": 1}
    assert report["finish_reasons"] == {"tool_calls": 9, "stop": 5, "error": 2, "length": 1}
    assert json.loads(json.dumps(report))["episodes"] == 8


def test_a_run_directory_is_read_through_its_trajectories(trajectories):
    assert analyze(trajectories.parent)["answers"] == analyze(trajectories)["answers"]


def test_empty_splits_have_no_numbers(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(EPISODES[0]) + "\n")
    failure = analyze(path)["outcomes"]["failure"]
    assert failure["n"] == 0 and failure["em"] is None and failure["reward"] is None
    assert failure["rounds"] == {"mean": None, "median": None, "p90": None, "max": None, "histogram": {}}
    assert "| failure | 0 | - | - | - | - |  |" in to_markdown(analyze(path))


def test_markdown_tables(trajectories):
    markdown = to_markdown(analyze(trajectories))
    for row in [
        "| question type | n | EM | F1 | accuracy | reward | success rate |",
        "|---|---|---|---|---|---|---|",
        "| comparison_query | 3 | 0.333 [0.061, 0.792] | 0.500 [0.000, 1.000] | 0.667 [0.208, 0.939] | 1.167 | 0.333 |",
        "| null_query | 2 | 1.000 [0.207, 1.000] | 1.000 [0.207, 1.000] | 1.000 [0.207, 1.000] | 1.250 | 0.500 |",
        "| all | 8 | 0.500 [0.188, 0.812] | 0.625 [0.292, 0.917] | 0.667 [0.300, 0.903] | 1.250 | 0.500 |",
        "| failure episodes | 4 | 0.000 [0.000, 0.561] | 0.250 [0.000, 0.500] | 0.333 [0.061, 0.792] | 0.375 | 0.000 |",
        "| all | 8 | 2.125 | 2.000 | 3.300 | 4 | 1:2 2:4 3:1 4:1 |",
        "| success | 4 | 1.000 | 1.000 | 1.700 | 2 | 0:1 1:2 2:1 |",
        "| all | last turn | prompt | 638.8 | 700.0 | 860.0 | 1000 |",
        "| failure | last turn | completion | 28.8 | 7.5 | 73.0 | 100 |",
        "| search | 7 | 1 | 0.143 | 0.457 |",
        "| calculator | 2 | 1 | 0.500 | 0.025 |",
        "| endpoint error | 1 |",
        "| tool_calls | 9 |",
        "| episodes | turns | well-formed | mean | median | p90 | max |",
        "| all | 17 | 0.000 | 0.0 | 0.0 | 0.0 | 0 |",  # no thinking anywhere: 17 assistant turns, share 0
    ]:
        assert row in markdown.splitlines()
    assert markdown.count("\n## ") == 8


def test_main_prints_or_writes(trajectories, tmp_path, capsys):
    main(str(trajectories), markdown=True)
    assert capsys.readouterr().out == to_markdown(analyze(trajectories))
    out = tmp_path / "report.md"
    main(str(trajectories), out=str(out))
    assert out.read_text() == to_markdown(analyze(trajectories))
    assert f"written to {out}" in capsys.readouterr().out


def test_render_prints_every_section(trajectories):
    console = Console(file=io.StringIO(), width=200)
    render(analyze(trajectories), console)
    text = console.file.getvalue()
    for title in ("answers", "rounds per episode", "tool calls per episode", "tokens per episode", "thinking",
                  "tools", "episode errors", "finish reasons"):
        assert title in text
    assert "comparison_query" in text and "1:2 2:4 3:1 4:1" in text


def assistant(content, **extra):
    return {"role": "assistant", "content": content} | extra


SEARCH = [{"type": "function", "function": {"name": "search", "arguments": {"query": "q"}}}]
THINKING = [
    # well-formed: reasoning_content (4 tokens), then a <think> block (2); the tool result is not read
    episode(0, None, True, None, 1.0, [turn(10, 10, "tool_calls"), turn(20, 10, "stop")], [call("search", 0.1)],
            messages=[{"role": "user", "content": "q"},
                      assistant(None, reasoning_content="w w w w", tool_calls=SEARCH),
                      {"role": "tool", "content": "<think>x y z</think>"},
                      assistant("<think>\nw w\n</think>\n\n#### 4")]),
    # unclosed (cut off: 10 tokens to the end), then no thinking (0)
    episode(1, None, False, None, 0.0, [turn(10, 10, "tool_calls"), turn(20, 10, "stop")], [call("search", 0.1)],
            messages=[assistant("<think>" + "w " * 10, tool_calls=SEARCH), {"role": "tool", "content": "doc"},
                      assistant("#### 41")]),
    # pre-filled <think> (3, well-formed), then two blocks (1 + 2 tokens, malformed)
    episode(2, None, False, None, 0.0, [turn(10, 10, "stop"), turn(20, 10, "stop")], [],
            messages=[assistant("w w w</think>x"), assistant("<think>a</think><think>b c</think>")]),
]


def test_thinking_per_assistant_turn(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in THINKING))
    report = analyze(path)
    # think tokens: success [4, 2]; failure [10, 0, 3, 3]; well-formed: success 2 of 2, failure 1 of 4
    assert_close(report["thinking"], {
        "all": {"turns": 6, "well_formed": 0.5,
                "think_tokens": {"mean": 22 / 6, "median": 3.0, "p90": 7.0, "max": 10}},
        "success": {"turns": 2, "well_formed": 1.0, "think_tokens": {"mean": 3.0, "median": 3.0, "p90": 3.8, "max": 4}},
        "failure": {"turns": 4, "well_formed": 0.25,
                    "think_tokens": {"mean": 4.0, "median": 3.0, "p90": 7.9, "max": 10}},
    })
    markdown = to_markdown(report).splitlines()
    assert "## thinking (think tokens per assistant turn)" in markdown
    assert "| failure | 4 | 0.250 | 4.0 | 3.0 | 7.9 | 10 |" in markdown
    path.write_text(json.dumps(THINKING[0]) + "\n")
    failure = analyze(path)["thinking"]["failure"]
    assert failure == {"turns": 0, "well_formed": None,
                       "think_tokens": {"mean": None, "median": None, "p90": None, "max": None}}


def test_episodes_without_thinking(trajectories):
    thinking = analyze(trajectories)["thinking"]
    assert [thinking[split]["turns"] for split in ("all", "success", "failure")] == [17, 8, 9]
    assert thinking["all"]["well_formed"] == 0.0 and thinking["all"]["think_tokens"]["max"] == 0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": "2", "rounds": 3', " is not valid JSON (Expecting ',' delimiter, column 24)"),
        ("[1, 2]", " is a JSON list, not an object"),
        ('{"rounds": "3"}', "`rounds` is a str, expected an integer"),
        ('{"success": "yes"}', "`success` is a str, expected true/false"),
        ('{"reward": "high"}', "`reward` is a str, expected a number"),
        ('{"turns": [3]}', "every item of `turns` must be a JSON object"),
        ('{"turns": [{"prompt_tokens": "800"}]}', "`prompt_tokens` is '800', expected a number"),
        ('{"metrics": {"em": true}}', "`em` is True, expected a number"),
        ('{"tool_calls": [{"name": "search", "seconds": "fast"}]}', "`seconds` is 'fast', expected a number"),
    ],
)
def test_malformed_lines_name_the_file_and_line(tmp_path, line, message):
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps(EPISODES[0]) + "\n\n" + line + "\n")
    with pytest.raises(UserError) as e:
        analyze(path)
    separator = "" if message.startswith(" ") else ": "
    assert str(e.value) == f"{path}: line 3{separator}{message}"


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(UserError, match=r"nope\.jsonl: no such file$"):
        analyze(tmp_path / "nope.jsonl")
    with pytest.raises(UserError, match=r"trajectories\.jsonl: no such file$"):
        analyze(tmp_path)
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    with pytest.raises(UserError, match=r"empty\.jsonl: no episodes \(the file is empty\)$"):
        analyze(tmp_path / "empty.jsonl")


def test_markup_and_pipes_in_names_are_kept_as_text(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(episode(0, None, False, None, 0.0, [turn(1, 1, "stop")], [call("a|[b]", 0.1)],
                                       error="bad [red]thing[/red] | here")) + "\n")
    report = analyze(path)
    assert "| bad [red]thing[/red] \\| here | 1 |" in to_markdown(report).splitlines()
    console = Console(file=io.StringIO(), width=200)
    render(report, console)
    assert "a|[b]" in console.file.getvalue() and "bad [red]thing[/red] | here" in console.file.getvalue()
