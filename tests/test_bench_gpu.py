"""bench/gpu.py without a GPU: the plan, the skipped rows, and a case's child run on the tiny model."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu.py"


def run(*args, timeout=120):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_help_lists_the_cases_and_flags():
    done = run("--help")
    assert done.returncode == 0
    for word in ("--case", "--size", "--dry-run", "grpo-unsloth-qlora", "merge-hf-qlora-nf4", "1.7b"):
        assert word in done.stdout


# A dry run records only the cases that cannot run; these read Unsloth's row, which a machine with it (and CUDA) has not.
NO_UNSLOTH = pytest.mark.skipif(importlib.util.find_spec("unsloth") is not None, reason="Unsloth is installed here")


@NO_UNSLOTH
def test_dry_run_shows_the_plan_and_records_why_each_case_cannot_run(tmp_path):
    import torch

    done = run("--dry-run", "--out", str(tmp_path), "--size", "0.6b")
    assert done.returncode == 0, done.stderr
    assert "GPU check: 10 case(s)" in done.stdout
    rows = [json.loads(line) for line in (tmp_path / "gpu.jsonl").read_text().splitlines()]
    status = {r["case"]: r["status"] for r in rows}
    assert status["grpo-unsloth-qlora"] == "skipped: unsloth, unsloth_zoo not installed"
    if importlib.util.find_spec("vllm") is None:
        assert status["grpo-hf-bf16-lora-vllm"] == "skipped: vllm not installed (carry it with bench/gpu_carry.py)"
    # refused on any machine, before a model is built: the reason is the row
    assert status["grpo-hf-qlora-nf4-vllm"].startswith("not run: TRL's colocated vLLM cannot take a 4-bit base's "
                                                       "weights (trl#4973")
    if not torch.cuda.is_available():
        assert len(rows) == 10 and status["sft-hf-qlora-nf4"] == "skipped: no CUDA GPU"
    # a second call appends; the table keeps the latest row per size and case
    run("--dry-run", "--out", str(tmp_path), "--size", "0.6b", "--case", "grpo-unsloth-qlora")
    assert len((tmp_path / "gpu.jsonl").read_text().splitlines()) == len(rows) + 1
    md = (tmp_path / "gpu.md").read_text()
    assert md.count("| grpo-unsloth-qlora ") == 1 and "no case has run on a GPU" in md
    # every row carries the stack it was measured with, shown once under the table and pointed to from its status
    assert rows[0]["stack"].startswith(f"Python {sys.version.split()[0]}, ")
    assert f"torch {torch.__version__}" in rows[0]["stack"]
    assert md.count("Stack: Python") == 1 and "skipped: unsloth, unsloth_zoo not installed [1]" in md


@NO_UNSLOTH
def test_a_note_is_kept_on_the_row_and_numbered_under_the_table(tmp_path):
    done = run("--dry-run", "--out", str(tmp_path), "--size", "1.7b", "--case", "grpo-unsloth-qlora",
               "--note", "beside another run on the same GPU")
    assert done.returncode == 0, done.stderr
    row = json.loads((tmp_path / "gpu.jsonl").read_text())
    assert row["note"] == "beside another run on the same GPU"
    md = (tmp_path / "gpu.md").read_text()
    assert "not installed [1] [2]" in md and "[1] beside another run on the same GPU" in md and "[2] Stack: " in md


def test_a_case_that_times_out_is_an_error_and_what_it_printed_so_far_is_shown(tmp_path, monkeypatch, capsys):
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu

    stuck = tmp_path / "stuck.py"  # a case that reports where it is, then hangs (as a first torch.compile can)
    stuck.write_text("import sys, time\nprint('compiling block 3 of 28', file=sys.stderr, flush=True)\ntime.sleep(60)\n")
    monkeypatch.setattr(gpu, "__file__", str(stuck))
    result, error = gpu.spawn(["--child", "grpo-unsloth-qlora"], 3)
    assert result is None and error == "timed out after 3s"
    assert "compiling block 3 of 28" in capsys.readouterr().err


@pytest.mark.slow
def test_a_case_child_trains_and_merges_on_the_tiny_model_and_its_row_is_written(tmp_path, tiny_model_dir):
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu

    sft, error = gpu.spawn(["--child", "sft-hf-qlora-nf4", str(tiny_model_dir), str(tmp_path / "sft" / "run")], 300)
    assert error is None
    assert len(sft["all_step_seconds"]) == gpu.STEPS and sft["step_seconds"] > 0 and sft["tokens_per_second"] > 0
    # It trained: a finite loss and a finite, non-zero gradient at every step, taken with a non-zero learning rate.
    logged = [json.loads(line) for line in (tmp_path / "sft" / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in logged if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, gpu.STEPS + 1))
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in steps)
    assert all(math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 and r["learning_rate"] > 0 for r in steps)
    merged, error = gpu.spawn(["--child", "merge-hf-qlora-nf4", str(tiny_model_dir), str(tmp_path / "m" / "run")], 300)
    assert error is None
    # The merge case's saved adapter moved: every lora_B starts at zero.
    from safetensors.torch import load_file

    lora_b = {k: v for k, v in load_file(str(tmp_path / "m" / "run" / "adapter" / "adapter_model.safetensors")).items()
              if "lora_B" in k}
    assert lora_b and all(v.abs().max().item() > 0 for v in lora_b.values())
    assert merged["top1_agreement"] >= 0.95 and merged["adapter_effect_max_abs_logit"] > 1e-3
    # A bf16 recipe: top-1 changes only at near-ties, within rounding (the float32 reference of 6d13db1 was not).
    assert merged["decided_flips"] == 0 and merged["beyond_rounding"] == []
    gpu.record(tmp_path / "out", {"size": "tiny", "case": "merge-hf-qlora-nf4", "status": "ok", **merged})
    assert f"{merged['top1_agreement']:.4f}" in (tmp_path / "out" / "gpu.md").read_text()


def test_the_unsloth_the_wheel_packer_brings_is_one_the_gpu_extra_allows():
    import tomllib
    from packaging.requirements import Requirement

    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_wheels

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    allowed = {gpu_wheels.canonical(r.name): r.specifier for r in map(Requirement, extra)}
    assert set(gpu_wheels.NOT_HERE) <= set(allowed)
    for name, version in gpu_wheels.NOT_HERE.items():
        assert version in allowed[name], f"{name}=={version} is outside the gpu extra's {allowed[name]}"


def test_a_grpo_case_reports_its_step_phase_by_phase_and_the_phases_add_up_to_the_step(tmp_path, tiny_model_dir):
    """What the GRPO case child does, shortened (3 steps of 32 tokens): its recipe, rlkit's trainer, the probe."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu
    import gpu_case
    import stepprobe
    from accelerate import Accelerator
    from trl import GRPOTrainer

    from rlkit.recipe import validate
    from rlkit.train import build_trainer

    raw = gpu_case.recipe("grpo-hf-bf16-lora", tiny_model_dir)
    raw["trainer"].update(max_steps=3, max_completion_length=32, bf16=False)
    (tmp_path / "run").mkdir()
    trainer, _ = build_trainer(validate(raw, source="test"), tmp_path / "run")
    classes = (GRPOTrainer._generate_single_turn, GRPOTrainer.compute_loss, Accelerator.backward)
    probe, wrapped = stepprobe.attach(trainer)
    # The probe sits on this trainer only: TRL's and accelerate's classes, which other trainers share, are untouched.
    assert (GRPOTrainer._generate_single_turn, GRPOTrainer.compute_loss, Accelerator.backward) == classes
    assert "_generate_single_turn" in vars(trainer) and "backward" in vars(trainer.accelerator)
    trainer.train()
    assert wrapped[:1] == ["_generate_single_turn"] and "_get_per_token_logps_and_entropies" in wrapped
    assert len(probe.steps) == 3
    phases = stepprobe.summary(probe)
    step = phases.pop("_step")
    # Every second of a step is charged to exactly one phase (the medians of 2 timed steps: their means).
    assert sum(v["seconds"] for v in phases.values()) == pytest.approx(step["seconds"], rel=0.02)
    # Each hook fired once a step: generation, the loss with grad, the backward, the rewards, the optimizer.
    assert all(phases[name]["calls"] == 1 for name in ("generation", "loss forward (log-probs with grad)", "backward",
                                                       "rewards", "optimizer step"))
    assert phases["generation"]["peak_bytes"] > 0
    gpu.record(tmp_path / "out", {"size": "tiny", "case": "grpo-hf-bf16-lora", "status": "ok", "step_seconds": 1.0,
                                  "phases": {**phases, "_step": step}, "phase_memory": "process RSS"})
    page = (tmp_path / "out" / "gpu.md").read_text()
    assert "## GRPO step by phase" in page and "tiny grpo-hf-bf16-lora (peak: process RSS)" in page
    assert "| whole step " in page


@pytest.mark.trains
def test_the_refused_vllm_case_is_one_rlkit_train_refuses_too(tiny_model_dir):
    """The 4-bit + colocated vLLM row says why in one line before any GPU time; `rlkit train` refuses the same recipe
    on a CUDA machine for the same reason (trl#4973), so the row never hides a case that would have run."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_case

    from rlkit.errors import UserError
    from rlkit.recipe import validate
    from rlkit.train import _check_machine
    from rlkit.trainers import trainer_config

    case = "grpo-hf-qlora-nf4-vllm"
    assert gpu_case.CASES[case] == ("grpo", "hf", True, True) and "trl#4973" in gpu_case.REFUSED[case]
    recipe = validate(gpu_case.recipe(case, tiny_model_dir), source="test")
    with pytest.raises(UserError, match="trl#4973"):
        _check_machine(recipe, trainer_config(recipe, output_dir="/tmp/x"), "hf", cuda=True)


@pytest.mark.parametrize("task", ["arith", "search"])
def test_the_gpu_smol_overrides_are_valid_recipe_settings_for_both_stages(task):
    """A typo in bench/gpu_smol.py's overrides would fail on the GPU machine, after the device time is spent."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_smol

    from rlkit.demos import arith, search
    from rlkit.recipe import load_recipe, recipes_dir

    sft, grpo = (arith.SFT, arith.RECIPE) if task == "arith" else (search.SFT, search.GRPO)
    both, grpo_only = gpu_smol.overrides(task, gpu_smol.STEPS[task], smoke=False)
    trained = load_recipe(recipes_dir() / grpo, both + grpo_only)
    assert trained.trainer["use_vllm"] is True and trained.trainer["vllm_mode"] == "colocate"
    assert trained.trainer["max_steps"] == gpu_smol.STEPS[task] >= 100 and trained.trainer["cache_implementation"] is None
    assert trained.model.attn_implementation == "sdpa" and trained.model.dtype == "bfloat16"
    if task == "search":  # every agent eval batches a whole set of 100 episodes
        assert trained.eval.agent_every == gpu_smol.STEPS[task] // 10 and trained.eval.batch_size == 100
    warmup = load_recipe(recipes_dir() / sft, both)
    assert warmup.model.attn_implementation == "sdpa" and warmup.algorithm == "sft"
    smoke_both, smoke_grpo = gpu_smol.overrides(task, 2, smoke=True)
    assert not any("vllm" in o for o in smoke_both + smoke_grpo)
    hf_both, hf_grpo = gpu_smol.overrides(task, 120, smoke=False, vllm=False)  # --generate hf
    generated = load_recipe(recipes_dir() / grpo, hf_both + hf_grpo)
    assert not generated.trainer.get("use_vllm") and generated.trainer["max_steps"] == 120
    assert generated.trainer["cache_implementation"] is None and generated.model.attn_implementation == "sdpa"


def test_gpu_smol_packs_what_was_measured_into_one_file_without_weights(tmp_path):
    """A device call brings back at most 8 files: `--results X.tgz` is one, holding no adapter or checkpoint."""
    sys.path.insert(0, str(ROOT / "bench"))
    import tarfile

    import gpu_smol

    out = tmp_path / "smol-arith"
    for name, data in {"demo.json": "{}", "eval/sft-box.json": "[]", "grpo/metrics.jsonl": "{}\n",
                       "grpo/adapter/adapter_model.safetensors": "w", "grpo/checkpoints/checkpoint-5/x.json": "{}",
                       "sft/tokenizer.json": "{}"}.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(data)
    gpu_smol.keep_results(out, tmp_path / "back" / "arith.tgz")
    with tarfile.open(tmp_path / "back" / "arith.tgz") as tar:
        files = sorted(m.name for m in tar.getmembers() if m.isfile())
    assert files == ["smol-arith/demo.json", "smol-arith/eval/sft-box.json", "smol-arith/grpo/metrics.jsonl"]
    gpu_smol.keep_results(out, tmp_path / "folder")  # any other name: a folder, the same files
    assert sorted(str(p.relative_to(tmp_path / "folder")) for p in (tmp_path / "folder").rglob("*") if p.is_file()) \
        == ["demo.json", "eval/sft-box.json", "grpo/metrics.jsonl"]


@pytest.mark.parametrize("task", ["arith", "search"])
def test_gpu_smol_refuses_a_time_limit_it_cannot_honour(task, capsys):
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_smol

    with pytest.raises(SystemExit) as e:
        gpu_smol.main(["--task", task, "--grpo-minutes", "0"])
    assert e.value.code == 2 and "--grpo-minutes 0.0: give minutes > 0" in capsys.readouterr().err


def test_gpu_smol_records_the_grpo_steps_a_time_limit_let_run(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_smol

    rows = [{"step": s, "loss": 0.1} for s in range(1, 71)] + [{"step": 70, "train_runtime": 120.8}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert gpu_smol.grpo_ran(tmp_path) == (70, pytest.approx(120.8 / 70))
    assert gpu_smol.grpo_ran(tmp_path / "absent") == (None, None)
