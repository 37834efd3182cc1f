"""The pieces of the real-model demo that need no model: held-out problem families, GSM8K's easiest items,
the two-shot prompt, the demo's eval sets. (The training itself is measured by `make demo`, not here.)"""

import json
import re

import datasets
import pytest
import yaml

from rlkit.data import arith, gsm8k
from rlkit.demos.arith import easiest_gsm8k, eval_sets, format_share
from rlkit.recipe import load_recipe, recipes_dir
from rlkit.rewards.math import gsm8k_correct
from rlkit.stats import wilson

from .conftest import SHARED_DATA


def _words(rows) -> set[str]:
    return {w.lower() for q in rows["question"] for w in re.findall(r"[A-Za-z]+", q)}


def test_other_wording_is_a_disjoint_family_with_right_answers():
    classic = gsm8k.generate(300, seed=0, max_value=20, max_steps=1)
    other = gsm8k.generate(300, seed=0, max_value=20, max_steps=1, wording="other")
    # no name, thing or verb of the training family appears in the held-out family
    content = set(arith._NAMES + arith._ITEMS) | {"then", "buys", "finds", "gives", "loses", "eats", "sells", "now"}
    assert not {w.lower() for w in content} & _words(other)
    assert not set(other["question"]) & set(classic["question"])
    # every gold answer is the arithmetic of its own line, and that line uses the question's numbers
    for row in other:
        a, op, b, _, total = row["answer"].splitlines()[0].split()
        assert int(total) == (int(a) + int(b) if op == "+" else int(a) - int(b)) >= 0
        assert re.findall(r"\d+", row["question"]) == [a, b]
    assert gsm8k_correct(list(other["answer"]), answer=list(other["answer"])) == [1.0] * 300
    ops = [r.splitlines()[0].split()[1] for r in other["answer"]]
    assert 100 < ops.count("+") < 200  # both operations, about evenly
    assert gsm8k.generate(5, seed=4, wording="other")["question"] == gsm8k.generate(5, seed=4, wording="other")["question"]
    with pytest.raises(ValueError, match="wording"):
        gsm8k.generate(2, wording="pirate")


def test_classic_generator_unchanged_by_the_wording_argument():
    assert gsm8k.generate(10, seed=3).to_list() == gsm8k.generate(10, seed=3, wording="classic").to_list()


def test_easiest_orders_by_steps_then_question_length_then_file_order():
    rows = [
        {"question": "q" * 50, "answer": "a\nb\nc\n#### 1"},   # 3 steps
        {"question": "q" * 90, "answer": "a\nb\n#### 2"},      # 2 steps, long
        {"question": "q" * 20, "answer": "a\n\nb\n#### 3"},    # 2 steps (blank lines do not count), short
        {"question": "q" * 20, "answer": "a\nb\n#### 4"},      # tie with the row above: file order
        {"question": "q", "answer": "a\nb\nc\nd\n#### 5"},     # 4 steps, shortest question
    ]
    ds = datasets.Dataset.from_list(rows)
    assert [gsm8k.solution_steps(a) for a in ds["answer"]] == [3, 2, 2, 2, 4]
    assert [gsm8k.gold(a) for a in gsm8k.easiest(ds, 4)["answer"]] == ["3", "4", "2", "1"]


def test_easiest_gsm8k_file_round_trips(tmp_path):
    src = tmp_path / "test.jsonl"
    src.write_text("".join(json.dumps({"question": f"Q{i}" + "x" * (10 - i), "answer": "s\n" * (1 + i % 3) + f"#### {i}"})
                           + "\n" for i in range(9)))
    out = easiest_gsm8k(src, tmp_path / "easy" / "e.jsonl", n=3)
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [gsm8k.gold(r["answer"]) for r in got] == ["6", "3", "0"]  # one step each, shortest question first


def test_short_prompt_puts_the_worked_turns_between_system_and_question():
    messages = gsm8k.chat_prompt(" How many? ", "short")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert messages[-1]["content"] == "How many?"
    for shot in messages[2:5:2]:  # the examples answer in exactly the format the reward asks for
        assert gsm8k_correct([shot["content"]], answer=["7"]) == [1.0]
    assert [m["role"] for m in gsm8k.chat_prompt("x")] == ["system", "user"]  # other variants unchanged


def test_demo_eval_sets_are_valid_overrides_of_the_shipped_recipe(tmp_path):
    gsm = tmp_path / "easy.jsonl"
    gsm.write_text(json.dumps({"question": "q", "answer": "1 + 1 = 2\n#### 2"}) + "\n")
    sets = eval_sets(gsm)
    assert len(sets) == len(eval_sets(None)) + 1 >= 7  # the arith suite's sets, then GSM8K
    assert len({slug for _, slug, _ in sets}) == len(sets)  # one results file per set
    recipe = recipes_dir() / "smol_arith_grpo.yaml"
    base = load_recipe(recipe, [])
    loaded = {slug: load_recipe(recipe, extra) for _, slug, extra in sets}
    assert loaded["other-wording"].data.eval.generator["wording"] == "other"
    assert loaded["bare"].data.prompt == "bare" and loaded["alt-prompt"].data.prompt == "alt"
    assert loaded["gsm8k-easiest"].data.eval.path == str(gsm) and loaded["gsm8k-easiest"].data.prompt == "short"
    # the demo's old held-out set is the suite's `box`: other draws than training's, 100 of them
    box = loaded["box"].data.eval
    train = set(gsm8k.generate(base.data.train.synthetic, seed=base.data.train.seed, **base.data.train.generator)["question"])
    held = gsm8k.generate(box.synthetic, seed=box.seed, **box.generator)["question"]
    assert len(held) == 100 and sum(q in train for q in held) <= 5


def test_format_share_counts_replies_ending_with_the_answer_line():
    results = {"examples": [{"completion": "3 + 4 = 7\n#### 7"}, {"completion": "#### 7\nDone."},
                            {"completion": "7"}, {"completion": "2 + 2 = 4\n#### 4\n"}]}
    assert format_share(results) == 0.5


@pytest.mark.report
def test_demo_runs_every_stage_and_reports_each_against_the_one_before(tmp_path):
    """The real demo's wiring, on the tiny model with one SFT and one GRPO step (the numbers are `make demo`'s
    job): base, SFT and GRPO on every set, the paired gains, GRPO continuing from the SFT adapter."""
    from rlkit.demos.arith import run_demo

    data = tmp_path / "data"  # the demo's data folder: a small GSM8K test file, and IFEval's prompts when here
    (data / "gsm8k").mkdir(parents=True)
    if (SHARED_DATA / "ifeval").is_dir():
        (data / "ifeval").symlink_to(SHARED_DATA / "ifeval")
    gsm = data / "gsm8k" / "test.jsonl"
    gsm.write_text("".join(json.dumps({"question": f"{i} plus {i}?", "answer": f"a\nb\n#### {2 * i}"}) + "\n"
                           for i in range(5)))
    tiny = ["model.name_or_path=rlkit/tiny-qwen3", "model.dtype=float32", "data.eval.synthetic=3",
            "trainer.max_steps=1", "eval.max_new_tokens=8", "eval.ifeval.max_new_tokens=8"]
    grpo = ["trainer.num_generations=2", "trainer.per_device_train_batch_size=4", "trainer.max_completion_length=8"]
    summary = run_demo(tmp_path / "demo", data, tiny, limit=3, grpo_overrides=grpo)
    slugs = [slug for _, slug, _ in eval_sets(gsm)]
    assert [r["n"] for r in summary["rows"]] == [3] * len(slugs)
    for r in summary["rows"]:
        assert all(0 <= r[k] <= 1 for k in ("base", "sft", "grpo"))
        assert r["base_interval"] == pytest.approx(wilson(round(r["base"] * r["n"]), r["n"]))
        for key, (before, after) in {"sft_minus_base": ("base", "sft"), "grpo_minus_sft": ("sft", "grpo"),
                                     "grpo_minus_base": ("base", "grpo")}.items():
            gain = r[key]  # paired on the same problems: exact McNemar for right/wrong
            assert gain["test"] == "mcnemar" and gain["diff"] == pytest.approx(r[after] - r[before])
            assert gain["low"] <= gain["diff"] <= gain["high"] and 0 <= gain["p"] <= 1
    ifeval = (data / "ifeval" / "input_data.jsonl").is_file()
    assert [s["stage"] for s in summary["stages"]] == ["model build / cache check", "base eval", "SFT training",
                                                       "SFT eval", "GRPO training", "GRPO eval",
                                                       *(["IFEval check"] if ifeval else [])]
    run = tmp_path / "demo" / "grpo"
    assert yaml.safe_load((run / "recipe.resolved.yaml").read_text())["init_from"] == str(tmp_path / "demo" / "sft")
    if ifeval:  # base -> SFT -> GRPO on the demo's first `limit` IFEval prompts, in demo.json and the run's report
        assert [(r["role"], r["n"]) for r in summary["ifeval"]["rows"]] == [("base", 3), ("SFT", 3), ("GRPO", 3)]
        assert ("GRPO", "SFT") in [(c["role"], c["against"]) for c in summary["ifeval"]["comparisons"]]
        assert "## General ability: IFEval" in (run / "report.md").read_text()
    assert sorted(p.name for p in (run / "eval").glob("*.json")) == sorted(
        f"{tag}-{slug}.json" for tag in ("base", "sft", "grpo") for slug in slugs)
    report = (run / "report.md").read_text()
    assert "base-other-wording.json" in report and "grpo-gsm8k-easiest.json" in report
    assert json.loads((tmp_path / "demo" / "demo.json").read_text())["rows"] == summary["rows"]


def test_a_demo_reuses_an_existing_folder_without_claiming_it(tmp_path):
    """A demo's --output-dir that already exists is written into but never marked as rlkit's (the mark would
    let a later --overwrite delete the user's files); one the demo creates is marked."""
    from rlkit import safety
    from rlkit.demos.stages import prepare

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    assert prepare(tmp_path / "mine", []) == tmp_path / "mine"
    assert not (tmp_path / "mine" / safety.MARKER).exists()
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    assert (prepare(tmp_path / "new", []) / safety.MARKER).is_file()
