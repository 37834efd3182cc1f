import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.rewards import REWARDS, resolve_reward
from rlkit.rewards.math import gsm8k_correct
from rlkit.rewards.qa import qa_correct
from rlkit.rewards.think import approx_tokens, length_score, short_think, think_format, think_spans

SEARCH = [{"type": "function", "function": {"name": "search", "arguments": {"query": "<think>q</think>"}}}]


def assistant(content, **extra):
    return {"role": "assistant", "content": content} | extra


def tool(content):
    return {"role": "tool", "name": "search", "content": content}


def words(n):
    """Text of exactly n tokens under `approx_tokens`: "w", " w", " w", ..."""
    return " ".join(["w"] * n)


def think(n, after="x"):
    return f"<think>\n{words(n)}\n</think>\n\n{after}"


def cosine(s):
    return 0.5 + 0.5 * math.cos(math.pi / 2 * s)


# ---------------------------------------------------------------------------------------------
# The parser


@pytest.mark.parametrize(
    ("turn", "blocks", "problem"),
    [
        ("<think>a</think>42", ("a",), None),
        ("a</think>42", ("a",), None),
        ("42", (), "missing"),
        ("<think> </think>42", (" ",), "empty"),
        ("Hi <think>a</think>", ("a",), "text before <think>"),
        ("<think>a<think>b</think>c</think>", ("a<think>b",), "nested <think>"),
        ("<think>a</think>b</think>", ("a",), "stray </think>"),
        ("<think>a", ("a",), "unclosed <think>"),
        ("<think>a</think><think>b</think>", ("a", "b"), "more than one think block"),
        (assistant("42", reasoning_content="a"), ("a",), None),
        (assistant("<think>b</think>42", reasoning_content="a"), ("a", "b"),
         "duplicated in reasoning_content and content"),
        (assistant(["<think>"]), (), "missing"),
        (assistant(3), (), "content is not text"),
        (None, (), "not a message"),
    ],
)
def test_think_spans(turn, blocks, problem):
    assert think_spans(turn) == (blocks, problem)


# ---------------------------------------------------------------------------------------------
# think_format


@pytest.mark.parametrize(
    ("completion", "partial", "expected"),
    [
        # single turn, plain text
        ("<think>6 * 7 = 42</think>\n\n#### 42", False, 1.0),
        ("  \n<think>6 * 7</think>#### 42", False, 1.0),  # whitespace before <think> is fine
        ("<think>a</think>\n<tool_call>{\"name\": \"search\"}</tool_call>", False, 1.0),
        ("<think></think>#### 42", False, 0.0),  # empty
        ("<think> \n\t </think>#### 42", False, 0.0),  # whitespace-only
        ("#### 42", False, 0.0),  # missing
        ("<think>a</think><think>b</think>#### 42", False, 0.0),  # duplicated
        ("<think>a<think>b</think>c</think>#### 42", False, 0.0),  # nested
        ("<think>6 * 7 = 42", False, 0.0),  # unclosed (cut off)
        ("a</think>b</think>#### 42", False, 0.0),  # stray </think> twice
        ("<think>a</think>#### 42</think>", False, 0.0),  # stray </think> after the block
        ("Sure! <think>a</think>#### 42", False, 0.0),  # text before <think>
        ("<think>" * 3, False, 0.0),
        ("6 * 7 = 42</think>\n\n#### 42", False, 1.0),  # <think> pre-filled by the template
        ("\n\n</think>\n\n#### 42", False, 0.0),  # pre-filled, empty
        ("a</think>b<think>c</think>", False, 0.0),  # pre-filled, then a second block
        ("<think>a</think>42", True, 1.0),
        ("42", True, 0.0),
        # parsed messages: reasoning_content
        ([assistant("#### 42", reasoning_content="6 * 7")], False, 1.0),
        ([assistant("<think>6 * 7</think>#### 42", reasoning_content="6 * 7")], False, 0.0),  # duplicated
        ([assistant("</think>#### 42", reasoning_content="6 * 7")], False, 0.0),
        ([assistant("#### 42", reasoning_content=" \n")], False, 0.0),  # blank = no thinking
        ([assistant("<think>a</think>#### 42", reasoning_content="")], False, 1.0),
        ([assistant("#### 42", reasoning_content=7)], False, 0.0),
        ([assistant([{"type": "text", "text": "<think>a</think>"}, {"type": "text", "text": "42"}])], False, 1.0),
        # trajectories with tool calls; tool results are never read
        ([assistant(None, reasoning_content="search", tool_calls=SEARCH), tool("<think><think>"),
          assistant("<think>found</think>#### 42")], False, 1.0),
        ([assistant("<think>a</think>", tool_calls=SEARCH), tool("</think>"), assistant("a</think>42")], False, 1.0),
        ([assistant(None, reasoning_content="search", tool_calls=SEARCH), tool("<think>x</think>"),
          assistant("#### 42")], False, 0.0),
        ([assistant(None, reasoning_content="search", tool_calls=SEARCH), tool("doc"),
          assistant("#### 42")], True, 0.5),
        ([assistant("<think>a</think>", tool_calls=SEARCH), tool("doc"), assistant("<think>a", tool_calls=SEARCH),
          tool("doc"), assistant("<think>b</think>42")], True, 2 / 3),
        ([assistant("x<think>a</think>", tool_calls=SEARCH), tool("<think>ok</think>"), assistant("42")], True, 0.0),
        ([{"role": "user", "content": "<think>q</think>"}, assistant("<think>a</think>42")], False, 1.0),
        # garbage
        (None, False, 0.0),
        (None, True, 0.0),
        (42, False, 0.0),
        ([], False, 0.0),
        ([tool("<think>a</think>")], False, 0.0),  # no assistant turn
        ([assistant(5)], False, 0.0),
        ([{"role": "assistant"}], False, 0.0),
        (["junk", None, assistant("<think>a</think>x")], False, 1.0),  # non-messages skipped
    ],
)
def test_think_format(completion, partial, expected):
    assert think_format([completion], partial=partial) == pytest.approx([expected], abs=1e-9)


# ---------------------------------------------------------------------------------------------
# short_think (max_tokens=10, min_tokens=2 unless the case says otherwise)


@pytest.mark.parametrize(
    ("completion", "kwargs", "expected"),
    [
        # the curve at L = 0, below min, min, mid, max, 1.5 max, 2 max, 3 max
        ("<think></think>x", {}, 0.0),
        ("<think></think>x", {"empty_score": -0.5}, -0.5),
        ("x", {"empty_score": 0.25}, 0.25),  # no thinking at all
        ("<think> \n </think>x", {"empty_score": 0.25}, 0.25),  # whitespace-only = no thinking
        (think(1), {"empty_score": 0.25}, 0.25),  # below min_tokens
        (think(2), {}, 1.0),
        (think(3), {}, cosine(1 / 8)),
        (think(6), {}, cosine(0.5)),  # = 0.8535...
        (think(10), {}, 0.5),
        (think(12), {}, cosine(1.2)),
        (think(15), {}, cosine(1.5)),  # = 0.1464...
        (think(20), {}, 0.0),
        (think(30), {}, 0.0),
        (think(5), {"min_tokens": 0}, cosine(0.5)),  # min 0: one half cosine, cos(pi L / 2 max)
        (think(1), {"min_tokens": 0}, cosine(0.1)),
        (think(200), {"max_tokens": 100, "min_tokens": 1}, 0.0),
        (think(100), {"max_tokens": 300, "min_tokens": 1}, cosine(99 / 299)),
        # where the thinking sits
        (words(6) + "</think>x", {}, cosine(0.5)),  # pre-filled <think>
        ([assistant("x", reasoning_content=words(10))], {}, 0.5),
        ("<think>\n  w w  \n</think>x", {}, 1.0),  # the block is stripped
        ("<think>" + "a" * 25 + "</think>x", {}, cosine(1 / 8)),  # a 25-letter run counts 3
        ("<think>1234 56</think>x", {}, cosine(5 / 8)),  # one per digit, and the space: 7
        # malformed turns score 0.0 whatever empty_score is
        ([assistant("<think>w w</think>x", reasoning_content="w w")], {"empty_score": 0.25}, 0.0),
        ("<think>w<think>w</think>w</think>x", {"empty_score": 0.25}, 0.0),
        ("<think>" + words(4), {"empty_score": 0.25}, 0.0),
        ("Sure. " + think(4), {"empty_score": 0.25}, 0.0),
        ("w w</think>x</think>", {"empty_score": 0.25}, 0.0),
        (think(4) + think(4), {"empty_score": 0.25}, 0.0),
        # trajectories: the mean over assistant turns; tool results are not read
        ([assistant(None, reasoning_content=words(2), tool_calls=SEARCH), tool(think(100)),
          assistant(think(10, "#### 42"))], {}, 0.75),
        ([assistant(think(6), tool_calls=SEARCH), tool("doc"), assistant("#### 42")], {"empty_score": 0.25},
         (cosine(0.5) + 0.25) / 2),
        ([assistant(think(2), tool_calls=SEARCH), tool("doc"), assistant("<think>w", tool_calls=SEARCH),
          tool("doc"), assistant(think(15))], {}, (1.0 + 0.0 + cosine(1.5)) / 3),
        # garbage
        (None, {"empty_score": 0.25}, 0.0),
        (7, {}, 0.0),
        ([], {"empty_score": 0.25}, 0.0),
        ([tool(think(2))], {}, 0.0),
        ([assistant(5)], {"empty_score": 0.25}, 0.0),
        ([{"role": "assistant"}], {"empty_score": 0.25}, 0.25),  # no content: no thinking
    ],
)
def test_short_think(completion, kwargs, expected):
    kwargs = {"max_tokens": 10, "min_tokens": 2} | kwargs
    assert short_think([completion], **kwargs) == pytest.approx([expected], abs=1e-9)


def test_short_think_scores_every_completion_and_takes_trl_kwargs():
    rewards = short_think([think(2), think(10), None], max_tokens=10, min_tokens=2, prompts=["p"] * 3,
                          completion_ids=[[1]] * 3, answer=["42"] * 3, trainer_state=None)
    assert rewards == pytest.approx([1.0, 0.5, 0.0], abs=1e-9)


@pytest.mark.parametrize("kwargs", [{"max_tokens": 5, "min_tokens": 5}, {"max_tokens": 5, "min_tokens": 9},
                                    {"min_tokens": -1}, {"max_tokens": 0, "min_tokens": 0}])
def test_short_think_rejects_bad_budgets(kwargs):
    with pytest.raises(ValueError, match="need 0 <= min_tokens < max_tokens"):
        short_think(["x"], **kwargs)


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(min_value=2, max_value=400))
def test_shorter_thinking_never_scores_less(data, budget):
    a = data.draw(st.integers(min_value=1, max_value=budget - 1))
    b = data.draw(st.integers(min_value=a + 1, max_value=budget))
    score_a, score_b, empty, over = short_think([think(a), think(b), think(0), think(3 * budget)], max_tokens=budget)
    assert score_a >= score_b > empty
    assert score_a > over


def test_length_score_is_continuous_at_the_budget():
    for max_tokens, min_tokens in [(10, 2), (300, 1), (7, 0)]:
        below, at, above = (length_score(n, max_tokens, min_tokens) for n in (max_tokens - 1e-9, max_tokens,
                                                                             max_tokens + 1e-9))
        assert below == pytest.approx(at, abs=1e-6) and above == pytest.approx(at, abs=1e-6) and at == 0.5


def test_short_think_counts_with_a_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    text = "Let me think: 48 / 2 = 24, so Natalia sold 72 clips in May."
    n = len(AutoTokenizer.from_pretrained(tiny_model_dir).encode(text, add_special_tokens=False))
    assert n != approx_tokens(text)  # so that the two counts are told apart
    completion = [assistant(f"<think>\n{text}\n</think>\n\n#### 72")]
    assert short_think([completion], max_tokens=n, tokenizer=str(tiny_model_dir)) == [0.5]
    assert short_think([completion], max_tokens=n - 1, min_tokens=0, tokenizer=str(tiny_model_dir)) == (
        pytest.approx([cosine(1 + 1 / (n - 1))], abs=1e-9))
    assert short_think([completion], max_tokens=n, tokenizer="rlkit/tiny-qwen3") == [0.5]  # the pseudo id


def test_approx_tokens_follows_qwens_pre_tokenizer(tiny_model_dir):
    """The tiny tokenizer has Qwen3's pre-tokenizer; outside CJK and long runs, one piece each."""
    from transformers import AutoTokenizer

    pre = AutoTokenizer.from_pretrained(tiny_model_dir).backend_tokenizer.pre_tokenizer
    for text in ["The quick brown fox jumps over the lazy dog.",
                 "Let me think: 48 / 2 = 24, so she sold 72 clips.\n\nSo the answer is 72.",
                 "We're told x_1 + x_2 = 10;   then\n  Hence x_2 = 7 (since 10 - 3 = 7)!!\n\n\nDone",
                 "Hmm, I'll re-check: $1,234.50 × 2 — right?\tYes. It's they've I'M",
                 "def f(a_b):\n    return a_b**2  # square\n"]:
        assert approx_tokens(text) == len(pre.pre_tokenize_str(text))
    assert approx_tokens("首先 total") == 3 and approx_tokens("a" * 24) == 2 and approx_tokens("") == 0


# ---------------------------------------------------------------------------------------------
# The correctness rewards never read the thinking


@pytest.mark.parametrize(
    "completion",
    [
        "<think>6 * 7 = 42, #### 42</think>\n\n#### 41",
        "#### 42 \\boxed{42}</think>\n\n#### 41",  # pre-filled <think>
        [assistant("#### 41", reasoning_content="so the answer is 42\n#### 42")],
        [assistant(None, reasoning_content="#### 42", tool_calls=SEARCH), tool("#### 42"), assistant("#### 41")],
        "#### 41<think>#### 42",  # unclosed
    ],
)
def test_correctness_rewards_ignore_the_thinking(completion):
    assert gsm8k_correct([completion], answer=["#### 42"]) == [0.0]
    assert gsm8k_correct([completion], answer=["#### 41"]) == [1.0]


@pytest.mark.parametrize(
    "completion",
    [
        "<think>Lyon</think><answer>Paris</answer>",
        "<answer>Lyon</answer></think><answer>Paris</answer>",
        [assistant("<answer>Paris</answer>", reasoning_content="<answer>Lyon</answer>")],
        [assistant(None, reasoning_content="Lyon", tool_calls=SEARCH), tool("<answer>Lyon</answer>"),
         assistant("<answer>Paris</answer>")],
    ],
)
def test_qa_correct_ignores_the_thinking(completion):
    assert qa_correct([completion], answer=["Lyon"]) == [0.0]
    assert qa_correct([completion], answer=["Paris"]) == [2.0]


def test_registered_with_args():
    assert REWARDS["think_format"] is think_format and REWARDS["short_think"] is short_think
    reward = resolve_reward("short_think", {"max_tokens": 10, "min_tokens": 2})
    assert reward.__name__ == "short_think" and reward(completions=[think(10)], prompts=["p"]) == [0.5]
    assert resolve_reward("think_format", {"partial": True})(completions=[[assistant("<think>a</think>"),
                                                                         assistant("b")]]) == [0.5]
