"""The installed `rlkit` console script: fast help, exit code 2 for user errors, smoke train + eval."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlkit import compat
from rlkit.recipe import recipes_dir
from tests.helpers import is_ppo

RLKIT = shutil.which("rlkit", path=str(Path(sys.executable).parent)) or shutil.which("rlkit")


def rlkit(*args, cwd=None, timeout=300, env=None):
    env = {**os.environ, "RLKIT_LOG_LEVEL": "WARNING", **(env or {})}
    return subprocess.run([RLKIT, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def test_console_script_is_installed():
    assert RLKIT, "the rlkit console script is not on PATH; install with `pip install -e .`"


def test_help_is_fast_and_imports_no_torch():
    started = time.time()
    res = rlkit("--help")
    elapsed = time.time() - started
    assert res.returncode == 0 and "train" in res.stdout and "recipes" in res.stdout
    assert elapsed < 3.0  # generous for a loaded CI machine; measured ~0.3 s
    probe = "import sys, rlkit.cli; sys.argv=['rlkit', '--help']\ntry:\n    rlkit.cli.main()\nexcept SystemExit: pass\n" \
            "print(sorted(m for m in ('torch', 'transformers', 'trl', 'datasets') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_argument_errors_exit_2():
    assert rlkit("train").returncode == 2
    assert rlkit("eval", "x.yaml", "--limit", "0").returncode == 2
    assert rlkit("nonsense").returncode == 2


def test_user_errors_are_one_line_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((recipes_dir() / "gsm8k_sft.yaml").read_text().replace("backend: auto", "backnd: auto"))
    res = rlkit("train", bad, "--smoke")
    assert res.returncode == 2
    assert res.stderr.strip() == f"rlkit: error: {bad}: model.backnd: unknown key (did you mean 'backend'?); " \
        "valid keys here: attn_implementation, backend, chat_template_kwargs, dtype, gpu_memory_utilization, " \
        "load_in_4bit, max_seq_length, name_or_path"
    assert "Traceback" not in res.stderr
    res = rlkit("train", recipes_dir() / "gsm8k_sft.yaml", "--smoke", "--set", "trainer.learning_rate=fast")
    assert res.returncode == 2 and "trainer.learning_rate: Input should be a valid number" in res.stderr
    res = rlkit("train", tmp_path / "missing.yaml")
    assert res.returncode == 2 and "no such recipe file" in res.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.trains
@pytest.mark.cpu_only
def test_use_vllm_without_gpu_is_refused(tmp_path):
    res = rlkit("train", recipes_dir() / "gsm8k_grpo.yaml", "--set", "model.backend=hf",
                "--set", "model.load_in_4bit=false", "--output-dir", tmp_path / "run")
    assert res.returncode == 2
    assert "trainer.use_vllm: vLLM needs a CUDA GPU" in res.stderr
    res = rlkit("train", recipes_dir() / "gsm8k_grpo.yaml", "--output-dir", tmp_path / "run")
    assert res.returncode == 2 and "unsloth needs a CUDA GPU" in res.stderr
    assert not (tmp_path / "run").exists()


def test_recipes_list_show_validate():
    res = rlkit("recipes", "list")
    assert res.returncode == 0 and "gsm8k_grpo" in res.stdout and "gsm8k_sft" in res.stdout
    res = rlkit("recipes", "show", "gsm8k_grpo")
    assert res.returncode == 0 and "num_generations: 8" in res.stdout
    assert rlkit("recipes", "show", "gsm8k_grp").returncode == 2
    res = rlkit("recipes", "validate")
    # On TRL >= 1.13 (no PPOTrainer) each PPO recipe is a ✗ line (what it says: test_stack_range.py), the rest ✓.
    ppo = [] if compat.has_ppo() else [p for p in recipes_dir().glob("*.yaml") if is_ppo(p)]
    assert res.returncode == (2 if ppo else 0), res.stdout + res.stderr
    assert res.stdout.count("✓") == len(list(recipes_dir().glob("*.yaml"))) - len(ppo)
    assert res.stdout.count("✗") == len(ppo)


def test_recipes_validate_reports_each_bad_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    res = rlkit("recipes", "validate", bad, recipes_dir() / "gsm8k_sft.yaml")
    assert res.returncode == 2
    assert "✗" in res.stdout and "algorithm: required key is missing" in res.stdout and "✓" in res.stdout


def test_demo_data_folder_mistakes_are_one_line(tmp_path):
    res = rlkit("demo", "--data-dir", tmp_path / "nope", "--output-dir", tmp_path / "demo")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith(f"rlkit: error: --data-dir {tmp_path / 'nope'}: no such folder; give a folder holding "
                                 "gsm8k/test.jsonl")
    res = rlkit("demo", "--output-dir", tmp_path / "demo", env={"RLKIT_DATA_DIR": str(tmp_path / "gone")})
    assert res.returncode == 2 and res.stderr.startswith(f"rlkit: error: RLKIT_DATA_DIR {tmp_path / 'gone'}: ")
    assert not (tmp_path / "demo").exists()
    # offline with an empty datasets cache, --fetch-data gets nothing and says what and why
    res = rlkit("demo", "--fetch-data", env={"HF_DATASETS_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("rlkit: error: GSM8K test (1319 problems): offline (HF_HUB_OFFLINE or "
                                 "HF_DATASETS_OFFLINE) and not in datasets' cache; IFEval prompts (541): offline")
    assert res.stderr.strip().endswith("(unset HF_HUB_OFFLINE and HF_DATASETS_OFFLINE)")


@pytest.mark.slow
@pytest.mark.trains
def test_smoke_train_then_eval_through_the_console_script(tmp_path):
    run_dir = tmp_path / "run"
    res = rlkit("train", recipes_dir() / "gsm8k_sft.yaml", "--smoke", "--output-dir", run_dir, cwd=tmp_path,
                env={"RLKIT_LOG_LEVEL": "INFO"})
    assert res.returncode == 0, res.stderr
    # rlkit's own lines come first; no third-party advice that does not apply (bitsandbytes' `pip install kernels`,
    # logged on CPUs with AVX512-BF16 as peft imports it: rlkit.compat.quiet_bnb_kernels_hint)
    lines = res.stderr.splitlines()
    assert re.fullmatch(r"\d\d:\d\d:\d\d INFO smoke: model\.name_or_path: 'Qwen/Qwen3-1\.7B' -> 'rlkit/tiny-qwen3'",
                        lines[0]), lines[:3]
    assert not [line for line in lines if "kernels-community" in line or "pip install kernels" in line]
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    res = rlkit("eval", run_dir, "--limit", "5", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "accuracy" in res.stdout
    (path,) = (run_dir / "eval").glob("*.json")
    results = json.loads(path.read_text())
    assert results["n"] == 5 and len(results["examples"]) == 5
    assert results["accuracy"] == sum(e["correct"] for e in results["examples"]) / 5


def test_agent_commands_through_the_console_script(tmp_path, monkeypatch):
    """index build/eval on the smoke corpus, then the one-line errors of rollout, analyze, index and chat."""
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))  # restored after: a user's own cache dir survives
    built = rlkit("index", "build", recipes_dir() / "multihop_rag_grpo.yaml", "--smoke")
    assert built.returncode == 0, built.stderr
    assert "80 chunks, built in" in built.stdout
    again = rlkit("index", "build", recipes_dir() / "multihop_rag_grpo.yaml", "--smoke")
    assert "80 chunks, loaded from cache" in again.stdout
    scored = rlkit("index", "eval", recipes_dir() / "multihop_rag_grpo.yaml", "--smoke")
    assert scored.returncode == 0 and "passage recall" in scored.stdout and "MRR" in scored.stdout
    assert "matched by fact" in scored.stdout
    assert [line.split()[1] for line in scored.stdout.splitlines() if line.startswith("│")] == ["1", "2", "5", "10"]
    errors = [
        (("rollout", recipes_dir() / "gsm8k_grpo.yaml", "--smoke"), "has no `env:`"),
        (("rollout", recipes_dir() / "gsm8k_calculator_grpo.yaml", "--smoke", "--split", "test"), "--split 'test'"),
        (("rollout", recipes_dir() / "gsm8k_calculator_grpo.yaml", "--endpoint", "http://127.0.0.1:9/v1",
          "--backend", "vllm"), "--endpoint generates on the server"),
        (("rollout", recipes_dir() / "gsm8k_calculator_grpo.yaml", "--smoke", "--endpoint", "http://127.0.0.1:9/v1"),
         "--endpoint http://127.0.0.1:9/v1: cannot list models"),
        (("analyze", tmp_path / "none.jsonl"), "no such file"),
        (("index", "build", recipes_dir() / "gsm8k_sft.yaml"), "no `retrieval:` section"),
        (("index", "eval", recipes_dir() / "gsm8k_calculator_grpo.yaml"), "no `retrieval:` section"),
        (("chat", "TINY", "--env", "calculater"), "unknown environment 'calculater'"),
    ]
    for args, expected in errors:
        res = rlkit(*args)
        assert res.returncode == 2, (args, res.stderr)
        assert expected in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
