import asyncio
import json
import os
import pickle
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlkit.errors import UserError
from rlkit.rewards import REWARDS, resolve_reward
from rlkit.rewards.math import answer_format, extract_answer, gold_answer, gsm8k_correct, normalize_number
from rlkit.rewards.text import completion_text, strip_think

GSM8K_SOLUTION = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


def assistant(content, **extra):
    return {"role": "assistant", "content": content, **extra}


CALCULATOR_CALL = assistant(
    None,
    tool_calls=[{"type": "function", "function": {"name": "calculator", "arguments": '{"expr": "6*7"}'}}],
)
TOOL_RESULT = {"role": "tool", "content": "42"}


GSM8K_CORRECT_CASES = [
    # `#### N`, GSM8K's own format
    ("6 * 7 = 42\n#### 42", "42", 1.0),
    ("In May she sold 24, so 48 + 24 = 72.\n#### 72", GSM8K_SOLUTION, 1.0),
    ("#### 41", "42", 0.0),
    ("#### 41\nWait, I miscounted.\n#### 42", "42", 1.0),
    ("#### 42\nThat used 3 steps.", "42", 1.0),
    ("#### Step 1: add\n20 + 22 = 42", "42", 1.0),  # a markdown heading is not an answer
    ("####42", "42", 1.0),
    # \boxed{N}
    (r"So we get \boxed{42}.", "42", 1.0),
    (r"The answer is $\boxed{1,234}$ in total.", "1234", 1.0),
    (r"\boxed{41}, no: \boxed{42}", "42", 1.0),
    (r"\boxed{\text{18 dollars}}", "18", 1.0),
    (r"\boxed{5 + 3 = 8}", "8", 1.0),
    # <answer>N</answer>
    ("<answer>42</answer>", "42", 1.0),
    ("<answer>\n5 + 3 = 8\n</answer>", "8", 1.0),
    ("<answer>8</answer> I spent 9 minutes on this.", "8", 1.0),
    # "the answer is N" / "final answer: N"
    ("So the answer is 18. Check: 9 * 2 = 18, plus 3 is 21.", "18", 1.0),
    ("Final answer: 42", "42", 1.0),
    ("Final Answer is 42 apples, from 6 boxes.", "42", 1.0),
    ("THE ANSWER IS 42 (6 times 7)", "42", 1.0),
    ("**Final Answer:** 42, after 3 steps", "42", 1.0),
    ("The answer is **$1,234.00**.", "1234", 1.0),
    ("Answer:\n\n42\n", "42", 1.0),
    # the markers' priority: ####, \boxed, <answer>, "the answer is", last number
    ("#### 7\nso \\boxed{8}", "7", 1.0),
    ("\\boxed{8} <answer>9</answer>", "8", 1.0),
    ("<answer>9</answer> The answer is 8", "9", 1.0),
    ("The answer is 3, I think. Let me recount: 4", "3", 1.0),
    # the last number, when nothing marks the answer
    ("She has 3 apples, buys 5 more, so 8", "8", 1.0),
    ("She has 3 apples, buys 5 more, so 8", "3", 0.0),
    ("It costs $1,234.", "1234", 1.0),
    ("The numbers are 1, 2, 3", "3", 1.0),
    # number spellings
    ("#### 1,234,567", "1234567", 1.0),
    ("#### $18", "18", 1.0),
    ("#### 25%", "25", 1.0),
    ("#### 72.00", "72", 1.0),
    ("#### 0.50", "0.5", 1.0),
    ("#### 2.5", 2.5, 1.0),
    ("#### 2.5", 2, 0.0),
    ("#### -5", -5, 1.0),
    ("#### -5", 5, 0.0),
    ("The temperature fell to -12 degrees.", "-12", 1.0),
    ("Pages 3-5", "5", 1.0),
    ("#### **42**", "42", 1.0),
    ("So she has 42.", "42", 1.0),
    ("#### 42 cookies", "42", 1.0),
    ("The trip is 60km", "60", 1.0),
    # <think> hides what is inside it
    ("<think>Maybe 41.</think>\n#### 42", "42", 1.0),
    ("<think>#### 42</think>\nThe answer is 41", "42", 0.0),
    ("<think>It is 42, surely", "42", 0.0),
    ("#### 42\n<think>Second thoughts: 41", "42", 1.0),
    ("Pre-filled think: #### 41</think>\n#### 42", "42", 1.0),
    ("#### 42</think>", "42", 0.0),
    ("<think>a</think>#### 41<think>b</think>", "41", 1.0),
    # conversational completions
    ([assistant("#### 42")], "42", 1.0),
    ([assistant("#### 42", reasoning_content="#### 41")], "42", 1.0),
    ([assistant("I do not know.", reasoning_content="#### 42")], "42", 0.0),
    ([CALCULATOR_CALL, TOOL_RESULT, assistant("#### 42")], "42", 1.0),
    ([CALCULATOR_CALL, TOOL_RESULT, assistant("#### 41")], "42", 0.0),  # the tool's 42 is not the answer
    ([CALCULATOR_CALL, TOOL_RESULT], "42", 0.0),  # cut off before answering
    ([assistant([{"type": "text", "text": "#### 42"}])], "42", 1.0),
    ([assistant(None)], "42", 0.0),
    ([], "42", 0.0),
    # gold spellings
    ("#### 72", 72, 1.0),
    ("#### 72", 72.0, 1.0),
    ("#### 72", "72.0", 1.0),
    ("#### 1234", "Total:\n#### 1,234", 1.0),
    ("#### 72", "", 0.0),
    ("#### 72", None, 0.0),
    ("#### 1", True, 0.0),
    ("#### 72", ["72"], 0.0),
    ("#### 72", "seventy-two", 0.0),
    # garbage
    ("", "42", 0.0),
    ("no numbers here", "42", 0.0),
    ("\x00\ufffd#### <answer></answer>\\boxed{", "42", 0.0),
    (None, "42", 0.0),
    (42, "42", 0.0),
]


@pytest.mark.parametrize(("completion", "gold", "expected"), GSM8K_CORRECT_CASES)
def test_gsm8k_correct(completion, gold, expected):
    assert gsm8k_correct(completions=[completion], answer=[gold]) == [expected]


def test_gsm8k_correct_takes_trl_keywords_and_scores_a_batch():
    rewards = gsm8k_correct(
        prompts=["q1", "q2", "q3"],
        completions=["#### 42", "#### 41", [assistant("\\boxed{7}")]],
        completion_ids=[[1], [2], [3]],
        answer=["#### 42", "42", 7],
        trainer_state=None,
        question=["a", "b", "c"],
    )
    assert rewards == [1.0, 0.0, 1.0]


def test_gsm8k_correct_refuses_mismatched_lengths():
    with pytest.raises(ValueError):
        gsm8k_correct(completions=["#### 1", "#### 2"], answer=["1"])


ANSWER_FORMAT_CASES = [
    ("6 * 7 = 42\n#### 42", 1.0),
    ("#### 42", 1.0),
    ("#### 42  \n\n", 1.0),
    ("  ####42", 1.0),
    ("#### -1,234.5", 1.0),
    ("<think>Hmm, 41?</think>\n#### 42", 1.0),
    ("#### 42\n<think>But maybe", 1.0),
    ([assistant("Work.\n#### 42")], 1.0),
    ("#### 42\nHope this helps!", 0.5),
    ("#### 42 apples", 0.5),
    ("#### 42.", 0.5),
    ("The total is #### 42", 0.5),
    ("The answer is 42", 0.0),
    (r"\boxed{42}", 0.0),
    ("#### Step 1\nAdd them: 42", 0.0),
    ("#### forty-two", 0.0),
    ("<think>#### 42</think>", 0.0),
    ("#### 42</think>Done", 0.0),
    ("", 0.0),
    (None, 0.0),
    ([assistant(None)], 0.0),
]


@pytest.mark.parametrize(("completion", "expected"), ANSWER_FORMAT_CASES)
def test_answer_format(completion, expected):
    assert answer_format(completions=[completion], prompts=["q"], trainer_state=None) == [expected]


EXTRACT_ANSWER_CASES = [
    ("#### 72.00", "72"),
    ("#### 0.50", "0.5"),
    ("#### 1,000,000", "1000000"),
    ("#### 12\n#### 13", "13"),
    ("It costs $1,234.50 in total", "1234.5"),
    ("-5 degrees", "-5"),
    ("-$5", "-5"),
    ("$-5", "-5"),
    ("Pages 3-5", "5"),
    ("**42**", "42"),
    ("42.", "42"),
    ("50%", "50"),
    ("0.333", "0.333"),
    (".5 of a pie", "0.5"),
    ("1,2345", "2345"),
    ("version v1.2", None),
    (r"\boxed{-0.0}", "0"),
    (r"The final answer is \(\boxed{42}\).", "42"),
    (r"the answer is \(42\)", "42"),
    ("the answer is not obvious; it is 12", "12"),
    ("<think>42</think>", None),
    ("no number", None),
    ("", None),
]


@pytest.mark.parametrize(("text", "expected"), EXTRACT_ANSWER_CASES)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("72.00", "72"),
        ("0.50", "0.5"),
        ("100", "100"),
        ("-3.10", "-3.1"),
        ("1,234", "1234"),
        ("$5", "5"),
        ("50%", "50"),
        (" 7 ", "7"),
        ("-0", "0"),
        ("1e3", "1000"),
        ("1E+2", "100"),
        ("nan", None),
        ("-Infinity", None),
        ("1e999999999", None),
        ("", None),
        ("abc", None),
    ],
)
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


@pytest.mark.parametrize(
    ("gold", "expected"),
    [
        (GSM8K_SOLUTION, "72"),
        ("a\n#### 5\nb\n#### 6", "6"),
        ("#### 1,234", "1234"),
        ("####", None),
        ("42", "42"),
        (42, "42"),
        (42.0, "42"),
        (2.5, "2.5"),
        (float("nan"), None),
        (True, None),
        (None, None),
        (["42"], None),
        ("forty", None),
    ],
)
def test_gold_answer(gold, expected):
    assert gold_answer(gold) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>a</think>b", "b"),
        ("a<think>b</think>c<think>d</think>e", "ace"),
        ("a<think>b", "a"),
        ("a</think>b", "b"),
        ("a</think>b<think>c</think>d", "bd"),
        ("<think>a<think>b</think>c</think>d", "d"),
        ("plain", "plain"),
    ],
)
def test_strip_think(text, expected):
    assert strip_think(text) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("text", "text"),
        ([{"role": "user", "content": "q"}, assistant("a1"), TOOL_RESULT, assistant("a2")], "a2"),
        ([assistant("a"), TOOL_RESULT], "a"),
        (
            [assistant([{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}])],
            "ab",
        ),
        ([assistant(None)], ""),
        ([assistant(7)], ""),
        ([{"role": "user", "content": "q"}], ""),
        (["not a message"], ""),
        (None, ""),
    ],
)
def test_completion_text(completion, expected):
    assert completion_text(completion) == expected


# ---------------------------------------------------------------------------------------------
# Registry


def test_resolve_reward_by_name():
    assert resolve_reward("gsm8k_correct") is REWARDS["gsm8k_correct"] is gsm8k_correct
    assert resolve_reward("answer_format", {}) is answer_format


def test_unknown_reward_suggests_the_closest_name():
    with pytest.raises(UserError) as e:
        resolve_reward("gsm8k_corect")
    assert str(e.value) == (
        "unknown reward 'gsm8k_corect' (did you mean 'gsm8k_correct'?); "
        "valid: answer_format, gsm8k_correct, judge, qa_correct, rank, short_think, think_format, "
        "or package.module:function"
    )


def test_unknown_reward_without_a_close_name():
    with pytest.raises(UserError) as e:
        resolve_reward("zzz")
    assert str(e.value) == (
        "unknown reward 'zzz'; valid: answer_format, gsm8k_correct, judge, qa_correct, rank, short_think, "
        "think_format, or package.module:function"
    )


def test_user_reward_is_imported():
    # User code is wrapped so its answers are checked; the wrapper keeps the name TRL logs.
    reward = resolve_reward("os.path:join")
    assert reward.__wrapped__ is os.path.join and reward.__name__ == "join"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("rlkit_no_such_module:f", "cannot import reward 'rlkit_no_such_module:f': No module named"),
        ("os.path:no_such_function", "module 'os.path' has no attribute 'no_such_function'"),
        ("os:sep", "reward 'os:sep' is a str, not a function"),
        ("os.path:", "must have the form package.module:function"),
        (".relative:f", "must have the form package.module:function"),
    ],
)
def test_bad_user_reward_is_a_user_error(spec, message):
    with pytest.raises(UserError, match=message):
        resolve_reward(spec)


def scaled(completions, scale=1.0, **kwargs):
    return [scale] * len(completions)


def test_args_are_passed_and_the_name_kept(monkeypatch):
    monkeypatch.setitem(REWARDS, "scaled", scaled)
    reward = resolve_reward("scaled", {"scale": 0.25})
    assert reward.__name__ == "scaled"
    assert reward(prompts=["a", "b"], completions=["x", "y"], trainer_state=None) == [0.25, 0.25]
    assert reward.__wrapped__ is scaled


def test_args_on_a_user_reward_are_named_after_the_function():
    reward = resolve_reward("json:dumps", {"sort_keys": True})
    assert reward.__name__ == "dumps"
    # The args are bound under the check that wraps user code (json.dumps returns no rewards).
    assert reward.__wrapped__({"b": 1, "a": 2}) == '{"a": 2, "b": 1}' != json.dumps({"b": 1, "a": 2})


def test_a_reward_with_args_pickles():
    # TRL's async GRPO sends reward functions to a spawned process.
    reward = pickle.loads(pickle.dumps(resolve_reward("qa_correct", {"scale": 3.0, "metric": "em"})))
    assert reward.__name__ == "qa_correct"
    assert reward(completions=["<answer>Paris</answer>", "<answer>Rome</answer>"], answer=["Paris"] * 2) == [3.0, 0.0]


def test_args_on_an_async_reward_are_refused(monkeypatch):
    async def judge(completions, **kwargs):
        await asyncio.sleep(0)
        return [1.0] * len(completions)

    monkeypatch.setitem(REWARDS, "judge", judge)
    assert resolve_reward("judge") is judge
    with pytest.raises(UserError, match="reward 'judge' is async"):
        resolve_reward("judge", {"strict": True})


# ---------------------------------------------------------------------------------------------
# Properties

# Text built from the pieces extraction looks for, so the search reaches the awkward corners.
_PIECES = [
    *(
        "<think>",
        "</think>",
        "####",
        "\\boxed{",
        "{",
        "}",
        "<answer>",
        "</answer>",
        "The answer is",
        "answer:",
    ),
    *("**", "$", "%", "-", ".", ",", "\n", " ", "\\(", "1,234", "0", "42", "7.50", "1e9"),
]
_texts = st.one_of(st.text(), st.lists(st.sampled_from(_PIECES) | st.text(max_size=3)).map("".join))
_parts = st.lists(st.dictionaries(st.text(max_size=5), _texts))
_contents = st.one_of(st.none(), _texts, st.integers(), _parts)
_messages = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": _contents},
            optional={"reasoning_content": _texts, "tool_calls": st.just([])},
        ),
        st.dictionaries(st.text(max_size=8), st.one_of(st.none(), _texts, st.integers())),
        st.none(),
    ),
    max_size=5,
)
_golds = st.one_of(st.none(), _texts, st.integers(), st.floats(), st.booleans(), st.lists(st.integers()))


@given(completion=st.one_of(_texts, _messages, st.none()), gold=_golds)
def test_rewards_never_raise_and_stay_in_range(completion, gold):
    correct = gsm8k_correct(completions=[completion], answer=[gold])
    for rewards in (correct, answer_format(completions=[completion])):
        assert len(rewards) == 1
        assert type(rewards[0]) is float
        assert 0.0 <= rewards[0] <= 1.0


@given(number=st.decimals(min_value=-(10**9), max_value=10**9, places=2), noise=_texts)
def test_an_answer_in_the_asked_format_is_read_back(number, noise):
    reply = f"<think>{noise.replace('<', '')}</think>Work: 1 + 2 = 3.\n#### {number:,}"
    assert extract_answer(reply) == normalize_number(str(number))
    assert gsm8k_correct(completions=[reply], answer=[f"...\n#### {number}"]) == [1.0]
    assert answer_format(completions=[reply]) == [1.0]


def _strip_think_by_hand(text):
    visible, inside = [], False
    for piece in re.split(r"(</?think>)", text):
        if piece == "<think>":
            inside = True
        elif piece == "</think>":
            if not inside:  # a stray closer: everything before it was pre-filled reasoning
                visible.clear()
            inside = False
        elif not inside:
            visible.append(piece)
    return "".join(visible)


@given(st.lists(st.sampled_from(["<think>", "</think>", "a", "1", "\n"])).map("".join))
def test_strip_think_follows_the_tags_left_to_right(text):
    assert strip_think(text) == _strip_think_by_hand(text)


@pytest.mark.parametrize("name, args, expected", [
    ("short_think", {"max_token": 300},
     "args.max_token: reward 'short_think' takes no argument 'max_token' (did you mean 'max_tokens'?); "
     "its settings: max_tokens, min_tokens, empty_score, tokenizer"),
    ("qa_correct", {"metric": "em2"}, "args: qa_correct: unknown metric 'em2'; valid: em, f1"),
    ("short_think", {"max_tokens": 0}, "args: short_think: need 0 <= min_tokens < max_tokens"),
    ("answer_format", {"form": "xml"}, "args: answer_format: unknown form 'xml'; valid: answer_tag, gsm8k"),
    ("gsm8k_correct", {"answer": 3}, "args.answer: reward 'gsm8k_correct' is filled from the data, not set in `args:`"),
])
def test_reward_args_are_checked_when_the_recipe_loads(name, args, expected):
    with pytest.raises(UserError) as e:
        resolve_reward(name, args)
    assert str(e.value).startswith(expected), str(e.value)


def test_user_rewards_may_read_settings_from_kwargs(tmp_path, monkeypatch):
    (tmp_path / "kw_rewards.py").write_text("def f(completions, **kwargs):\n    return [kwargs['bonus']] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_reward("kw_rewards:f", {"bonus": 0.5})(completions=["a", "b"]) == [0.5, 0.5]


@pytest.mark.parametrize(("text", "kind"), [
    ("3 + 4 = 7\n#### 7", None),
    ("########", "no answer"),                             # the collapse issue 51 found: no number at all
    ("############ 7", "character run"),
    ("The answer is **12**.", None),
    ("7 = 7\n#### 1000", None),                            # zeros are digits, not a run
    ("=====\n#### 7", None),                               # five, not eight
    ("#### 7#### 7#### 7#### 7", "loop"),                  # cut by the token limit mid-repetition
    ("3 + 4 = 7\n3 + 4 = 7\n3 + 4 = 7\n3 + 4 = 7\n3 +", "loop"),  # cut inside the unit: the loop still shows
    ("3 + 4 = 7\n3 + 4 = 7\n", None),                      # twice is not a loop
    ("Ana has 3. 3 + 4 = 7\n#### 7", None),
    ("<think>#########</think>#### 7", None),                # reasoning is not read
])
def test_degenerate_kinds(text, kind):
    from rlkit.rewards.math import extract_answer
    from rlkit.rewards.text import degenerate

    assert degenerate(text, extract_answer(text)) == kind
