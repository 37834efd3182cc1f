"""bench/reward_only.py (GRPO against RFT in the same minutes): its settings are the recipes' own, and RFT's SFT rows
are exactly the distinct right samples, as the SFT stage will read them."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import reward_only  # noqa: E402


def test_every_stage_s_overrides_are_valid_and_sample_grpo_s_own_pool():
    from rlkit.recipe import load_recipe

    grpo = load_recipe(ROOT / reward_only.GRPO, reward_only.grpo_overrides(12, 1.5e-4, 1))
    assert grpo.init_from is None and grpo.data.prompt == "short"  # from the base, the two worked turns
    assert (grpo.trainer["learning_rate"], grpo.trainer["max_steps"], grpo.trainer["seed"]) == (1.5e-4, 12, 1)
    assert grpo.trainer["per_device_train_batch_size"] // grpo.trainer["num_generations"] == reward_only.PROMPTS_PER_STEP
    assert (grpo.trainer["num_generations"], grpo.trainer["temperature"]) == (reward_only.SAMPLES,
                                                                              reward_only.TEMPERATURE)
    # RFT samples the problems GRPO draws from: a change to the recipe's pool must reach the bench too.
    sampled = load_recipe(ROOT / reward_only.GRPO, reward_only.sampling_overrides())
    assert sampled.data.eval.model_dump(exclude_defaults=True) == grpo.data.train.model_dump(exclude_defaults=True)
    assert sampled.eval.max_new_tokens == grpo.trainer["max_completion_length"]  # the same completion budget
    # --pool: both arms on other problems, the same ones.
    pool = {"synthetic": 2000, "seed": 7, "generator": {"min_value": 10, "max_value": 99, "max_steps": 1}}
    other = load_recipe(ROOT / reward_only.GRPO, reward_only.grpo_overrides(12, 1.5e-4, 0, pool))
    drawn = load_recipe(ROOT / reward_only.GRPO, reward_only.sampling_overrides(pool))
    assert other.data.train.model_dump(exclude_defaults=True) == pool == drawn.data.eval.model_dump(exclude_defaults=True)
    rft = load_recipe(ROOT / reward_only.SFT, reward_only.rft_overrides(Path("/x/rft.jsonl"), 0))
    assert rft.algorithm == "sft" and rft.data.train.path == "/x/rft.jsonl" and rft.data.prompt == "short"
    assert rft.trainer["lr_scheduler_type"] == "constant" and rft.trainer["max_steps"] == 100000
    assert rft.init_from is None  # round 1 starts from the base; a later round from the last round's adapter
    later = reward_only.rft_overrides(Path("/x/rft-2.jsonl"), 0, Path("/x/rft-round1"))
    assert 'init_from="/x/rft-round1"' in later and later[:-1] != reward_only.rft_overrides(Path("/x/rft-2.jsonl"), 0)
    # Every stage runs as the demos do on this CPU: float32 where bf16 would be emulated (hours for 36 steps).
    from rlkit.backends import cuda_available
    from rlkit.inference.fastgen import cpu_has_native_bf16

    if cuda_available():  # the GPU's: the next test
        return
    native, sets = cpu_has_native_bf16(), reward_only.machine_sets()
    assert sets == reward_only.machine_sets(True) == (() if native else ("--set", "model.dtype=float32"))
    assert load_recipe(ROOT / reward_only.GRPO, [*reward_only.grpo_overrides(12, 1.5e-4, 1), *sets[1::2]]).model.dtype \
        == ("bfloat16" if native else "float32")


def test_on_a_gpu_every_stage_gets_what_gpu_smol_sets(monkeypatch):
    """SDPA attention everywhere, and GRPO's rollouts without the CPU's static cache: valid in both recipes."""
    import rlkit.backends
    from rlkit.recipe import load_recipe

    monkeypatch.setattr(rlkit.backends, "cuda_available", lambda: True)
    uncached = reward_only.machine_sets.__wrapped__
    both, grpo = uncached(), uncached(grpo=True)
    assert both == ("--set", "model.attn_implementation=sdpa")
    assert grpo == (*both, "--set", "trainer.cache_implementation=null")
    trained = load_recipe(ROOT / reward_only.GRPO, [*reward_only.grpo_overrides(12, 1.5e-4, 1), *grpo[1::2]])
    assert trained.model.attn_implementation == "sdpa" and trained.trainer["cache_implementation"] is None
    assert trained.model.dtype == "bfloat16"
    assert load_recipe(ROOT / reward_only.SFT, list(both[1::2])).model.attn_implementation == "sdpa"


def test_rft_rows_are_each_problem_s_distinct_right_samples_prompted_as_sampled():
    from rlkit.data import gsm8k

    records = [{"prompt": "Ann has 3 apples and buys 4. How many?", "samples": [
                   {"completion": "3 + 4 = 7\n#### 7", "correct": True},
                   {"completion": " 3 + 4 = 7\n#### 7 ", "correct": True},  # the same text: once
                   {"completion": "3 + 4 = 8\n#### 8", "correct": False},
                   {"completion": "4 + 3 = 7\n#### 7", "correct": True}]},
               {"prompt": "Bo has 9 pens and loses 2. How many?", "samples": [
                   {"completion": "9 - 2 = 6\n#### 6", "correct": False}] * 4}]
    rows = reward_only.right_rows(records)
    assert rows == [{"question": records[0]["prompt"], "answer": "3 + 4 = 7\n#### 7"},
                    {"question": records[0]["prompt"], "answer": "4 + 3 = 7\n#### 7"}]
    # `rlkit eval --samples` records the prompt's last message; in the short form that is the question itself, so
    # the SFT stage prompts each row as it was sampled and trains on the sample.
    prompt = gsm8k.chat_prompt(records[0]["prompt"], "short")
    assert prompt[-1] == {"role": "user", "content": records[0]["prompt"]}
    from datasets import Dataset

    sft = gsm8k.sft_rows(Dataset.from_list(rows), prompt="short")
    assert sft[0]["prompt"] == prompt and sft[1]["completion"] == [{"role": "assistant", "content": rows[1]["answer"]}]


def test_prompt_reaches_both_arms_and_rft_trains_each_row_in_the_form_it_was_sampled_in():
    """--prompt mix: GRPO, RFT's sampling and RFT's SFT all on `mix`, and a right sample's SFT row is asked the way
    the model was asked when it sampled it (the form a stable hash of the question picks)."""
    from datasets import Dataset

    from rlkit.data import load_rows, task_rows
    from rlkit.recipe import load_recipe

    grpo = load_recipe(ROOT / reward_only.GRPO, reward_only.grpo_overrides(12, 1.5e-4, 1, None, "mix"))
    sampled = load_recipe(ROOT / reward_only.GRPO, reward_only.sampling_overrides(None, "mix"))
    rft = load_recipe(ROOT / reward_only.SFT, reward_only.rft_overrides(Path("/x/rft.jsonl"), 0, None, "mix"))
    assert grpo.data.prompt == sampled.data.prompt == rft.data.prompt == "mix"
    problems = load_rows(sampled.data.task, sampled.data.eval).select(range(40))
    asked = [r["prompt"] for r in task_rows(sampled, "eval", problems)]
    rows = Dataset.from_list([{"question": q, "answer": "2 + 2 = 4\n#### 4"} for q in problems["question"]])
    assert [r["prompt"] for r in task_rows(rft, "sft", rows)] == asked
    assert {len(messages) for messages in asked} == {6, 2, 1}  # worked turns, the system line alone, the question


def test_a_bad_pool_ends_the_bench_with_rlkit_s_one_line_error_and_its_exit_code(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as stopped:
        reward_only.main(["--out", str(tmp_path / "run"), "--pool",
                          '{"synthetic": 10, "generator": {"max_valu": 5}}'])
    assert stopped.value.code == 2  # rlkit's exit code for a bad setting, passed on
    err = capsys.readouterr().err.strip().splitlines()  # (after the CPU's float32 line, where it is printed)
    assert [line for line in err if "rlkit" in line] == [err[-1]]
    assert err[-1].startswith("rlkit train failed (exit 2):") and "max_valu" in err[-1]
    assert not (tmp_path / "run" / "grpo").exists() and not (tmp_path / "run" / "summary.json").exists()


def test_the_table_pairs_each_arm_on_the_same_problems_with_the_difference_the_right_way_round(tmp_path):
    """table() reads the suite evals' folders; GRPO - RFT is GRPO's score less RFT's, per set and pooled."""
    import json

    from rlkit.evaluate.suite import load_suite

    sets = [s.name for s in load_suite("arith").sets]
    right = {"base-smollm2-135m-instruct": 1, "trained-grpo": 3, "trained-rft": 2}  # of 4 problems, per set
    rows: dict[str, list] = {"eval-grpo": [], "eval-rft": []}
    for folder, parent in (("base-smollm2-135m-instruct", "eval-grpo"), ("trained-grpo", "eval-grpo"),
                           ("trained-rft", "eval-rft")):
        (tmp_path / parent / folder).mkdir(parents=True)
        for name in sets:
            examples = [{"prompt": f"{name} {i}", "gold": str(i), "correct": i < right[folder]} for i in range(4)]
            (tmp_path / parent / folder / f"{name}.json").write_text(json.dumps({"examples": examples}))
        rows[parent].append({"role": folder.split("-")[0], "model": folder,
                             "sets": {name: {"results": f"elsewhere/{folder}/{name}.json"} for name in sets}})
    for parent, suite_rows in rows.items():  # what `rlkit eval --suite` writes beside the per-set results
        (tmp_path / parent / "suite.json").write_text(json.dumps(
            {"suite": "arith", "sets": [{"name": name} for name in sets], "rows": suite_rows}))
    lines = reward_only.table(tmp_path).strip().splitlines()
    assert len(lines) == 2 + len(sets) + 1
    box = [c.strip() for c in lines[2].strip("|").split("|")]
    assert box[:4] == [sets[0], "0.25", "0.75", "0.50"]
    assert box[4].startswith("+0.50") and box[5].startswith("+0.25") and box[6].startswith("+0.25")  # G-b, R-b, G-R
    pooled = [c.strip() for c in lines[-1].strip("|").split("|")]
    assert pooled[:4] == ["all, pooled", "0.250", "0.750", "0.500"] and pooled[6].startswith("+0.25")


def test_later_rft_rounds_sample_fresh_problems_of_the_same_generator():
    from rlkit.data import load_rows
    from rlkit.recipe import load_recipe

    pool = reward_only.POOL
    assert reward_only.round_pool(pool, 1) is pool  # round 1: GRPO's own pool, as with one round
    later = [reward_only.round_pool(pool, k) for k in (2, 3)]
    assert [p["seed"] for p in later] == [pool["seed"] + 1, pool["seed"] + 2] and pool["seed"] == 7
    assert all({k: v for k, v in p.items() if k != "seed"} == {k: v for k, v in pool.items() if k != "seed"}
               for p in later)
    recipes = [load_recipe(ROOT / reward_only.GRPO, reward_only.sampling_overrides(reward_only.round_pool(pool, k)))
               for k in (1, 2)]
    first, second = ({row["question"] for row in load_rows(r.data.task, r.data.eval).select(range(96))} for r in recipes)
    assert len(first) > 90 and len(first & second) < 10  # fresh problems


def test_grpo_from_a_folder_without_a_finished_run_is_a_one_line_error(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as stopped:
        reward_only.main(["--out", str(tmp_path / "run"), "--grpo-from", str(tmp_path), "--rft-rounds", "3"])
    assert stopped.value.code == 2
    assert "--grpo-from" in capsys.readouterr().err and not (tmp_path / "run").exists()
    # A summary that is not a finished run's, or flags the earlier run already fixed: one line, nothing written.
    (tmp_path / "summary.json").write_text('{"steps": 36, "lr": 0.00015, "seed": 1}')
    for extra, said in (([], "not a finished bench run's"), (["--seed", "2"], "drop --seed"),
                        (["--prompt", "mix"], "drop --prompt")):
        with pytest.raises(SystemExit) as stopped:
            reward_only.main(["--out", str(tmp_path / "run"), "--grpo-from", str(tmp_path), *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert stopped.value.code == 2 and said in err[-1] and not (tmp_path / "run").exists()
