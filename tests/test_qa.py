import doctest
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlkit.rewards.qa
from rlkit.rewards import REWARDS, resolve_reward
from rlkit.rewards.math import answer_format
from rlkit.rewards.qa import answer_tag_format, final_answer, normalize_answer, qa_correct, qa_scores
from rlkit.rewards.text import completion_text

NULL = "Insufficient information."


def assistant(content, **extra):
    return {"role": "assistant", "content": content, **extra}


def tool(content):
    return {"role": "tool", "name": "search", "content": content}


SEARCH_CALL = assistant(
    None,
    tool_calls=[{"type": "function", "function": {"name": "search", "arguments": '{"query": "capital of France"}'}}],
)


# (completion, gold, EM, F1, accuracy)
QA_CASES = [
    # exact, case, articles, punctuation
    ("<answer>Paris</answer>", "Paris", 1.0, 1.0, 1.0),
    ("<answer>paris</answer>", "Paris", 1.0, 1.0, 1.0),
    ("<answer>The Verge</answer>", "the verge", 1.0, 1.0, 1.0),
    ("<answer>Verge</answer>", "The Verge", 1.0, 1.0, 1.0),
    ("<answer>Sam Bankman-Fried.</answer>", "Sam Bankman-Fried", 1.0, 1.0, 1.0),
    ("<answer>$1,200</answer>", "$1,200", 1.0, 1.0, 1.0),
    # partial overlap: F1 by tokens; upstream accuracy counts any shared word, "the" included
    ("<answer>Federal Reserve Bank</answer>", "Federal Reserve", 0.0, 0.8, 1.0),
    ("<answer>Reserve</answer>", "Federal Reserve", 0.0, 2 / 3, 1.0),
    ("<answer>the the Verge Verge</answer>", "The Verge", 0.0, 2 / 3, 1.0),
    ("It was The Verge.", "The Verge", 0.0, 0.5, 1.0),
    ("<answer>The Guardian</answer>", "The Verge", 0.0, 0.0, 1.0),
    ("<answer>Elon Musk</answer>", "Sam Altman", 0.0, 0.0, 0.0),
    # yes/no golds in either case; upstream accuracy keeps punctuation, so "yes." misses "Yes"
    ("<answer>Yes</answer>", "yes", 1.0, 1.0, 1.0),
    ("<answer>no</answer>", "No", 1.0, 1.0, 1.0),
    ("<answer>yes.</answer>", "Yes", 1.0, 1.0, 0.0),
    ("<answer>No</answer>", "Yes", 0.0, 0.0, 0.0),
    # null queries
    (f"<answer>{NULL}</answer>", NULL, 1.0, 1.0, 1.0),
    ("<answer>insufficient information</answer>", NULL, 1.0, 1.0, 1.0),
    ("<answer>INSUFFICIENT INFORMATION.</answer>", NULL, 1.0, 1.0, 1.0),
    ("<answer>There is insufficient information.</answer>", NULL, 0.0, 2 / 3, 1.0),
    ("<answer>Yes</answer>", NULL, 0.0, 0.0, 0.0),
    # where the answer is read: last tag, then the last "Answer:" line, then the whole text
    ("<answer>No</answer> wait, <answer>Yes</answer>", "Yes", 1.0, 1.0, 1.0),
    ("The articles agree.\nAnswer: Yes", "Yes", 1.0, 1.0, 1.0),
    ("**Final Answer:** TechCrunch", "TechCrunch", 1.0, 1.0, 1.0),
    ("Answer: No\nOn reflection:\nAnswer: Yes", "Yes", 1.0, 1.0, 1.0),
    ("Yes", "yes", 1.0, 1.0, 1.0),
    ("<answer> </answer>", "Paris", 0.0, 0.0, 0.0),
    # think blocks never count
    ("<think>Answer: Paris</think><answer>Lyon</answer>", "Paris", 0.0, 0.0, 0.0),
    ("<think>so <answer>Paris</answer></think>", "Paris", 0.0, 0.0, 0.0),
    ("<answer>Paris</answer><think>or maybe Lyon", "Paris", 1.0, 1.0, 1.0),
    ("Lyon?</think><answer>Paris</answer>", "Paris", 1.0, 1.0, 1.0),
    # tool trajectories: only the final assistant message's content counts
    ([SEARCH_CALL, tool("Paris is the capital."), assistant("<answer>Paris</answer>")], "Paris", 1.0, 1.0, 1.0),
    ([SEARCH_CALL, tool("<answer>Paris</answer>"), assistant("<answer>Lyon</answer>")], "Paris", 0.0, 0.0, 0.0),
    ([SEARCH_CALL, tool("Paris")], "Paris", 0.0, 0.0, 0.0),
    ([assistant("<answer>Lyon</answer>", reasoning_content="Answer: Paris")], "Paris", 0.0, 0.0, 0.0),
    ([assistant("<answer>Paris</answer>", reasoning_content="Lyon?")], "Paris", 1.0, 1.0, 1.0),
    ([assistant([{"type": "text", "text": "<answer>Paris</answer>"}])], "Paris", 1.0, 1.0, 1.0),
    (None, "Paris", 0.0, 0.0, 0.0),
]


@pytest.mark.parametrize(("completion", "gold", "em", "f1", "accuracy"), QA_CASES)
def test_qa_metrics_and_reward(completion, gold, em, f1, accuracy):
    scores = qa_scores(completion_text(completion), gold)
    assert scores == pytest.approx({"em": em, "f1": f1, "accuracy": accuracy}, abs=1e-6)
    assert qa_correct([completion], answer=[gold], prompts=["q"], trainer_state=None) == pytest.approx([2 * f1], abs=1e-6)
    assert qa_correct([completion], answer=[gold], scale=1.0, metric="em") == [em]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>\n  Lyon \n</answer>", "Lyon"),
        ("answer: Lyon", "Lyon"),
        ("- **Answer**: Lyon\n", "Lyon"),
        ("The answer: Lyon", "The answer: Lyon"),  # only a line that opens with the marker
        ("Answer: Lyon\n<answer>Paris</answer>", "Paris"),
        ("<answer>Paris", "<answer>Paris"),
        ("<answer>" * 1000 + "Paris", "<answer>" * 1000 + "Paris"),
        ("  Paris.  ", "Paris."),
    ],
)
def test_final_answer(text, expected):
    assert final_answer(text) == expected


def test_normalize_answer():
    assert normalize_answer("  An  Apple, a day; THE end!") == "apple day end"


def test_qa_correct_defaults_and_garbage():
    completions = ["<answer>Federal Reserve Bank</answer>", "<answer>Paris</answer>", "<answer>Paris</answer>"]
    assert qa_correct(completions, answer=["Federal Reserve", None, 3]) == pytest.approx([1.6, 0.0, 0.0])
    assert qa_correct(completions[:1], answer=["Federal Reserve"], scale=1.0, metric="em") == [0.0]


def _episode(searches: int, answer: str) -> list[dict]:
    turns = [[{"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]},
              {"role": "tool", "name": "search", "content": "[1] Hexanova Labs ..."}] for _ in range(searches)]
    return [m for turn in turns for m in turn] + [{"role": "assistant", "content": f"<answer>{answer}</answer>"}]


@pytest.mark.parametrize(("searches", "answer", "min_tool_calls", "expected"), [
    (0, "Yes", 0, 1.0),            # the default: the answer alone counts
    (0, "Yes", 1, 0.0),            # a guess without a search pays nothing
    (1, "Yes", 1, 1.0),
    (2, "No", 1, 0.0),             # searched, wrong
    (1, "Hexanova", 2, 0.0),       # one search where two are asked for
    (2, "Hexanova", 2, 2 / 3),     # F1 of "hexanova" against "hexanova labs" ... scale 1
])
def test_qa_correct_can_require_searches(searches, answer, min_tool_calls, expected):
    gold = "Yes" if answer in ("Yes", "No") else "Hexanova Labs"
    got = qa_correct([_episode(searches, answer)], answer=[gold], scale=1.0, min_tool_calls=min_tool_calls)
    assert got == [pytest.approx(expected)]
    assert qa_correct(["<answer>Yes</answer>"], answer=["Yes"], scale=1.0, min_tool_calls=1) == [0.0]  # plain text


def test_qa_correct_rejects_a_bad_metric_and_mismatched_columns():
    with pytest.raises(ValueError, match=r"unknown metric 'accuracy'; valid: em, f1"):
        qa_correct(["x"], answer=["x"], metric="accuracy")
    with pytest.raises(ValueError):
        qa_correct(["x", "y"], answer=["x"])


ANSWER_TAG_CASES = [
    ("<answer>Paris</answer>", 0.5),
    ("Both sources agree.\n<answer>Paris</answer>\n", 0.5),
    ("<answer>multi\nline</answer>", 0.5),
    ("<think>first <answer>Lyon</answer></think>So:\n<answer>Paris</answer>", 0.5),
    ("<answer>Paris</answer>\n<think>cut off", 0.5),
    ("<answer>Paris</answer>.", 0.0),
    ("<answer>Paris</answer> Hope this helps!", 0.0),
    ("<answer></answer>", 0.0),
    ("<answer> \n </answer>", 0.0),
    ("<answer>Paris</answer><answer>Lyon</answer>", 0.0),
    ("<answer>Paris <answer>Lyon</answer>", 0.0),
    ("<answer>Paris", 0.0),
    ("Paris</answer>", 0.0),
    ("</answer>Paris<answer>", 0.0),
    ("<ANSWER>Paris</ANSWER>", 0.0),
    ("Answer: Paris", 0.0),
    ("<think><answer>Paris</answer></think>", 0.0),
    ("", 0.0),
    (None, 0.0),
    ([SEARCH_CALL, tool("x"), assistant("<answer>Paris</answer>")], 0.5),
    ([SEARCH_CALL, tool("<answer>Paris</answer>"), assistant("Paris")], 0.0),
    ([SEARCH_CALL, tool("<answer>Paris</answer>")], 0.0),
    ([assistant("Paris", reasoning_content="<answer>Paris</answer>")], 0.0),
]


@pytest.mark.parametrize(("completion", "expected"), ANSWER_TAG_CASES)
def test_answer_tag_format(completion, expected):
    assert answer_format([completion], form="answer_tag", prompts=["q"], trainer_state=None) == [expected]
    assert answer_tag_format([completion], score=1.0) == [2 * expected]


def test_answer_format_is_registered_with_its_forms():
    reward = resolve_reward("answer_format", {"form": "answer_tag"})
    assert reward.__name__ == "answer_format"
    assert reward(completions=["<answer>Paris</answer>", "#### 42"], prompts=["q", "q"]) == [0.5, 0.0]
    assert pickle.loads(pickle.dumps(reward))(completions=["<answer>Paris</answer>"]) == [0.5]
    scored = resolve_reward("answer_format", {"form": "answer_tag", "score": 0.2})
    assert scored(completions=["<answer>Paris</answer>"]) == [0.2]
    gsm8k = resolve_reward("answer_format", {"form": "gsm8k"})
    assert gsm8k(completions=["#### 42", "#### 42 apples", "<answer>42</answer>"]) == [1.0, 0.5, 0.0]
    assert resolve_reward("qa_correct") is REWARDS["qa_correct"] is qa_correct


def test_answer_format_rejects_unknown_forms_and_a_score_for_gsm8k():
    with pytest.raises(ValueError, match=r"unknown form 'xml'; valid: answer_tag, gsm8k"):
        answer_format(["x"], form="xml")
    with pytest.raises(ValueError, match=r"`score` applies to form='answer_tag' only"):
        answer_format(["#### 4"], score=0.5)


_pieces = st.sampled_from(["<answer>", "</answer>", "<think>", "</think>", "Answer:", "\n", " ", "a", "."])
_texts = st.lists(_pieces, max_size=12).map("".join)


@given(completion=st.one_of(_texts, st.builds(lambda t: [assistant(t)], _texts), st.none()), gold=_texts)
def test_rewards_never_raise_and_stay_in_range(completion, gold):
    assert 0.0 <= qa_correct([completion], answer=[gold])[0] <= 2.0
    assert answer_format([completion], form="answer_tag")[0] in (0.0, 0.5)


def test_docstring_examples():
    assert doctest.testmod(rlkit.rewards.qa).failed == 0
