"""The pieces of the real-model demo that need no model: held-out problem families, GSM8K's easiest items,
the two-shot prompt, the demo's eval sets. (The training itself is measured by `make demo`, not here.)"""

import json
import re

import datasets
import pytest
import yaml

from rlkit.data import arith, gsm8k
from rlkit.demos.arith import MODELS, QUICK, control_overrides, easiest_gsm8k, eval_sets, format_share, train_minutes
from rlkit.evaluate.suite import load_suite
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
    quick, full = eval_sets(gsm), eval_sets(gsm, full=True)
    assert [slug for _, slug, _ in quick] == list(QUICK)  # `make demo`: the box and three sets outside it
    assert len(full) == len(load_suite("arith").sets) + len(load_suite("robust").sets) + 1  # ..., then GSM8K
    assert len(eval_sets(None, full=True)) == len(full) - 1
    assert len({slug for _, slug, _ in full}) == len(full)  # one results file per set
    recipe = recipes_dir() / "smol_arith_grpo.yaml"
    base = load_recipe(recipe, [])
    loaded = {slug: load_recipe(recipe, extra) for _, slug, extra in full}
    assert loaded["other-wording"].data.eval.generator["wording"] == "other"
    assert loaded["bare"].data.prompt == "bare" and loaded["alt-prompt"].data.prompt == "alt"
    assert loaded["ask-mix"].data.prompt == "ask-mix" and loaded["robust-after-hash"].data.prompt == "ask-after-hash"
    assert loaded["gsm8k-easiest"].data.eval.path == str(gsm) and loaded["gsm8k-easiest"].data.prompt == "short"
    # the demo's old held-out set is the suite's `box`: other draws than training's, 100 of them
    box = loaded["box"].data.eval
    train = set(gsm8k.generate(base.data.train.synthetic, seed=base.data.train.seed, **base.data.train.generator)["question"])
    held = gsm8k.generate(box.synthetic, seed=box.seed, **box.generator)["question"]
    assert len(held) == 100 and sum(q in train for q in held) <= 5


def test_the_control_continues_sft_on_grpos_problems_until_the_time_limit(tmp_path):
    recipe, sft = recipes_dir() / "smol_arith_grpo.yaml", recipes_dir() / "smol_arith_sft.yaml"
    grpo = load_recipe(recipe)
    control = load_recipe(sft, control_overrides([], tmp_path / "sft", grpo.data.train.model_dump(exclude_defaults=True)))
    assert control.init_from == str(tmp_path / "sft") and control.algorithm == "sft"
    assert control.data.train == grpo.data.train and control.data.prompt == grpo.data.prompt  # the same pool
    assert control.trainer["lr_scheduler_type"] == "constant" and control.trainer["max_steps"] >= 10_000
    assert control.trainer["learning_rate"] == load_recipe(sft).trainer["learning_rate"]


def test_format_share_counts_replies_ending_with_the_answer_line():
    results = {"examples": [{"completion": "3 + 4 = 7\n#### 7"}, {"completion": "#### 7\nDone."},
                            {"completion": "7"}, {"completion": "2 + 2 = 4\n#### 4\n"}]}
    assert format_share(results) == 0.5


@pytest.mark.report
def test_demo_runs_every_stage_and_reports_each_against_the_one_before(tmp_path):
    """The real demo's wiring, on the tiny model with one SFT and one GRPO step (the numbers are `make demo`'s
    job): base, SFT, GRPO and the equal-time control on every set, the paired gains, GRPO and the control both
    continuing from the SFT adapter, the control trained no longer than GRPO."""
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
    summary = run_demo(tmp_path / "demo", data, tiny, limit=3, grpo_overrides=grpo, full=True)
    slugs = [slug for _, slug, _ in eval_sets(gsm, full=True)]
    assert [r["n"] for r in summary["rows"]] == [3] * len(slugs) + [3 * len(load_suite("robust").sets)]  # + pooled
    assert summary["rows"][-1]["set"] == "ask: all ten (pooled)"
    for r in summary["rows"]:
        assert all(0 <= r[m]["accuracy"] <= 1 and 0 <= r[m]["degenerate"] <= 1 for m in MODELS)
        assert r["base"]["interval"] == pytest.approx(wilson(round(r["base"]["accuracy"] * r["n"]), r["n"]))
        for key, (before, after) in {"SFT - base": ("base", "SFT"), "GRPO - SFT": ("SFT", "GRPO"),
                                     "GRPO - base": ("base", "GRPO"), "GRPO - control": ("SFT continued", "GRPO")}.items():
            gain = r[key]  # paired on the same problems: exact McNemar for right/wrong
            assert gain["test"] == "mcnemar"
            assert gain["diff"] == pytest.approx(r[after]["accuracy"] - r[before]["accuracy"])
            assert gain["low"] <= gain["diff"] <= gain["high"] and 0 <= gain["p"] <= 1
    ifeval = (data / "ifeval" / "input_data.jsonl").is_file()
    assert [s["stage"] for s in summary["stages"]] == ["model build / cache check", "base eval", "SFT training",
                                                       "SFT eval", "GRPO training", "GRPO eval",
                                                       "SFT continued (control)", "control eval",
                                                       *(["IFEval check"] if ifeval else [])]
    demo = tmp_path / "demo"
    run, control = demo / "grpo", demo / "sft-continued"
    assert yaml.safe_load((run / "recipe.resolved.yaml").read_text())["init_from"] == str(demo / "sft")
    assert yaml.safe_load((control / "recipe.resolved.yaml").read_text())["init_from"] == str(demo / "sft")
    assert train_minutes(control) <= train_minutes(run) + 1  # stopped at GRPO's minutes (plus its last step)
    if ifeval:  # base -> SFT -> GRPO -> control on the demo's first `limit` IFEval prompts, in demo.json and the report
        assert [(r["role"], r["n"]) for r in summary["ifeval"]["rows"]] == [(m, 3) for m in MODELS]
        # each model against the base, then what GRPO cost: against its SFT and against the same minutes of SFT
        assert [(c["role"], c["against"]) for c in summary["ifeval"]["comparisons"]] == [
            ("SFT", "base"), ("GRPO", "base"), ("SFT continued", "base"), ("GRPO", "SFT"), ("GRPO", "SFT continued")]
        assert "## General ability: IFEval" in (run / "report.md").read_text()
    assert sorted(p.name for p in (run / "eval").glob("*.json")) == sorted(
        f"{tag}-{slug}.json" for tag in ("base", "sft", "grpo", "control") for slug in slugs)
    report = (run / "report.md").read_text()
    assert "base-other-wording.json" in report and "grpo-gsm8k-easiest.json" in report
    assert json.loads((demo / "demo.json").read_text())["rows"] == summary["rows"]


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
