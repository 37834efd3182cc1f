"""GRPO's `sampling:` section: dynamic sampling (rlkit.trainers.dynamic) and the prompt pool (rlkit.doctor.learn),
on the tiny model with rewards (or scripted generations) that make known groups constant."""

import copy
import json
import math
import sys

import pytest
import torch

from rlkit.data import gsm8k
from rlkit.errors import UserError
from rlkit.recipe import load_recipe, recipes_dir
from rlkit.trainers import dynamic, grpo, trainer_config
from tests.helpers import script_and_capture

GRPO = recipes_dir() / "gsm8k_grpo.yaml"
CALCULATOR = recipes_dir() / "gsm8k_calculator_grpo.yaml"
# A prompt's class is its gold answer mod 3: 0 -> every completion earns 1, 1 -> every one 0, 2 -> 0, 1, 0, 1 by
# position in the batch (a group of 4 varies). The gold line itself earns 1 (what the doctor's reward card wants).
TABLE = '''
CONSTANT = False  # a test sets it: every completion earns 1


def table(completions, answer, **kwargs):
    if CONSTANT:
        return [1.0] * len(completions)
    out = []
    for i, (c, a) in enumerate(zip(completions, answer, strict=True)):
        text = c if isinstance(c, str) else c[-1]["content"]
        kind = int(a) % 3
        out.append(1.0 if text.rstrip().endswith(f"#### {a}") or kind == 0 else 0.0 if kind == 1 else float(i % 2))
    return out
'''
# TRL's advantage of a 0, 1, 0, 1 group with scale_rewards=group: (r - 0.5) / (std + 1e-4), std unbiased.
ADVANTAGE = 0.5 / (math.sqrt(1 / 3) + 1e-4)


@pytest.fixture
def table_rewards(tmp_path, monkeypatch):
    (tmp_path / "table_rewards.py").write_text(TABLE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("table_rewards", None)
    return "table_rewards"


@pytest.fixture(scope="module")
def table_trainer(tmp_path_factory):
    """One tiny GRPO trainer with dynamic sampling and the table reward, 4 groups of 4 (read-only apart from what a
    test resets: its metrics, `max_rounds`, the reward's CONSTANT flag)."""
    root = tmp_path_factory.mktemp("table")
    (root / "table_rewards.py").write_text(TABLE)
    sys.path.insert(0, str(root))
    sys.modules.pop("table_rewards", None)
    try:
        yield _trainer(root / "run", ["rewards=[{name: 'table_rewards:table'}]", "sampling.max_rounds=4"])
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("table_rewards", None)


@pytest.fixture
def draws(monkeypatch):
    """Every call of TRL's own `_generate_and_score_completions`: (inputs, output)."""
    from trl import GRPOTrainer

    seen = []
    original = GRPOTrainer._generate_and_score_completions

    def spy(self, inputs):
        out = original(self, inputs)
        seen.append((inputs, {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in out.items()}))
        return out

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", spy)
    return seen


def kind(row) -> int:
    return int(row["answer"]) % 3


# ---------------------------------------------------------------------------------------------
# The pieces, with numbers


def test_zero_variance_groups_follow_the_weighted_total():
    nan = math.nan
    rewards = torch.tensor([[1.0, 0.0]] * 4  # constant
                           + [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [1.0, 0.0]]  # varies
                           + [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]  # each varies, the total (w 1, 1) not
                           + [[nan, nan], [0.1, 0.0], [0.1, 0.0], [0.1, 0.0]]  # unscorable row left out: constant
                           + [[nan, nan], [nan, nan], [nan, nan], [0.3, 0.0]]  # one scorable completion
                           + [[nan, nan], [0.0, 0.0], [1.0, 0.0], [1.0, 0.0]])  # varies among the scorable
    mask = dynamic.zero_variance(rewards, torch.tensor([1.0, 1.0]), 4)
    assert mask.tolist() == [True, False, True, True, True, False]
    # weights change the total: with weight 0 on the second function the third group varies
    assert dynamic.zero_variance(rewards[8:12], torch.tensor([1.0, 0.0]), 4).tolist() == [False]


@pytest.mark.parametrize("masks, need, size", [
    ([[True, True, False, False]], 4, 4),   # 2 short, half the groups had signal: 4 prompts
    ([[True, False, False, False]], 4, 2),  # 1 short, 3 of 4 had signal: ceil(4 / 3) = 2
    ([[True, True, True, True]], 4, 4),     # no signal yet: a whole batch's worth
    ([[True] * 8, [True, False]], 8, 8),    # 7 short, 1 of 10: capped at the batch's 8
])
def test_refill_size(masks, need, size):
    assert dynamic.refill_size(masks, need) == size


def test_choose_takes_signal_in_draw_order_then_the_first_draw_s_dropped_groups():
    masks = [[True, False, True], [False, True]]
    assert dynamic.choose(masks, 3) == [(0, 1), (1, 0), (0, 0)]
    assert dynamic.choose(masks, 2) == [(0, 1), (1, 0)]


def test_merge_pads_each_side_and_counts_loss_tokens():
    first = {"prompt_ids": torch.tensor([[9, 1], [9, 2], [3, 4], [5, 6]]),
             "prompt_mask": torch.tensor([[0, 1], [0, 1], [1, 1], [1, 1]]),
             "completion_ids": torch.tensor([[7], [8], [7], [8]]), "completion_mask": torch.ones(4, 1, dtype=torch.long),
             "tool_mask": torch.ones(4, 1, dtype=torch.long), "advantages": torch.tensor([1.0, -1.0, 0.0, 0.0]),
             "num_items_in_batch": torch.tensor(4)}
    second = {"prompt_ids": torch.tensor([[1, 2, 3], [1, 2, 4]]), "prompt_mask": torch.ones(2, 3, dtype=torch.long),
              "completion_ids": torch.tensor([[5, 6, 9], [5, 9, 9]]),
              "completion_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]), "tool_mask": torch.tensor([[1, 0, 1], [1, 1, 1]]),
              "advantages": torch.tensor([0.5, -0.5]), "num_items_in_batch": torch.tensor(4)}
    out = dynamic.merge([first, second], [(1, 0), (0, 0)], group=2, pad_token_id=9)
    assert out["prompt_ids"].tolist() == [[1, 2, 3], [1, 2, 4], [9, 9, 1], [9, 9, 2]]
    assert out["prompt_mask"].tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 1], [0, 0, 1]]
    assert out["completion_ids"].tolist() == [[5, 6, 9], [5, 9, 9], [7, 9, 9], [8, 9, 9]]
    assert out["completion_mask"].tolist() == [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 0, 0]]
    assert out["tool_mask"].tolist() == [[1, 0, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]]
    assert out["advantages"].tolist() == [0.5, -0.5, 1.0, -1.0]
    assert out["num_items_in_batch"].item() == 2 + 2 + 1 + 1  # completion mask x tool mask
    with pytest.raises(NotImplementedError, match="pixel_values"):
        dynamic.merge([{**first, "pixel_values": torch.zeros(4, 3)}], [(0, 0)], group=2, pad_token_id=9)


def test_refill_rows_are_seeded_and_repeated_per_group():
    from datasets import Dataset

    ds = Dataset.from_dict({"i": list(range(10))})
    rows = dynamic.draw_rows(ds, 3, 4, "seed/0")
    assert [r["i"] for r in rows][::4] == [r["i"] for r in dynamic.draw_rows(ds, 3, 4, "seed/0")][::4]
    assert all(len({r["i"] for r in rows[g * 4:(g + 1) * 4]}) == 1 for g in range(3))
    assert len({r["i"] for r in rows}) == 3  # without replacement
    assert sorted({r["i"] for r in dynamic.draw_rows(ds, 12, 1, "seed/1")}) == list(range(10))  # then cycles


# ---------------------------------------------------------------------------------------------
# The recipe switch


@pytest.mark.parametrize("override, message", [
    ("sampling.max_rounds=0", "sampling.max_rounds: Input should be greater than 0"),
    ("sampling.pool.keep=weighted", "sampling.pool.keep: Input should be 'learnable' or 'all'"),
    ("sampling.pool.samples=1", "sampling.pool.samples: Input should be greater than or equal to 2"),
    ("sampling.refill=2", "sampling.refill: Input should be a valid boolean"),
    ("sampling.refil=false", "sampling.refil: unknown key"),
])
def test_bad_sampling_values_are_one_line_errors(override, message):
    with pytest.raises(UserError, match=message) as e:
        load_recipe(GRPO, [override])
    assert "\n" not in str(e.value)


def test_sampling_is_grpo_only_and_one_process_only(monkeypatch):
    with pytest.raises(UserError, match="only used by grpo recipes"):
        load_recipe(recipes_dir() / "gsm8k_sft.yaml", ["sampling.dynamic=true"])
    recipe = load_recipe(GRPO, ["sampling.dynamic=true"], smoke=True)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match="run in one process"):
        trainer_config(recipe, output_dir="/tmp/rlkit-test")
    monkeypatch.setenv("WORLD_SIZE", "1")
    trainer_config(recipe, output_dir="/tmp/rlkit-test")  # one process: fine


# ---------------------------------------------------------------------------------------------
# Dynamic sampling in a real (tiny) trainer


def _trainer(run_dir, overrides, recipe=GRPO):
    from rlkit.train import build_trainer

    run_dir.mkdir(exist_ok=True)
    recipe = load_recipe(recipe, ["sampling.dynamic=true", "trainer.per_device_train_batch_size=16",
                                  "trainer.max_completion_length=8", *overrides], smoke=True)
    trainer, tok = build_trainer(recipe, run_dir, smoke=True)
    trainer.model.train()
    trainer._metrics["train"].clear()
    return trainer, tok


def _rows(trainer, kinds):
    """Dataset rows with these classes, in this order, each repeated for its group (as TRL's sampler lays them)."""
    left = trainer.train_dataset.to_list()
    picked = [left.pop(next(i for i, r in enumerate(left) if kind(r) == k)) for k in kinds]
    return [r for r in picked for _ in range(trainer.num_generations)]


def test_dynamic_sampling_drops_constant_groups_and_refills_from_new_prompts(table_trainer, draws):
    trainer, tok = table_trainer
    trainer._metrics["train"].clear()
    out = trainer._generate_and_score_completions(_rows(trainer, [2, 0, 1, 2]))

    assert len(draws) >= 2
    group = trainer.num_generations
    kinds = [[kind(inputs[g * group]) for g in range(len(inputs) // group)] for inputs, _ in draws]
    assert kinds[0] == [2, 0, 1, 2]
    refilled = [k for ks in kinds[1:] for k in ks]
    assert refilled.count(2) >= 2  # enough signal was found before the bound
    assert all(len({json.dumps(r["prompt"]) for r in inputs[g * group:(g + 1) * group]}) == 1
               for inputs, _ in draws for g in range(len(inputs) // group))
    # the batch keeps TRL's size; every group in it has signal and TRL's own advantages
    assert out["advantages"].shape == (16,) and out["completion_ids"].shape[0] == 16
    assert out["advantages"].tolist() == pytest.approx([-ADVANTAGE, ADVANTAGE] * 8, abs=1e-5)
    golds = [int(a) for a in trainer.train_dataset["answer"]]
    questions = {q["prompt"][-1]["content"]: g for q, g in zip(trainer.train_dataset, golds, strict=True)}
    texts = tok.batch_decode(out["prompt_ids"], skip_special_tokens=True)
    assert [next(g for q, g in questions.items() if q in t) % 3 for t in texts] == [2] * 16
    # the first draw's two kept groups are its rows 0-3 and 12-15, unchanged
    first = draws[0][1]
    for mine, theirs in ((slice(0, 4), slice(0, 4)), (slice(4, 8), slice(12, 16))):
        width = first["completion_ids"].shape[1]
        assert torch.equal(out["completion_ids"][mine, :width], first["completion_ids"][theirs])
        assert torch.equal(out["advantages"][mine], first["advantages"][theirs])
    assert out["num_items_in_batch"].item() == out["completion_mask"].sum().item()
    # the log: TRL's metrics once, from the first draw; rlkit's shares and the extra generation
    metrics = trainer._metrics["train"]
    assert metrics["frac_reward_zero_std"] == [0.5] and len(metrics["reward"]) == 1
    assert metrics["dynamic_sampling/zero_std_before"] == [0.5]
    assert metrics["dynamic_sampling/zero_std_after"] == [0.0]
    assert metrics["dynamic_sampling/extra_rounds"] == [len(draws) - 1]
    assert metrics["dynamic_sampling/extra_prompts"] == [sum(len(i) for i, _ in draws[1:]) // group]


def test_without_refills_the_loss_sees_only_the_groups_with_signal(table_trainer, draws, monkeypatch):
    """`sampling.refill: false` (max_rounds 0): one draw, its two groups with signal (rows 0-3 and 12-15) alone in the
    batch, TRL's advantages and completions unchanged, the loss tokens counted again; all constant: one group."""
    trainer, _ = table_trainer
    trainer._metrics["train"].clear()
    monkeypatch.setattr(trainer, "max_rounds", 0)
    out = trainer._generate_and_score_completions(_rows(trainer, [2, 0, 1, 2]))
    assert len(draws) == 1 and trainer.args.steps_per_generation == 1
    first = draws[0][1]
    rows = [*range(0, 4), *range(12, 16)]
    assert out["advantages"].tolist() == first["advantages"][rows].tolist()
    width = first["completion_ids"].shape[1]
    assert torch.equal(out["completion_ids"][:, :width], first["completion_ids"][rows])
    assert out["num_items_in_batch"].item() == first["completion_mask"][rows].sum().item()
    metrics = trainer._metrics["train"]
    assert metrics["dynamic_sampling/groups_trained"] == [0.5] and metrics["dynamic_sampling/zero_std_after"] == [0.0]
    assert "dynamic_sampling/extra_rounds" not in metrics and metrics["frac_reward_zero_std"] == [0.5]
    monkeypatch.setattr(sys.modules["table_rewards"], "CONSTANT", True)
    out = trainer._generate_and_score_completions(_rows(trainer, [0, 1, 2, 0]))
    assert out["advantages"].shape == (4,) and metrics["dynamic_sampling/groups_trained"][-1] == 0.25


@pytest.mark.parametrize("mask, chunks, groups", [
    ([True, False, True, False], 1, 2), ([True, False, True, False], 4, 4), ([True, False, False, False], 2, 4),
    ([True] * 4, 1, 1), ([True] * 4, 2, 2),
])
def test_trained_groups_round_up_to_whole_chunks(mask, chunks, groups):
    assert dynamic.trained_groups(mask, chunks) == groups


def test_the_bound_is_respected_and_the_batch_kept_whole(table_trainer, draws, monkeypatch):
    trainer, _ = table_trainer
    trainer._metrics["train"].clear()
    monkeypatch.setattr(trainer, "max_rounds", 2)
    monkeypatch.setattr(sys.modules["table_rewards"], "CONSTANT", True)
    inputs = _rows(trainer, [0, 1, 2, 0])
    out = trainer._generate_and_score_completions(inputs)
    assert len(draws) == 3  # the first draw and max_rounds refills, each of a whole batch's 4 prompts
    assert [len(i) for i, _ in draws] == [16, 16, 16]
    first = draws[0][1]
    assert {k: torch.equal(out[k], first[k]) for k in first} == dict.fromkeys(first, True)  # filled with its groups
    metrics = trainer._metrics["train"]
    assert metrics["dynamic_sampling/zero_std_before"] == [1.0] and metrics["dynamic_sampling/zero_std_after"] == [1.0]
    assert metrics["dynamic_sampling/extra_rounds"] == [2] and metrics["dynamic_sampling/extra_prompts"] == [8]
    # evaluation batches pass through TRL untouched
    trainer.model.eval()
    try:
        trainer._generate_and_score_completions(inputs[:4])
    finally:
        trainer.model.train()
    assert len(draws) == 4 and "dynamic_sampling/zero_std_before" not in trainer._metrics["eval"]


def _golds(n, seed):
    return {row["question"]: gsm8k.gold(row["answer"]) for row in gsm8k.generate(n, seed=seed)}


def calculator_reply(golds, seen):
    """A scripted calculator agent: compute the gold with the tool, then answer; questions whose gold is even are
    always answered right, the others right every other time (so their groups vary)."""

    def reply(text):
        question = next(q for q in golds if q in text)
        gold = int(golds[question])
        if "<tool_response>" not in text:
            call = {"name": "calculate", "arguments": {"expression": f"{gold - 7} + 7"}}
            return f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>"
        seen[question] = seen.get(question, 0) + 1
        right = gold % 2 == 0 or seen[question] % 2 == 1
        return f"#### {gold if right else gold + 1}<|im_end|>"

    return reply


def test_dynamic_sampling_with_a_tool_environment_trains_a_step(tmp_path):
    trainer, tok = _trainer(tmp_path / "run", ["trainer.max_steps=1", "trainer.max_completion_length=160",
                                       "trainer.learning_rate=1e-2", "sampling.max_rounds=6"], recipe=CALCULATOR)
    reply = calculator_reply(_golds(32, seed=0), {})

    def scripted(prompt_ids, images, multimodal_fields, *args, **kwargs):  # TRL 1.14 adds num_generations
        return [tok(reply(tok.decode(ids)), add_special_tokens=False)["input_ids"] for ids in prompt_ids], None

    batches = script_and_capture(trainer, scripted)
    trainer.train()
    assert len(batches) == 1
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = next(r for r in rows if "dynamic_sampling/zero_std_before" in r)
    evens = sum(int(g) % 2 == 0 for g in trainer.train_dataset["answer"]) / len(trainer.train_dataset)
    assert 0 < evens < 1 and logged["dynamic_sampling/zero_std_after"] == 0.0
    assert logged["frac_reward_zero_std"] == logged["dynamic_sampling/zero_std_before"]
    assert logged["tools/call_frequency"] == pytest.approx(1.0)
    batch = batches[0]
    assert batch["completion_ids"].shape[0] == 16 and batch["tool_mask"].shape == batch["completion_ids"].shape
    answers = [tok.decode(ids[mask.bool() & tool.bool()]) for ids, mask, tool in
               zip(batch["completion_ids"], batch["completion_mask"], batch["tool_mask"], strict=True)]
    assert all(a.startswith('<tool_call>\n{"name": "calculate"') and "####" in a for a in answers)
    # every group trained on has a right and a wrong answer (its reward varies)
    finals = [a.rpartition("#### ")[2].removesuffix("<|im_end|>") for a in answers]
    assert all(len(set(finals[g * 4:(g + 1) * 4])) == 2 for g in range(4))


# ---------------------------------------------------------------------------------------------
# The prompt pool


def scripted_generate(monkeypatch, tok, reply):
    """Make every transformers ``generate`` (rlkit's sampling and TRL's) append ``reply(prompt text)`` to each row."""
    import transformers

    calls = []

    def generate(self, input_ids=None, **kwargs):
        calls.append(len(input_ids))
        new = [tok(reply(tok.decode(ids)), add_special_tokens=False)["input_ids"] for ids in input_ids.tolist()]
        width = max(map(len, new))
        new = torch.tensor([ids + [tok.pad_token_id] * (width - len(ids)) for ids in new], device=input_ids.device)
        return torch.cat([input_ids, new], dim=1)

    monkeypatch.setattr(transformers.GenerationMixin, "generate", generate)
    return calls


def table_reply(golds, seen):
    """Class 0 (gold mod 3) always right, class 1 never, class 2 right every other time."""

    def reply(text):
        question = next(q for q in golds if q in text)
        gold = int(golds[question])
        seen[question] = seen.get(question, 0) + 1
        right = gold % 3 == 0 or (gold % 3 == 2 and seen[question] % 2 == 1)
        return f"#### {gold if right else gold + 1}<|im_end|>"

    return reply


def test_pool_keeps_exactly_the_prompts_strictly_between_0_and_1(tmp_path, tiny_model_dir, monkeypatch):
    from rlkit.backends.hf import load_tokenizer
    from rlkit.doctor.learn import prompt_pool
    from rlkit.train import build_trainer

    golds = _golds(32, seed=0)  # the smoke recipe's train rows
    calls = scripted_generate(monkeypatch, load_tokenizer(str(tiny_model_dir)), table_reply(golds, {}))
    recipe = load_recipe(GRPO, ["sampling.pool={samples: 4, limit: 30}", "trainer.per_device_train_batch_size=16"],
                         smoke=True)
    trainer, tok = build_trainer(recipe, tmp_path, smoke=True)
    classes = [int(g) % 3 for g in list(golds.values())[:30]]
    assert 0 < classes.count(2) < 30
    kept = [int(a) for a in trainer.train_dataset["answer"]]
    assert kept == [int(g) for g in list(golds.values())[:30] if int(g) % 3 == 2]
    pool = json.loads((tmp_path / "pool.json").read_text())
    assert [p["pass_rate"] for p in pool["prompts"]] == [{0: 1.0, 1: 0.0, 2: 0.5}[c] for c in classes]
    assert pool["histogram"] == {"0/4": classes.count(1), "1/4": 0, "2/4": classes.count(2), "3/4": 0,
                                 "4/4": classes.count(0)}
    assert (pool["train_rows"], pool["probed"], pool["learnable"], pool["pool_size"]) == (32, 30, classes.count(2),
                                                                                       classes.count(2))
    # answer_format pays every "#### N": only class 2's rewards vary
    assert [p["zero_variance"] for p in pool["prompts"]] == [c != 2 for c in classes]
    assert pool["samples"] == 4 and pool["temperature"] == 1.0 and pool["keep"] == "learnable"

    # a resumed run reads its pool.json instead of sampling again; too few learnable prompts are refused
    before, rows = len(calls), grpo.dataset(recipe)
    again = prompt_pool(recipe, trainer.model, tok, rows, trainer.args, tmp_path)
    assert [int(a) for a in again["answer"]] == kept and len(calls) == before
    args = copy.copy(trainer.args)
    args.generation_batch_size = 4 * (classes.count(2) + 1)
    with pytest.raises(UserError, match=f"{classes.count(2)} of 30 probed prompts .* fewer than the "
                                        f"{classes.count(2) + 1} one generation batch needs") as e:
        prompt_pool(recipe, trainer.model, tok, rows, args, tmp_path)
    assert "\n" not in str(e.value)


def test_pool_plays_whole_tool_episodes_for_an_env_recipe(tmp_path, tiny_model_dir, monkeypatch):
    from rlkit.backends.hf import load_tokenizer
    from rlkit.train import build_trainer

    golds = _golds(32, seed=0)
    scripted_generate(monkeypatch, load_tokenizer(str(tiny_model_dir)), calculator_reply(golds, {}))
    recipe = load_recipe(CALCULATOR, ["sampling.pool={keep: all, samples: 2, limit: 8}",
                                      "trainer.generation_kwargs={max_new_tokens: 40}"], smoke=True)
    trainer, _ = build_trainer(recipe, tmp_path, smoke=True)
    pool = json.loads((tmp_path / "pool.json").read_text())
    assert pool["max_new_tokens"] == 40  # each reply's limit, as training's (the episode's: 160)
    # even golds: the tool's result, then the right answer, every time; odd: right every other time
    assert [p["pass_rate"] for p in pool["prompts"]] == [1.0 if int(g) % 2 == 0 else 0.5
                                                         for g in list(golds.values())[:8]]
    assert (pool["probed"], pool["pool_size"], len(trainer.train_dataset)) == (8, 32, 32)


@pytest.mark.report
def test_train_with_dynamic_sampling_and_the_pool_end_to_end(tmp_path, table_rewards):
    from rlkit.train import train

    run = train(GRPO, [f"rewards=[{{name: '{table_rewards}:table'}}]", "sampling.dynamic=true",
                       "sampling.pool={keep: all, samples: 2, limit: 8}", "trainer.per_device_train_batch_size=16",
                       "trainer.max_completion_length=8"], smoke=True, output_dir=tmp_path / "run")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "dynamic_sampling/zero_std_before" in r]
    assert [r["step"] for r in logged] == [1, 2]
    for r in logged:
        assert r["dynamic_sampling/zero_std_after"] <= r["dynamic_sampling/zero_std_before"]
        assert r["frac_reward_zero_std"] == r["dynamic_sampling/zero_std_before"]
    pool = json.loads((run / "pool.json").read_text())
    assert (pool["probed"], pool["pool_size"], sum(pool["histogram"].values())) == (8, 32, 8)
    report = (run / "report.md").read_text()
    assert "## Prompt pool" in report and "Pool size: 32 before, 32 after." in report
    assert f"| 0/2 | {pool['histogram']['0/2']} |" in report
    before = sum(r["dynamic_sampling/zero_std_before"] for r in logged) / 2
    assert f"| before dynamic sampling (the first draw) | {logged[0]['dynamic_sampling/zero_std_before']:.3f}" in report
    assert f"| {before:.3f} | 2 |" in report
    assert "after dynamic sampling (the batch trained on)" in report
    assert (run / "plots" / "pool.png").stat().st_size > 0 and (run / "plots" / "zero_variance.png").stat().st_size > 0


def test_the_report_says_how_much_of_each_batch_the_loss_saw_without_refills():
    from rlkit.report.sampling import zero_variance_lines

    rows = [{"step": s, "frac_reward_zero_std": z, "dynamic_sampling/zero_std_before": z,
             "dynamic_sampling/zero_std_after": 0.0, "dynamic_sampling/groups_trained": 1 - z}
            for s, z in ((1, 0.625), (2, 0.75))]
    text = "\n".join(zero_variance_lines(rows))
    assert "| before dynamic sampling (the first draw) | 0.625 | 0.750 | 0.688 | 2 |" in text
    assert "the loss saw 0.312 of each generation batch's groups" in text and "Refills:" not in text
    refilled = [{**{k: v for k, v in r.items() if k != "dynamic_sampling/groups_trained"},
                 "dynamic_sampling/extra_rounds": 0.0, "dynamic_sampling/extra_prompts": 0.0} for r in rows]
    assert "Refills: 0.00 extra generation rounds" in "\n".join(zero_variance_lines(refilled))


@pytest.mark.parametrize("refill", [True, False])
def test_the_zero_variance_chart_draws_what_the_batch_did(tmp_path, refill):
    """With refills the lower panel is the extra rounds and prompts; without (nothing drawn again, none logged) the
    share of the groups the loss saw, not a panel of zeros."""
    from rlkit.report.charts import CHARTS

    extra = ({"dynamic_sampling/extra_rounds": 1.0, "dynamic_sampling/extra_prompts": 4.0} if refill
             else {"dynamic_sampling/groups_trained": 0.375})
    rows = [{"step": s, "frac_reward_zero_std": 0.625, "dynamic_sampling/zero_std_before": 0.625,
             "dynamic_sampling/zero_std_after": 0.0, **extra} for s in (1, 2, 3)]
    chart = next(c for c in CHARTS if c.file == "zero_variance.png")
    drawn = chart.draw("run", "grpo", rows, [], tmp_path / chart.file)
    shares = ["dynamic_sampling/zero_std_before", "dynamic_sampling/zero_std_after", "frac_reward_zero_std"]
    assert drawn == shares + list(extra) and (tmp_path / chart.file).stat().st_size > 0
