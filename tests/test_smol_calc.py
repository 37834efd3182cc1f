"""The calculator-agent recipes for SmolLM2-135M: generated problems, oracle SFT trajectories rendered with
exact tool masks on the real tokenizer, and one SFT step that changes the LoRA. (The gains themselves are
measured by `make demo-calc`, not here.)"""

import json
import re

import pytest

from rlkit.data import calc, get_task, load_rows, task_rows
from rlkit.envs.calculator import evaluate
from rlkit.recipe import load_recipe, recipes_dir
from rlkit.rewards.math import gsm8k_correct

from .conftest import SHARED_DATA

SFT = recipes_dir() / "smol_calc_sft.yaml"
GRPO = recipes_dir() / "smol_calc_grpo.yaml"


def _words(rows) -> set[str]:
    return {w.lower() for q in rows["question"] for w in re.findall(r"[A-Za-z]+", q)}


@pytest.mark.parametrize("wording", ["classic", "other"])
def test_problems_need_multi_digit_arithmetic_and_their_answers_are_right(wording):
    rows = calc.generate(300, seed=0, wording=wording)
    for row in rows:
        expression, _, total = row["answer"].splitlines()[0].partition(" = ")
        a, op, b = expression.split()
        assert evaluate(expression) == int(total) >= 0 and row["answer"].endswith(f"#### {total}")
        assert re.findall(r"\d+", row["question"]) in ([a, b], [b, a])  # the question holds both numbers
        assert (len(a), len(b)) == ((3, 2) if op == "*" else (4, 4))
    assert gsm8k_correct(list(rows["answer"]), answer=list(rows["answer"])) == [1.0] * 300
    ops = [r.splitlines()[0].split()[1] for r in rows["answer"]]
    assert all(60 < ops.count(op) < 140 for op in "*+-")
    assert calc.generate(5, seed=4, wording=wording).to_list() == calc.generate(5, seed=4, wording=wording).to_list()


@pytest.mark.parametrize("wording", ["classic", "other"])
@pytest.mark.parametrize("size, digits", [("small", {"*": (2, 1), "+-": (3, 3)}), ("large", {"*": (4, 3), "+-": (5, 5)})])
def test_size_sets_the_operands_digits(wording, size, digits):
    for row in calc.generate(200, seed=1, wording=wording, size=size):
        expression, _, total = row["answer"].splitlines()[0].partition(" = ")
        a, op, b = expression.split()
        assert evaluate(expression) == int(total) >= 0
        assert (len(a), len(b)) == digits["*" if op == "*" else "+-"]
        assert re.findall(r"\d+", row["question"]) in ([a, b], [b, a])


@pytest.mark.parametrize("wording", ["classic", "other"])
def test_two_step_problems_are_one_expression_of_three_numbers_in_the_question(wording):
    rows = calc.generate(300, seed=2, wording=wording, steps=2)
    shapes = set()
    for row in rows:
        expression, _, total = row["answer"].splitlines()[0].partition(" = ")
        a, first, b, second, c = expression.split()
        shapes.add(f"{first} {second}")
        assert evaluate(expression) == int(total) > 0 and row["answer"].endswith(f"#### {total}")
        assert re.findall(r"\d+", row["question"]) == [a, b, c]  # in the order the expression uses them
    assert shapes == {"* -", "* +", "+ -"}
    assert gsm8k_correct(list(rows["answer"]), answer=list(rows["answer"])) == [1.0] * 300
    with pytest.raises(ValueError, match="steps must be 1 or 2"):
        calc.generate(2, steps=3)
    with pytest.raises(ValueError, match="size must be one of small, standard, large"):
        calc.generate(2, size="huge")


def test_the_alternative_worked_turns_solve_their_problems_and_differ_from_the_training_ones():
    alt, classic = calc.SHOTS["calculator-alt"], calc.SHOTS["calculator"]
    for call, result, answer in zip(alt[1::4], alt[2::4], alt[3::4], strict=True):
        expression = call["tool_calls"][0]["function"]["arguments"]["expression"]
        assert str(evaluate(expression)) == result["content"] and answer["content"] == f"#### {result['content']}"
    assert not {t["content"] for t in alt if t["role"] == "user"} & {t["content"] for t in classic if t["role"] == "user"}
    assert calc.chat_prompt("Q?", "calculator-zero") == [{"role": "system", "content": calc.PROMPTS["calculator"]},
                                                          {"role": "user", "content": "Q?"}]


def test_other_wording_shares_no_name_thing_or_question_with_the_training_family():
    classic, other = calc.generate(300, seed=0), calc.generate(300, seed=0, wording="other")
    assert not {w.lower() for w in calc._NAMES + calc._ITEMS} & _words(other)
    assert not set(other["question"]) & set(classic["question"])
    with pytest.raises(ValueError, match="wording"):
        calc.generate(2, wording="pirate")


def test_recipes_load_and_use_the_calc_task_with_the_calculator():
    sft, grpo = load_recipe(SFT, []), load_recipe(GRPO, [])
    evals = {}
    for recipe in (sft, grpo):
        assert get_task(recipe.data.task) is calc and recipe.env.name == "calculator"
        rows = task_rows(recipe, "eval", load_rows("calc", recipe.data.eval))
        assert {r["prompt"][0]["content"] for r in rows} == {calc.PROMPTS["calculator"]}
        assert len(rows) == 100 and all(r["answer"].isdigit() for r in rows)
        evals[recipe.algorithm] = [(r["prompt"], r["answer"]) for r in rows]
    assert evals["sft"] == evals["grpo"]  # one held-out split, the same prompts and answers for both
    recipe = grpo
    train = set(calc.generate(recipe.data.train.synthetic, seed=recipe.data.train.seed)["question"])
    assert not train & set(calc.generate(100, seed=recipe.data.eval.seed)["question"])


def test_the_worked_turns_solve_their_problems_with_the_calculator():
    shots = calc.SHOTS["calculator"]
    for call, result, answer in zip(shots[1::4], shots[2::4], shots[3::4], strict=True):
        expression = call["tool_calls"][0]["function"]["arguments"]["expression"]
        assert str(evaluate(expression)) == result["content"] and answer["content"] == f"#### {result['content']}"


def test_sft_trajectories_render_with_exact_tool_masks(smollm2_dir):
    """Assistant-only loss learns each assistant turn (the calls and the answers), never a tool result."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    recipe = load_recipe(SFT, [])
    rows = task_rows(recipe, "sft", calc.generate(3, seed=5))
    for row, problem in zip(rows, calc.generate(3, seed=5), strict=True):
        expression, _, total = problem["answer"].splitlines()[0].partition(" = ")
        tools = json.loads(row["tools"])
        assert [t["function"]["name"] for t in tools] == ["calculate"]
        out = tok.apply_chat_template(row["messages"], tools=tools, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        learned = tok.decode([i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m])

        def turn(expr, result):
            call = json.dumps({"name": "calculate", "arguments": {"expression": expr}})
            return f"<tool_call>\n{call}\n</tool_call><|im_end|>#### {result}<|im_end|>"

        assert learned == turn("215 * 36", "7740") + turn("1348 + 2596", "3944") + turn(expression, total)


def test_grpo_completion_budget_holds_a_whole_solved_episode(smollm2_dir):
    """TRL's tool loop counts the tool result and the next assistant header against
    `max_completion_length` and cuts the answer at it, so the budget must hold the call, the result and
    `#### N<|im_end|>` of every training problem (at 64 tokens no episode could reach its answer: the
    correctness reward was 0 for every sample and GRPO unlearned the SFT warm-up)."""
    from transformers import AutoTokenizer

    from rlkit.envs import class_tool_schemas
    from rlkit.envs.calculator import CalculatorEnv

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    recipe = load_recipe(GRPO, [])
    tools = class_tool_schemas(CalculatorEnv)
    problems = calc.generate(300, seed=recipe.data.train.seed)
    prompt_lengths, episode_lengths = [], []
    for row, problem in zip(task_rows(recipe, "grpo", problems), problems, strict=True):
        expression, _, total = problem["answer"].splitlines()[0].partition(" = ")
        episode = calc.worked_turns(problem["question"], expression, total)[1:]
        prompt = tok.apply_chat_template(row["prompt"], tools=tools, add_generation_prompt=True, tokenize=True,
                                         return_dict=False)
        whole = tok.apply_chat_template(row["prompt"] + episode, tools=tools, tokenize=True, return_dict=False)
        assert whole[:len(prompt)] == prompt
        completion = whole[len(prompt):]
        ends = [i for i, t in enumerate(completion) if t == tok.eos_token_id]
        prompt_lengths.append(len(prompt))
        episode_lengths.append(ends[-1] + 1)
    budget = recipe.trainer["max_completion_length"]
    assert max(episode_lengths) <= budget, f"a solved episode takes up to {max(episode_lengths)} tokens"
    assert max(prompt_lengths) + budget <= recipe.model.max_seq_length  # no prompt dropped for room


@pytest.mark.slow  # one real SFT step of a 135M model on CPU
@pytest.mark.timeout(300)
def test_one_sft_step_changes_the_lora(smollm2_dir, tmp_path):
    import torch

    from rlkit.train import build_trainer

    # float32: the recipe's bf16 is emulated on a CPU without bf16 units, where this one step took 268 s of a 300 s limit
    recipe = load_recipe(SFT, ["data.train.synthetic=2", "trainer.max_steps=1", "trainer.per_device_train_batch_size=2",
                               "trainer.learning_rate=1e-2", "trainer.save_steps=1", "model.dtype=float32"])
    trainer, _ = build_trainer(recipe, tmp_path)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert before and any(not torch.equal(before[n], after[n].detach()) for n in before)
    assert trainer.state.log_history[0]["loss"] > 0


@pytest.mark.report
def test_calc_demo_runs_every_stage_and_reports_the_three_models_side_by_side(tmp_path):
    """`make demo-calc`'s wiring, on the tiny model with one SFT and one GRPO step (the numbers are the demo's job)."""
    from rlkit.demos.calc import run_calc_demo

    tiny = ["model.name_or_path=rlkit/tiny-qwen3", "model.dtype=float32", "data.eval.synthetic=3",
            "data.train.synthetic=8", "trainer.max_steps=1", "trainer.save_steps=1", "model.max_seq_length=1024",
            "trainer.per_device_train_batch_size=4", "eval.max_new_tokens=8", "eval.ifeval.limit=3",
            "eval.ifeval.max_new_tokens=8"]
    summary = run_calc_demo(tmp_path / "demo", tiny, ["trainer.num_generations=2", "trainer.max_completion_length=16"],
                            data_dir=SHARED_DATA if SHARED_DATA.is_dir() else None)
    assert [r["n"] for r in summary["rows"]] == [3, 3]
    models = ("base", "SFT", "GRPO", "SFT continued")
    for r in summary["rows"]:
        assert all(0 <= r[m][k] <= 1 for m in models for k in ("accuracy", "tool_share"))
        assert r["SFT"]["interval"][0] <= r["SFT"]["accuracy"] <= r["SFT"]["interval"][1]
        for key, before in (("GRPO - SFT", "SFT"), ("GRPO - base", "base"), ("GRPO - control", "SFT continued")):
            assert r[key]["diff"] == pytest.approx(r["GRPO"]["accuracy"] - r[before]["accuracy"])
            assert 0 <= r[key]["p"] <= 1
    assert [s["stage"] for s in summary["stages"]] == ["model build / cache check", "base eval", "SFT training",
                                                       "SFT eval", "GRPO training", "GRPO eval",
                                                       "SFT continued (control)", "control eval",
                                                       *(["IFEval check"] if (SHARED_DATA / "ifeval").is_dir() else [])]
    run, control = tmp_path / "demo" / "grpo", tmp_path / "demo" / "sft-continued"
    assert f"init_from: {tmp_path / 'demo' / 'sft'}" in (run / "recipe.resolved.yaml").read_text()  # GRPO continued SFT
    assert f"init_from: {tmp_path / 'demo' / 'sft'}" in (control / "recipe.resolved.yaml").read_text()
    assert "max_steps: 100000" in (control / "recipe.resolved.yaml").read_text()  # ended by GRPO's minutes
    assert sorted(p.name for p in (run / "eval").glob("*.json")) == sorted(
        f"{tag}-{slug}.json" for tag in ("base", "sft", "grpo", "control") for slug in ("heldout", "newwording"))
    assert "sft-newwording.json" in (run / "report.md").read_text()
    assert json.loads((tmp_path / "demo" / "demo.json").read_text())["rows"] == summary["rows"]
