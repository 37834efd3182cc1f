"""`rlkit doctor`'s memory plan on CPU (rlkit/doctor/cpu_plan.py) against measured peak RSS: the three CPU
recipes end to end, the loss forward/backward term shape by shape, and what gradient checkpointing is worth."""

import pytest

from rlkit.doctor import run
from rlkit.recipe import recipes_dir

# Peak RSS of `rlkit train` per step (GB), measured by bench/grpo_step.py at rlkit's default heap threshold (4 MiB)
# on a loaded 2-core machine (bench/results/grpo_step.md): `OMP_NUM_THREADS=1 .venv/bin/python bench/grpo_step.py
# --one NAME`, NAME the case's id, at git 5ebeb89 (arith, calc) and 11efc92 (search, calc16).
MEASURED = [  # (case, recipe, overrides, per-step peaks)
    # 16 x (132-139 prompt + 8-20 completion) tokens
    ("arith", "smol_arith_grpo", [], [2.639, 2.767, 2.813]),
    # base model, no SFT adapter: 8 x (528-534 + 15-96) tokens, two model turns around a calculator call
    ("calc", "smol_calc_grpo", [], [1.899, 1.956, 2.098]),
    # base model, completions forced to 768 tokens (`trainer.generation_kwargs={min_new_tokens: 768}`: it does not
    # search on its own): 8 x (393-420 + 768) tokens, the oracle teacher's two-search episodes' length
    ("search", "smol_search_grpo", [], [3.501, 3.555]),
    # the calculator at 16 sequences: 16 x (528-534 + 2-96) tokens
    ("calc16", "smol_calc_grpo", ["trainer.per_device_train_batch_size=16"], [2.711, 2.899]),
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


# smol_arith_grpo with and without gradient checkpointing, peak RSS (GB). At the default 4 MiB heap threshold:
# MEASURED's arith (5ebeb89) and `bench/grpo_step.py --one arith trainer.max_steps=2
# trainer.gradient_checkpointing=false` at 71ce707 (6.18, 6.40 per step). At 128 KiB (bench/results/grpo_step.md,
# 2 steps each): 2.08 at 1a281cd (MALLOC_MMAP_THRESHOLD_=131072 MALLOC_TRIM_THRESHOLD_=131072), 5.48 at a1e986f.
CHECKPOINTING = {"4096": {True: 2.81, False: 6.40}, "128": {True: 2.08, False: 5.48}}


@pytest.mark.parametrize("threshold_kb", list(CHECKPOINTING))
def test_checkpointing_off_raises_the_plan_by_the_measured_amount(smollm2_dir, on_cpu, monkeypatch, threshold_kb):
    monkeypatch.setenv("RLKIT_MMAP_THRESHOLD_KB", threshold_kb)
    measured = CHECKPOINTING[threshold_kb]
    plan = {on: cpu_plan("smol_arith_grpo", [f"trainer.gradient_checkpointing={str(on).lower()}"])["total"]
            for on in (True, False)}
    print(f"{threshold_kb} KiB: plan {plan}, measured {measured}")
    for on in (True, False):
        assert abs(plan[on] / measured[on] - 1) <= TOLERANCE, (on, plan[on], measured[on])
    measured_cost = measured[False] - measured[True]
    assert abs((plan[False] - plan[True]) / measured_cost - 1) <= TOLERANCE, (plan, measured_cost)


# The loss forward/backward alone (GRPOTrainer.compute_loss and the backward on random ids, smol_arith_grpo's
# model: SmolLM2 bf16, eager attention, LoRA r=16 on all linears), high-water RSS above the RSS before it in MB,
# heap pinned at 128 KiB so RSS follows live tensors: `OMP_NUM_THREADS=1 .venv/bin/python bench/loss_memory.py
# smol_arith_grpo SHAPES [--no-checkpointing]` (the script of d82f4c3 on the 5ebeb89 tree). The first shape of each process pays ~35 MB of
# one-time allocations (marked *).
LOSS = [  # (batch, prompt, completion, checkpointing, MB)
    (2, 256, 16, True, 171),  # *
    (2, 512, 16, True, 162), (2, 1024, 16, True, 346), (2, 256, 256, True, 232), (2, 256, 768, True, 576),
    (4, 64, 16, True, 284),  # *
    (4, 128, 16, True, 262), (8, 128, 16, True, 520), (4, 128, 64, True, 288),
    (16, 137, 20, True, 1037),  # smol_arith_grpo's shape, second of two in its process (the first: 1067)
    (2, 128, 16, False, 560),  # *
    (2, 256, 16, False, 981), (4, 256, 16, False, 1956), (2, 512, 16, False, 2227),
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
