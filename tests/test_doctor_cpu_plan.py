"""`rlkit doctor`'s memory plan on CPU (rlkit/doctor/cpu_plan.py) against measured peak RSS: the three CPU
recipes end to end, the loss forward/backward term shape by shape, and what gradient checkpointing is worth."""

import pytest

from rlkit.demos.search import FLOAT32_ATTENTION, FLOAT32_CACHE, FLOAT32_GRPO, GRPO, float32_settings, grpo_settings
from rlkit.doctor import run
from rlkit.recipe import recipes_dir

# Peak RSS of `rlkit train` per step (GB), measured by bench/grpo_step.py at rlkit's default heap threshold (4 MiB).
# The latest run of every case: `make bench` at e654bcd, idle, 2 threads, torch's huge pages on
# (bench/results/grpo_step.md). The first row is older: 16 sequences, one thread on a loaded machine at 3ab347c
# (bench/results/grpo_step_history.md); before that commit each peak held one copy of the LM head per sequence.
MEASURED = [  # (case, recipe, overrides, per-step peaks)
    # 16 x (132-139 prompt + 8-20 completion) tokens, the recipe's batch until it took 8 prompts a step
    ("arith", "smol_arith_grpo", ["trainer.per_device_train_batch_size=16"], [1.707, 1.890, 1.993]),
    # the recipe as shipped: 32 x (47-139 + <= 20) tokens (8 prompts x 4, three prompt forms mixed; a batch is
    # padded to its longest prompt, which the plan counts)
    ("arith32", "smol_arith_grpo", [], [1.64, 1.67, 1.71]),
    # base model, no SFT adapter: 8 x (~530 + 15-96) tokens, two model turns around a calculator call
    ("calc", "smol_calc_grpo", [], [1.77, 1.85, 1.81]),
    # base model, completions forced to the 512-token budget (`trainer.generation_kwargs={min_new_tokens: 512}`:
    # it does not search on its own): 8 x (~410 + 512) tokens, a two-search episode's budget
    ("search", "smol_search_grpo", [], [3.00, 3.09]),
    # the calculator at 16 sequences: 16 x (~530 + 2-96) tokens
    ("calc16", "smol_calc_grpo", ["trainer.per_device_train_batch_size=16"], [2.40, 2.36]),
    # search as above in float32 (oneDNN held to AVX2, 2 idle threads, 2026-11-29 at c0fa4c3): the loss on all 8
    # completions at once, and 4 at a time twice (the search demo's float32 GRPO: FLOAT32_GRPO)
    ("search32", "smol_search_grpo", ["model.dtype=float32"], [4.34, 4.36]),
    ("search32x4", "smol_search_grpo", ["model.dtype=float32", *FLOAT32_GRPO], [2.89, 2.90]),
]
TOLERANCE = 0.25


@pytest.fixture
def on_cpu(monkeypatch):
    """The plan this machine would get without a GPU, at rlkit's default heap threshold."""
    import rlkit.backends

    monkeypatch.setattr(rlkit.backends, "cuda_available", lambda: False)
    monkeypatch.delenv("RLKIT_MMAP_THRESHOLD_KB", raising=False)


def cpu_plan(recipe: str, overrides=()) -> dict:
    report = run(recipes_dir() / f"{recipe}.yaml", list(overrides), families=("memory",))
    (check,) = report.checks
    assert check.verdict == "ok" and check.evidence.startswith("CPU:"), check.evidence
    return check.data["estimate"]


@pytest.mark.parametrize("case, recipe, overrides, peaks", MEASURED, ids=[m[0] for m in MEASURED])
def test_cpu_plan_of_each_cpu_recipe_is_within_25_percent_of_its_measured_peak(smollm2_dir, on_cpu, case, recipe,
                                                                               overrides, peaks):
    estimate = cpu_plan(recipe, overrides)["total"]
    print(f"{case}: plan {estimate:.2f} GB, measured {max(peaks):.2f} GB: {estimate / max(peaks) - 1:+.0%}")
    assert abs(estimate / max(peaks) - 1) <= TOLERANCE


def test_search_demo_in_float32_takes_the_same_step_four_completions_at_a_time_under_4_gb(smollm2_dir, on_cpu,
                                                                                          tmp_path, monkeypatch):
    """On a CPU without bf16 units the demos run in float32, where the search GRPO's loss on 8 x 512 completion
    tokens peaked at 4.36 GB (MEASURED): the demo then computes it 4 completions at a time, twice a step."""
    from rlkit.recipe import load_recipe
    from rlkit.trainers.config import trainer_config

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # model.dtype auto: float32 without a GPU
    recipe = recipes_dir() / GRPO
    float32 = grpo_settings(recipe, ["model.dtype=float32"])
    assert float32 == [*FLOAT32_GRPO, *FLOAT32_CACHE, "model.dtype=float32"]
    assert grpo_settings(recipe, ["trainer.seed=1"]) == ["trainer.seed=1"]  # bf16: the recipe as shipped
    assert grpo_settings(recipe, ["model.dtype=auto"]) == [*FLOAT32_GRPO, *FLOAT32_CACHE, "model.dtype=auto"]  # no GPU
    for mine in (["model.dtype=float32", "trainer.per_device_train_batch_size=2"],
                 ["model.dtype=float32", "trainer.gradient_accumulation_steps =3"],
                 ["model.dtype=float32", "trainer={per_device_train_batch_size: 8, num_generations: 4}"]):
        assert grpo_settings(recipe, mine) == [*FLOAT32_CACHE, *mine]  # the user's own batch wins
    for theirs in (["trainer.cache_implementation=static"], ["trainer={cache_implementation: static}"]):
        assert grpo_settings(recipe, ["model.dtype=float32", *theirs]) == [*FLOAT32_GRPO, "model.dtype=float32",
                                                                           *theirs]  # and their own cache
    both = ["model.dtype=float32", "trainer.gradient_accumulation_steps=1", "trainer.cache_implementation=static"]
    assert grpo_settings(recipe, both) == both
    mine = ["model.dtype=float32", "trainer.cache_implementation=static"]
    # the recipe's static cache (its bf16 choice) in bf16; in float32 transformers' default, a cache that grows
    assert [load_recipe(recipe, s).trainer["cache_implementation"] for s in ([], float32, mine)] == [
        "static", None, "static"]
    steps = [trainer_config(load_recipe(recipe, s), str(tmp_path / str(i))) for i, s in enumerate(([], float32))]
    # the same step: 2 prompts x 4 completions generated together, one optimizer step
    assert [(c.generation_batch_size, c.num_generations) for c in steps] == [(8, 4), (8, 4)]
    assert [(c.per_device_train_batch_size, c.gradient_accumulation_steps) for c in steps] == [(8, 1), (4, 2)]
    assert [c.cache_implementation for c in steps] == ["static", None]  # what TRL's generate is given
    plans = [cpu_plan("smol_search_grpo", s)["total"] for s in (["model.dtype=float32"], float32)]
    assert plans[0] > 4.0 > 3.2 > plans[1]


def test_search_demo_in_float32_attends_with_transformers_default_unless_the_user_chose(monkeypatch):
    """The recipe's eager attention is its bf16 choice; in float32 the search demo's stages take transformers' default
    (SDPA, grouped in rlkit's generation), unless the user's own --set names model.attn_implementation."""
    from rlkit.recipe import load_recipe

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    recipe = recipes_dir() / GRPO
    assert load_recipe(recipe).model.attn_implementation == "eager"
    float32 = float32_settings(recipe, ["model.dtype=float32"], FLOAT32_ATTENTION)
    assert float32 == ["model.attn_implementation=null", "model.dtype=float32"]
    assert load_recipe(recipe, float32).model.attn_implementation is None
    assert float32_settings(recipe, ["trainer.seed=1"], FLOAT32_ATTENTION) == ["trainer.seed=1"]  # bf16: as shipped
    for mine in (["model.dtype=float32", "model.attn_implementation=eager"],
                 ["model.attn_implementation=sdpa", "model.dtype=auto"]):
        assert float32_settings(recipe, mine, FLOAT32_ATTENTION) == mine


# smol_arith_grpo with and without gradient checkpointing, peak RSS (GB), at git 3ab347c: MEASURED's arith and
# `bench/grpo_step.py --one arith trainer.max_steps=2 trainer.gradient_checkpointing=false` (4.61, 5.33 per step);
# at 128 KiB (RLKIT_MMAP_THRESHOLD_KB=128, 2 steps each) 1.27, 1.32 with checkpointing and 4.60, 4.70 without.
CHECKPOINTING = {"4096": {True: 1.99, False: 5.33}, "128": {True: 1.32, False: 4.70}}


@pytest.mark.parametrize("threshold_kb", list(CHECKPOINTING))
def test_checkpointing_off_raises_the_plan_by_the_measured_amount(smollm2_dir, on_cpu, monkeypatch, threshold_kb):
    monkeypatch.setenv("RLKIT_MMAP_THRESHOLD_KB", threshold_kb)
    measured = CHECKPOINTING[threshold_kb]
    plan = {on: cpu_plan("smol_arith_grpo", ["trainer.per_device_train_batch_size=16",  # the batch measured
                                             f"trainer.gradient_checkpointing={str(on).lower()}"])["total"]
            for on in (True, False)}
    print(f"{threshold_kb} KiB: plan {plan}, measured {measured}")
    for on in (True, False):
        assert abs(plan[on] / measured[on] - 1) <= TOLERANCE, (on, plan[on], measured[on])
    measured_cost = measured[False] - measured[True]
    assert abs((plan[False] - plan[True]) / measured_cost - 1) <= TOLERANCE, (plan, measured_cost)


# The loss forward/backward alone (GRPOTrainer.compute_loss and the backward on random ids, smol_arith_grpo's
# model: SmolLM2 bf16, eager attention, LoRA r=16 on all linears, the LM head reading a contiguous input), high-water
# RSS above the RSS before it in MB, heap pinned at 128 KiB so RSS follows live tensors: `OMP_NUM_THREADS=1
# .venv/bin/python bench/loss_memory.py smol_arith_grpo SHAPES [--no-checkpointing]`, three processes (the
# shapes in the order below). The first shape of each process pays ~35 MB of one-time allocations (marked *).
LOSS = [  # (batch, prompt, completion, checkpointing, MB)
    (2, 256, 16, True, 92),  # *
    (2, 512, 16, True, 139), (2, 1024, 16, True, 347), (2, 256, 256, True, 233), (2, 256, 768, True, 576),
    (4, 64, 16, True, 71),  # *
    (4, 128, 16, True, 69), (8, 128, 16, True, 130), (4, 128, 64, True, 151),
    (16, 137, 20, True, 253),  # smol_arith_grpo's shape, second of two in its process (the first: 260)
    (2, 128, 16, False, 434),  # *
    (2, 256, 16, False, 883), (4, 256, 16, False, 1759), (2, 512, 16, False, 2130),
]


@pytest.mark.parametrize("batch, prompt, completion, checkpointing, measured", LOSS,
                         ids=[f"{b}x{p}+{c}{'' if k else '-no-checkpointing'}" for b, p, c, k, _ in LOSS])
def test_loss_term_against_the_measured_loss_forward_and_backward(batch, prompt, completion, checkpointing,
                                                                  measured):
    from rlkit.doctor.cpu_plan import CpuPlan
    from rlkit.doctor.memory import KNOWN

    plan = CpuPlan(shape=dict(KNOWN["HuggingFaceTB/SmolLM2-135M-Instruct"]), dtype_bytes=2, lora_r=16,
                   micro_batch=batch, prompt_tokens=prompt, completion_tokens=completion,
                   gradient_checkpointing=checkpointing)
    estimate = plan.estimate()["loss forward/backward"] * 1000
    assert abs(estimate - measured) <= max(0.15 * measured, 40), f"{estimate:.0f} MB vs {measured} MB"


def test_layer_activations_per_token_match_the_measured_cost():
    """Without checkpointing a SmolLM2 layer keeps 38.7 KB per token (fit of the four --no-checkpointing shapes)
    and 5.9 bytes per L x L score and head; float32 weights need no LoRA input casts of their own."""
    from rlkit.doctor.cpu_plan import CpuPlan
    from rlkit.doctor.memory import KNOWN

    shape = dict(KNOWN["HuggingFaceTB/SmolLM2-135M-Instruct"])
    bf16 = CpuPlan(shape=shape, dtype_bytes=2, lora_r=16)
    assert bf16.layer_bytes() == pytest.approx(38_700, rel=0.05)
    fp32 = CpuPlan(shape=shape, dtype_bytes=4, lora_r=16)
    h, i = shape["hidden_size"], shape["intermediate_size"]
    # 16-bit: q, k, v, o, gate, up and down each cast their input to float32 (4 bytes x 6h + 4i); float32 shares
    # them (4 bytes x 3h + 4i) and keeps the attention and MLP tensors at 4 bytes instead of 2 (+6h + 6i).
    assert fp32.layer_bytes() - bf16.layer_bytes() == 6 * h + 6 * i - 4 * 3 * h
