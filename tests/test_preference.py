"""Preference data: every accepted shape becomes explicit prompt/chosen/rejected; bad rows fail by row number."""

import json

import datasets
import pytest

from rlkit.data import load_preference_rows
from rlkit.data.hh_rlhf import transcript
from rlkit.data.preference import normalize
from rlkit.errors import UserError
from rlkit.recipe import DataSource


def U(text):
    return {"role": "user", "content": text}


def A(text):
    return {"role": "assistant", "content": text}


NORMALIZE_CASES = [
    pytest.param({"prompt": "Q: 2+2?", "chosen": " 4", "rejected": " 5"},
                 {"prompt": "Q: 2+2?", "chosen": " 4", "rejected": " 5"}, id="explicit-strings"),
    pytest.param({"prompt": [U("2+2?")], "chosen": [A("4")], "rejected": [A("5")]},
                 {"prompt": [U("2+2?")], "chosen": [A("4")], "rejected": [A("5")]}, id="explicit-messages"),
    pytest.param({"prompt": [U("2+2?")], "chosen": "4", "rejected": "5"},
                 {"prompt": [U("2+2?")], "chosen": [A("4")], "rejected": [A("5")]}, id="chat-prompt-string-answers"),
    pytest.param({"chosen": "Same start, then yes.", "rejected": "Same start, then no."},
                 {"prompt": "Same start, then", "chosen": " yes.", "rejected": " no."}, id="implicit-strings"),
    pytest.param({"chosen": "\n\nHuman: hi\n\nAssistant: yo", "rejected": "\n\nHuman: hi\n\nAssistant: no"},
                 {"prompt": "\n\nHuman: hi\n\nAssistant:", "chosen": " yo", "rejected": " no"}, id="implicit-hh-text"),
    pytest.param({"chosen": [U("2+2?"), A("4")], "rejected": [U("2+2?"), A("5")]},
                 {"prompt": [U("2+2?")], "chosen": [A("4")], "rejected": [A("5")]}, id="implicit-messages"),
    pytest.param({"chosen": [U("a"), A("b"), U("c"), A("d")], "rejected": [U("a"), A("b"), U("c"), A("e")]},
                 {"prompt": [U("a"), A("b"), U("c")], "chosen": [A("d")], "rejected": [A("e")]}, id="implicit-multi-turn"),
    pytest.param({"prompt": "p", "chosen": "a", "rejected": "b", "score": 3, "id": "x"},
                 {"prompt": "p", "chosen": "a", "rejected": "b"}, id="extra-columns-dropped"),
]


@pytest.mark.parametrize(("row", "expected"), NORMALIZE_CASES)
def test_normalize_makes_prompts_explicit(row, expected):
    out = normalize(datasets.Dataset.from_list([row]))
    assert sorted(out.column_names) == ["chosen", "prompt", "rejected"]
    assert dict(out[0]) == expected


BAD_ROWS = [
    pytest.param({"prompt": "p", "chosen": "", "rejected": "b"}, "row 0: `chosen` is empty", id="empty-chosen"),
    pytest.param({"prompt": "p", "chosen": "a", "rejected": 7}, "row 0: `rejected` must be a string", id="number"),
    pytest.param({"prompt": "p", "chosen": [A("a")], "rejected": [A("b")]}, "row 0: a plain-text `prompt` needs",
                 id="text-prompt-chat-answers"),
    pytest.param({"chosen": "a", "rejected": [A("b")]}, "row 0: `chosen` and `rejected` must both be", id="mixed"),
    pytest.param({"prompt": 3, "chosen": "a", "rejected": "b"}, "row 0: `prompt` must be a string", id="prompt-number"),
    pytest.param({"prompt": "p", "chosen": [{"text": "a"}], "rejected": "b"}, "row 0: `chosen` must be a string or",
                 id="not-messages"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_ROWS)
def test_bad_rows_name_the_row(bad, message):
    with pytest.raises(UserError) as info:
        normalize(datasets.Dataset.from_list([bad]), "pairs.jsonl")
    assert str(info.value).startswith("pairs.jsonl: ") and message in str(info.value)


def test_a_bad_row_after_good_ones_is_found(tmp_path):
    rows = [{"prompt": "p", "chosen": "a", "rejected": "b"}] * 2500 + [{"prompt": "p", "chosen": "a", "rejected": ""}]
    with pytest.raises(UserError, match="row 2500: `rejected` is empty"):
        normalize(datasets.Dataset.from_list(rows))


TRANSCRIPTS = [
    ("\n\nHuman: Hi?\n\nAssistant: Hello.", [U("Hi?"), A("Hello.")]),
    ("Human: Hi?\n\nAssistant: Hello.", [U("Hi?"), A("Hello.")]),  # leading newlines missing
    ("\n\nHuman: a\n\nAssistant: b\n\nHuman: c\n\nAssistant: d", [U("a"), A("b"), U("c"), A("d")]),
    ("\n\nHuman: a\n\nAssistant:", [U("a"), A("")]),  # empty final answer still parses
    ("\n\nHuman: 2\n\nHuman: x\n\nAssistant: y", None),  # two user turns in a row
    ("\n\nHuman: only a question", None),  # no assistant turn
    ("\n\nAssistant: hi\n\nHuman: x", None),  # starts with the assistant
    ("no roles at all", None),
    ("", None),
    (None, None),
    ("junk before\n\nHuman: a\n\nAssistant: b", None),
]


@pytest.mark.parametrize(("text", "expected"), TRANSCRIPTS)
def test_hh_transcripts(text, expected):
    assert transcript(text) == expected


def test_hh_rows_keep_parsable_pairs_only(tmp_path):
    rows = [
        {"chosen": "\n\nHuman: 1+1?\n\nAssistant: 2", "rejected": "\n\nHuman: 1+1?\n\nAssistant: 3"},
        {"chosen": "\n\nHuman: a\n\nAssistant: b", "rejected": "\n\nHuman: OTHER\n\nAssistant: c"},  # prompts differ
        {"chosen": "garbage", "rejected": "\n\nHuman: a\n\nAssistant: b"},
        {"chosen": "\n\nHuman: q\n\nAssistant: same", "rejected": "\n\nHuman: q\n\nAssistant: same"},  # no preference
    ]
    path = tmp_path / "hh.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = load_preference_rows("hh_rlhf", DataSource(path=str(path)))
    assert len(ds) == 1
    assert ds[0] == {"prompt": [U("1+1?")], "chosen": [A("2")], "rejected": [A("3")]}
    path.write_text(json.dumps(rows[2]) + "\n")
    with pytest.raises(UserError, match="no row parsed"):
        load_preference_rows("hh_rlhf", DataSource(path=str(path)))


def test_generated_pairs_for_each_task():
    for task in ("preference", "hh_rlhf", "gsm8k"):
        ds = load_preference_rows(task, DataSource(synthetic=6, seed=3))
        assert len(ds) == 6 and sorted(ds.column_names) == ["chosen", "prompt", "rejected"]
        for row in ds:
            assert isinstance(row["prompt"], list) and row["chosen"] != row["rejected"]
            assert row["chosen"][-1]["role"] == row["rejected"][-1]["role"] == "assistant"
    gsm = load_preference_rows("gsm8k", DataSource(synthetic=20, seed=0))
    from rlkit.rewards.math import extract_answer

    for row in gsm:  # the rejected answer is the chosen one plus one
        right = int(extract_answer(row["chosen"][0]["content"]))
        assert extract_answer(row["rejected"][0]["content"]) == str(right + 1)


def test_gsm8k_dpo_reads_a_pairs_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    pair = {"answer": "4", "prompt": [U("2+2?")], "chosen": [A("#### 4")], "rejected": [A("#### 5")],
            "chosen_reward": 1.2, "rejected_reward": 0.2}
    path.write_text(json.dumps(pair) + "\n")
    ds = load_preference_rows("gsm8k", DataSource(path=str(path)))
    assert ds[0] == {"prompt": [U("2+2?")], "chosen": [A("#### 4")], "rejected": [A("#### 5")]}
    path.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n")
    with pytest.raises(UserError, match="missing column"):
        load_preference_rows("gsm8k", DataSource(path=str(path)))


def test_task_without_pairs_is_refused():
    with pytest.raises(UserError, match="has no preference pairs"):
        load_preference_rows("sft", DataSource(synthetic=2))
