"""GSM8K task: local files, the synthetic generator, prompts, and the real test set when present."""

import json

import pytest

from rlkit.data import calc, gsm8k, load_rows
from rlkit.errors import UserError
from rlkit.recipe import DataSource
from rlkit.rewards.math import gsm8k_correct

from .conftest import SHARED_DATA


def test_generator_is_seeded_and_in_gsm8k_format():
    a, b, c = gsm8k.generate(20, seed=1), gsm8k.generate(20, seed=1), gsm8k.generate(20, seed=2)
    assert a.to_list() == b.to_list() and a.to_list() != c.to_list()
    for row in a:
        *lines, final = row["answer"].splitlines()
        assert final.startswith("#### ")
        # every step line is correct arithmetic and the last result is the answer
        for line in lines:
            lhs, rhs = line.split(" = ")
            assert eval(lhs) == int(rhs)  # noqa: S307  (test-only check of generated text)
        assert int(final[5:]) == int(lines[-1].split(" = ")[1])


def test_generator_arguments_bound_the_problems():
    rows = gsm8k.generate(50, seed=0, max_value=9, max_steps=1)
    assert all(len(r["answer"].splitlines()) == 2 for r in rows)
    with pytest.raises(UserError, match="data.generator"):
        load_rows("gsm8k", DataSource(synthetic=5, generator={"difficulty": 3}))
    # a knob's value the generator refuses: one line naming the knob and its choices, not a ValueError traceback
    for task, knob, message in (("calc", {"steps": 3}, "steps must be 1 or 2, not 3"),
                                ("calc", {"size": "huge"}, "size must be one of small, standard, large"),
                                ("gsm8k", {"wording": "pirate"}, "wording must be 'classic' or 'other'"),
                                ("gsm8k", {"max_steps": 0}, "max_steps must be at least 1, not 0"),
                                ("preference", {"max_value": 0}, "max_value must be at least 1, not 0"),
                                ("hh_rlhf", {"max_value": -3}, "max_value must be at least 1, not -3")):
        with pytest.raises(UserError, match=rf"^data.generator: {message}.*\(task '{task}'\)$"):
            load_rows(task, DataSource(synthetic=5, generator=knob))
    # multihop's knob reaches the corpus generator: too many articles is the same one-line error
    with pytest.raises(UserError, match=r"^data.generator: at most \d+ synthetic articles, got 100000"):
        load_rows("multihop_rag", DataSource(synthetic=5, generator={"articles": 100000}))
    # and so is the retrieval corpus's own size, named by its key
    from rlkit.recipe import RetrievalSpec
    from rlkit.retrieval.corpus import load_documents

    with pytest.raises(UserError, match=r"^retrieval.synthetic: at most \d+ synthetic articles, got 100000$"):
        load_documents(RetrievalSpec(synthetic=100000))


def test_a_bug_inside_a_generator_keeps_its_traceback(monkeypatch):
    """Only a refused knob (``BadValue``) becomes a one-line error; any other ValueError is a bug and stays one."""
    def broken(n, seed=0, **knobs):
        return int("not a number")

    # a refused knob is a ValueError to a Python caller of the generator
    with pytest.raises(ValueError, match="steps must be 1 or 2"):
        calc.generate(2, steps=3)
    monkeypatch.setattr(calc, "generate", broken)
    with pytest.raises(ValueError, match="invalid literal") as raised:
        load_rows("calc", DataSource(synthetic=5))
    assert not isinstance(raised.value, UserError)


def test_rows_for_sft_and_grpo():
    ds = gsm8k.generate(3, seed=0)
    sft = gsm8k.sft_rows(ds)
    assert sft.column_names == ["prompt", "completion"]
    assert sft[0]["prompt"][0] == {"role": "system", "content": gsm8k.SYSTEM_PROMPT}
    assert sft[0]["completion"][0]["role"] == "assistant"
    grpo = gsm8k.grpo_rows(ds)
    assert sorted(grpo.column_names) == ["answer", "prompt"]
    assert grpo[0]["answer"] == ds[0]["answer"].split("####")[-1].strip()


def test_solution_text_strips_calculator_annotations():
    assert gsm8k.solution_text("48/2 = <<48/2=24>>24 clips\n#### 72") == "48/2 = 24 clips\n#### 72"


def test_local_jsonl_and_parquet(tmp_path):
    rows = [{"question": "What is 2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4"}] * 3
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    ds = load_rows("gsm8k", DataSource(path=str(jsonl), limit=2))
    assert len(ds) == 2 and ds[0]["question"] == "What is 2+2?"
    ds.to_parquet(str(tmp_path / "d.parquet"))
    assert len(load_rows("gsm8k", DataSource(path=str(tmp_path / "d.parquet")))) == 2


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such data file"),
        ('{"question": "q"}', "missing column(s) answer"),
        ("", "the dataset is empty"),
        ("{not json", "line 1 is not valid JSON (Expecting property name enclosed in double quotes, column 2)"),
    ],
)
def test_bad_local_files(tmp_path, content, expected):
    path = tmp_path / "d.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_rows("gsm8k", DataSource(path=str(path)))


def test_hub_id_while_offline_is_a_user_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(UserError, match="openai/gsm8k"):
        load_rows("gsm8k", DataSource(path="openai/gsm8k", name="main", split="test"))


GSM8K_TEST = SHARED_DATA / "gsm8k" / "test.jsonl"


@pytest.mark.skipif(not GSM8K_TEST.is_file(), reason="../shared/data/gsm8k/test.jsonl not present")
def test_real_gsm8k_gold_solutions_all_score_correct():
    ds = load_rows("gsm8k", DataSource(path=str(GSM8K_TEST)))
    assert len(ds) > 1000
    rows = gsm8k.grpo_rows(ds)
    solutions = [gsm8k.solution_text(a) for a in ds["answer"]]
    scores = gsm8k_correct(solutions, answer=rows["answer"])
    assert sum(scores) == len(ds)
    # and as the conversational completions TRL passes
    scores = gsm8k_correct([[{"role": "assistant", "content": s}] for s in solutions[:200]], answer=rows["answer"][:200])
    assert sum(scores) == 200


def test_on_policy_prompts_use_the_recipes_prompt_variant():
    """`rlkit pairs` and PPO sample under the same system prompt (and worked turns) that training and eval use."""
    from rlkit.data import load_prompt_rows, load_rows, task_rows
    from rlkit.recipe import load_recipe, recipes_dir

    recipe = load_recipe(recipes_dir() / "gsm8k_dpo.yaml",
                         ["data.prompt=short", "pairs.prompts={synthetic: 3, seed: 0}"], smoke=True)
    sampled = load_prompt_rows(recipe, recipe.pairs.prompts)["prompt"]
    trained = task_rows(recipe, "grpo", load_rows("gsm8k", recipe.pairs.prompts))["prompt"]
    assert sampled == trained and len(sampled[0]) > 2  # the `short` prompt's worked turns are there


def test_set_applies_to_a_run_directorys_recorded_recipe(tmp_path):
    """`rlkit eval RUN_DIR --set data.eval...` evaluates on the set asked for, not silently on the recorded one."""
    import yaml

    from rlkit.inference.reference import resolve_target
    from rlkit.recipe import load_recipe, recipes_dir

    recipe = load_recipe(recipes_dir() / "smol_arith_grpo.yaml")
    (tmp_path / "recipe.resolved.yaml").write_text(yaml.safe_dump(recipe.model_dump(mode="json", exclude_none=True)))
    plain, run = resolve_target(tmp_path)
    asked, _ = resolve_target(tmp_path, ["data.eval.seed=777", "data.eval.generator.wording=other"])
    assert run == tmp_path and plain.data.eval.seed == 12345
    assert asked.data.eval.seed == 777 and asked.data.eval.generator["wording"] == "other"


def test_gsm8k_takes_a_prompt_file_or_text_with_the_worked_turns_data_shots_names(tmp_path):
    """`data.prompt: FILE` (what `rlkit optimize-prompt` writes) is the system line; its worked turns are those
    `data.shots` names, none by default; a name still picks a variant, and `data.shots` alone swaps the turns."""
    from rlkit.data import load_prompt_rows, task_rows
    from rlkit.recipe import load_recipe, recipes_dir

    arith = recipes_dir() / "smol_arith_grpo.yaml"
    (tmp_path / "arith.txt").write_text("Add or subtract, then write `#### N`.\n")

    def prompt(*overrides):
        recipe = load_recipe(arith, [*overrides, "data.eval={synthetic: 2, seed: 3}"])
        rows = task_rows(recipe, "grpo", load_rows("gsm8k", recipe.data.eval))
        assert load_prompt_rows(recipe, recipe.data.eval)["prompt"] == rows["prompt"]  # PPO and pairs see the same
        return rows[0]["prompt"]

    base = prompt("data.prompt=short")  # the recipe mixes forms (`mix`); `short` has the system line and turns
    assert [m["role"] for m in base] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert base[0]["content"] == gsm8k.PROMPTS["short"] and base[1:5] == gsm8k.SHOTS["short"]
    filed = prompt(f"data.prompt={tmp_path / 'arith.txt'}")
    assert filed == [{"role": "system", "content": "Add or subtract, then write `#### N`."}, base[-1]]
    kept = prompt(f"data.prompt={tmp_path / 'arith.txt'}", "data.shots=short")
    assert kept == [filed[0], *base[1:]]
    assert prompt("data.prompt='Solve it. End with #### N.'", "data.shots=alt")[1:5] == gsm8k.SHOTS["alt"]
    assert prompt("data.prompt=short", "data.shots=alt") == [base[0], *gsm8k.SHOTS["alt"], base[-1]]
    for overrides, expected in [
        (["data.shots=shrot"], "data.shots: no prompt variant 'shrot' with worked turns (did you mean 'short'?); "
                               "valid: short, alt"),
        (["data.prompt=shrot"], "data.prompt: task 'gsm8k' has no prompt 'shrot' (did you mean 'short'?)"),
        ([f"data.prompt={tmp_path / 'missing.txt'}"], "data.prompt: no such prompt file"),
    ]:
        with pytest.raises(UserError) as e:
            load_recipe(arith, overrides)
        assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(UserError, match="data.shots: task 'qa' takes no worked turns"):
        load_recipe(recipes_dir() / "hotpotqa_byod_grpo.yaml", ["data.shots=short"], smoke=True)
    with pytest.raises(UserError, match="data.shots: task 'calc' takes no worked turns"):
        load_recipe(recipes_dir() / "smol_calc_grpo.yaml", ["data.shots=calculator"])
