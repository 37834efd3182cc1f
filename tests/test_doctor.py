"""`rlkit doctor`: each check family's verdicts on shipped recipes and on known-bad fixtures, exit codes
through rlkit.cli.main, the memory plan against published figures, and `rlkit train` refusing a no-go."""

import json
import math
import shutil
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from rlkit.doctor import CHEAP, run
from rlkit.recipe import recipes_dir
from tests.helpers import shipped_recipe_params
from tests.scripted_server import ScriptedServer

GRPO = recipes_dir() / "gsm8k_grpo.yaml"


def always_one(completions, **kwargs):
    """A broken reward: pays everything the same."""
    return [1.0] * len(completions)


def raises_on_empty(completions, **kwargs):
    return [1.0 / len(c[0]["content"]) for c in completions]


def nan_reward(completions, **kwargs):
    return [math.nan for _ in completions]


def cli(monkeypatch, *args) -> int:
    import rlkit.cli

    monkeypatch.setattr(sys, "argv", ["rlkit", *map(str, args)])
    with pytest.raises(SystemExit) as exit_info:
        rlkit.cli.main()
    return exit_info.value.code or 0


def verdicts(report) -> dict[str, str]:
    return {f"{c.family}/{c.name}": c.verdict for c in report.checks}


@pytest.mark.parametrize("path", shipped_recipe_params())
def test_every_shipped_recipe_is_a_go_with_smoke(path):
    report = run(path, smoke=True, gpu="l4-24gb")
    assert report.go, report.summary()
    got = verdicts(report)
    assert got["learnability/probe"] in ("skip",)  # no sampling in this loop
    assert got["config/trl config"] == "ok" and got["memory/plan"] == "ok"
    assert {c.family for c in report.checks} >= {"template", "config", "versions", "memory"}


def test_reward_card_numbers_for_gsm8k_rewards():
    report = run(GRPO, smoke=True, families=("rewards",))
    card = {row["completion"]: row for row in report.tables["reward card"]}
    assert card["gold"]["gsm8k_correct"] == 1.0 and card["gold"]["total"] == pytest.approx(1.2)
    assert card["empty"]["total"] == 0.0
    assert card["format only, wrong answer"]["gsm8k_correct"] == 0.0
    assert card["format only, wrong answer"]["answer_format"] == 1.0
    assert card["answer in unclosed think"]["total"] == 0.0  # strip_think drops an unclosed block
    assert card["several answers"]["total"] < card["gold"]["total"]
    assert verdicts(report)["rewards/weighted total"] == "ok"


@pytest.mark.parametrize("reward, why", [("always_one", "no signal"), ("raises_on_empty", "raised ZeroDivisionError"),
                                         ("nan_reward", "returned nan")])
def test_broken_rewards_are_blocking(reward, why):
    report = run(GRPO, [f"rewards=[{{name: 'tests.test_doctor:{reward}'}}]"], smoke=True, families=("rewards",))
    assert not report.go
    assert any(why in c.evidence for c in report.blocking), report.summary()


def test_batch_that_does_not_divide_num_generations_is_blocking(monkeypatch):
    report = run(GRPO, ["trainer.per_device_train_batch_size=3"], smoke=True, families=("config",))
    (check,) = report.blocking
    assert check.name == "trl config" and "divisible" in check.evidence and "num_generations" in check.fix
    assert cli(monkeypatch, "doctor", GRPO, "--smoke", "--set", "trainer.per_device_train_batch_size=3") == 1


def test_config_arithmetic():
    report = run(GRPO, ["trainer.gradient_accumulation_steps=2", "trainer.max_steps=20"], smoke=True,
                 families=("config",))
    batch = next(c for c in report.checks if c.name == "batch").data
    assert batch["completions_per_step"] == 8 and batch["prompts_per_step"] == 2
    assert batch["generation_batch_size"] == 8 and batch["steps_per_generation"] == 2
    assert batch["steps_per_epoch"] == 16 and batch["total_steps"] == 20  # 32 prompts / 2 per step
    schedule = next(c for c in report.checks if c.name == "schedule")
    assert schedule.verdict == "ok" and batch["epochs"] == 1.25


def _tokenizer_dir(tiny_model_dir, tmp_path, **changes):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for key, value in changes.items():
        setattr(tok, key, value)
    out = tmp_path / "tok"
    tok.save_pretrained(out)
    return out


# ChatML without {% generation %} markers and not one of TRL's known templates (SmolLM2's kind).
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _sft_recipe(tmp_path, model: Path) -> Path:
    rows = [{"messages": [{"role": "user", "content": f"What is {i} + 1?"},
                          {"role": "assistant", "content": f"#### {i + 1}"}]} for i in range(4)]
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = {"name": "sft_markers", "algorithm": "sft",
              "model": {"name_or_path": str(model), "backend": "hf", "max_seq_length": 256},
              "data": {"task": "sft", "train": {"path": str(data)}},
              "trainer": {"assistant_only_loss": True, "max_steps": 1, "report_to": "none", "max_length": 256}}
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_template_without_generation_markers_blocks_assistant_only_loss(tiny_model_dir, tmp_path):
    path = _sft_recipe(tmp_path, _tokenizer_dir(tiny_model_dir, tmp_path, chat_template=CHATML))
    report = run(path, families=("template",))
    mask = next(c for c in report.checks if c.name == "loss mask")
    assert mask.verdict == "fail" and "generation" in mask.evidence


def test_assistant_mask_on_real_rows_with_trl_training_template(tiny_model_dir, tmp_path):
    report = run(_sft_recipe(tmp_path, Path(tiny_model_dir)), families=("template",))
    mask = next(c for c in report.checks if c.name == "loss mask")
    assert mask.verdict == "ok" and "TRL's training template" in mask.evidence
    assert mask.data["rows"] == 4 and mask.data["bad_rows"] == [] and 0 < mask.data["masked_share"] < 0.5


def test_end_of_turn_token_that_generation_never_stops_at(tiny_model_dir, tmp_path):
    model = _tokenizer_dir(tiny_model_dir, tmp_path, eos_token="<|endoftext|>")
    report = run(GRPO, [f"model.name_or_path={model}"], smoke=True, families=("template",))
    check = next(c for c in report.checks if c.name == "end of turn")
    assert check.verdict == "fail" and "<|im_end|>" in check.evidence
    good = run(GRPO, smoke=True, families=("template",))
    assert verdicts(good)["template/end of turn"] == "ok"
    assert verdicts(good)["template/tool round trip"] == "ok"


def test_truncation_counts_and_blocks_when_every_prompt_is_too_long():
    report = run(GRPO, ["model.max_seq_length=100"], smoke=True, families=("template",))
    check = next(c for c in report.checks if c.name == "truncation")
    assert check.data["over"] > 0 and check.data["limit"] == 100 - 24
    report = run(GRPO, ["model.max_seq_length=40"], smoke=True, families=("template",))
    assert verdicts(report)["template/truncation"] == "fail"


def test_dataset_with_no_signal_is_a_no_go_through_the_cli(monkeypatch, tmp_path):
    # The random tiny model never writes a right answer: every group's rewards are equal.
    out = tmp_path / "report"
    assert cli(monkeypatch, "doctor", GRPO, "--smoke", "--samples", "2", "--limit", "2", "--out", out) == 1
    result = json.loads((out / "doctor.json").read_text())
    probe = next(c for c in result["checks"] if c["family"] == "learnability")
    assert probe["verdict"] == "fail" and probe["data"]["zero_variance"] == 1.0 and probe["data"]["samples"] == 2
    assert "no-go" in (out / "doctor.md").read_text()


def test_learnability_against_an_endpoint_and_the_filtered_data_trains(tmp_path):
    from rlkit.data.gsm8k import generate, gold

    rows = generate(32, seed=0)  # the smoke recipe's train split
    golds = {q.strip(): gold(a) for q, a in zip(rows["question"], rows["answer"], strict=True)}
    calls = defaultdict(int)
    learnable = list(golds)[:2]

    def reply(request):
        question = request["messages"][-1]["content"]
        calls[question] += 1
        right = question in learnable and calls[question] % 2 == 0
        return {"content": f"#### {golds[question] if right else '-1'}"}

    filtered = tmp_path / "filtered.jsonl"
    with ScriptedServer(reply) as server:
        report = run(GRPO, smoke=True, families=("learnability",), samples=4, limit=4, endpoint=server.url,
                     write_filtered=filtered)
    probe = next(c for c in report.checks if c.name == "probe")
    assert probe.verdict == "ok", probe.evidence
    assert probe.data["pass@1"] == pytest.approx(0.25) and probe.data["pass@k"] == 0.5
    assert probe.data["zero_variance"] == 0.5 and sum(calls.values()) == 16
    kept = [json.loads(line) for line in filtered.read_text().splitlines()]
    assert [r["question"].strip() for r in kept] == learnable
    from rlkit.recipe import load_recipe
    from rlkit.trainers import grpo

    recipe = load_recipe(GRPO, [f"data.train={{path: {filtered}}}"], smoke=True)
    assert len(grpo.dataset(recipe)) == 2


def test_exit_codes_through_main(monkeypatch, tmp_path):
    assert cli(monkeypatch, "doctor", GRPO, "--smoke") == 0
    assert cli(monkeypatch, "doctor", tmp_path / "missing.yaml") == 2
    assert cli(monkeypatch, "doctor", GRPO, "--smoke", "--gpu", "h100-80") == 2
    existing = tmp_path / "f.jsonl"
    existing.write_text("{}\n")
    assert cli(monkeypatch, "doctor", GRPO, "--smoke", "--write-filtered", existing) == 2


@pytest.mark.trains
def test_train_refuses_a_no_go_in_one_line_and_writes_nothing(monkeypatch, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = cli(monkeypatch, "train", GRPO, "--smoke", "--output-dir", run_dir,
               "--set", "rewards=[{name: 'tests.test_doctor:always_one'}]")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and "no-go: rewards/always_one" in err[-1] and "--no-doctor" in err[-1]
    assert not run_dir.exists()


def test_train_doctor_costs_well_under_a_second():
    """The cheap families on a smoke recipe, once the libraries training imports anyway are loaded."""
    import trl.chat_template_utils  # noqa: F401  (imported by every trainer build)

    from rlkit.recipe import load_recipe

    recipe = load_recipe(GRPO, smoke=True)
    run(GRPO, recipe=recipe, families=CHEAP, limit=4)  # the tokenizer loads once per process
    report = run(GRPO, recipe=recipe, families=CHEAP, limit=4)
    assert report.go and sum(report.seconds.values()) < 1.0, report.seconds


# ---------------------------------------------------------------------------------------------
# Memory plan


def test_parameter_count_from_config_matches_the_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rlkit.doctor.memory import model_shape, parameter_counts

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert parameter_counts(model_shape(str(tiny_model_dir)))["total"] == model.num_parameters()


def test_known_config_table_matches_published_sizes():
    from rlkit.doctor.memory import KNOWN, parameter_counts

    # Model cards: Qwen3-1.7B 1.7B (2.03B with embeddings per card: 1.4B non-embedding), Llama-3.1-8B 8.03B.
    assert parameter_counts(KNOWN["Qwen/Qwen3-1.7B"])["total"] == pytest.approx(1.72e9, rel=0.01)
    assert parameter_counts(KNOWN["meta-llama/Llama-3.1-8B-Instruct"])["total"] == pytest.approx(8.03e9, rel=0.01)
    assert parameter_counts(KNOWN["Qwen/Qwen2.5-1.5B-Instruct"])["total"] == pytest.approx(1.54e9, rel=0.01)


# Unsloth's published GRPO figures (its GRPO notebooks and docs), with the settings of Unsloth's GRPO notebooks:
# 4-bit base, fast_inference (colocated vLLM sharing the weights), adamw_8bit, gradient checkpointing with
# offload, a micro-batch of num_generations completions. The error is stated here and in the README.
PUBLISHED = [
    # Qwen2.5-1.5B: "~5-7 GB"; LoRA r=16, 8 generations, 256 prompt + 200 completion tokens (the notebook's lengths).
    ("Qwen/Qwen2.5-1.5B-Instruct", dict(lora_r=16, micro_batch=8, generation_batch=8, prompt_tokens=256,
                                        completion_tokens=200), 6.0, 0.15),
    # Llama-3.1-8B, 20K context, 8 generations: 54.3 GB; LoRA r=32 (the notebook's), 1K prompt + 19K completion.
    ("meta-llama/Llama-3.1-8B-Instruct", dict(lora_r=32, micro_batch=8, generation_batch=8, prompt_tokens=1024,
                                              completion_tokens=19456), 54.3, 0.20),
]


@pytest.mark.parametrize("model, settings, published, tolerance", PUBLISHED, ids=["qwen2.5-1.5b", "llama-3.1-8b-20k"])
def test_memory_estimate_against_published_figures(model, settings, published, tolerance):
    from rlkit.doctor.memory import published_check

    estimate = published_check(model, load_in_4bit=True, optim_8bit=True, vllm="unsloth", unsloth=True, **settings)
    error = (estimate - published) / published
    print(f"{model}: estimate {estimate:.1f} GiB vs published {published} GB: error {error:+.0%}")
    assert abs(error) <= tolerance


@pytest.fixture
def gsm8k_file(tmp_path):
    """GSM8K-format rows on disk, so the full (non-smoke) recipe reads local data offline."""
    from rlkit.data.gsm8k import generate

    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in generate(64, seed=3).to_list()))
    return f"data.train={{path: {path}}}"


def test_memory_fit_verdict_and_the_change_that_makes_it_fit(monkeypatch, gsm8k_file):
    report = run(GRPO, [gsm8k_file], families=("memory",), gpu="rtx4090-24gb")
    plan = report.checks[0]
    assert plan.verdict == "ok" and "1.72B parameters" in plan.evidence
    terms = {row["term"]: row["GiB"] for row in report.tables["memory plan"]}
    assert terms["weights"] == pytest.approx(1.26, abs=0.02) and terms["reference model"] == 0.0
    small = run(GRPO, [gsm8k_file, "model.gpu_memory_utilization=0.9"], families=("memory",), gpu="12")
    (fail,) = small.blocking
    assert "does not fit" in fail.evidence and fail.fix.startswith("--set model.gpu_memory_utilization=")
    assert cli(monkeypatch, "doctor", GRPO, "--smoke", "--gpu", "0.5") == 1


def test_unknown_model_is_a_warning_not_a_crash():
    report = run(GRPO, ["model.name_or_path=someone/not-a-cached-model"], families=("memory",), gpu="24")
    assert verdicts(report)["memory/plan"] == "warn" and report.go


# ---------------------------------------------------------------------------------------------
# Versions


def test_versions_against_declared_ranges(monkeypatch):
    from rlkit.doctor import versions

    report = run(GRPO, smoke=True, families=("versions",))
    assert verdicts(report)["versions/trl"] == "ok" and "1.12.0" in report.checks[2].evidence
    monkeypatch.setattr(versions, "declared", lambda: {"trl": "<1.0"})
    report = run(GRPO, smoke=True, families=("versions",))
    assert verdicts(report)["versions/trl"] == "fail"


def test_bitsandbytes_missing_blocks_only_a_4bit_recipe(monkeypatch):
    """A GPU machine without bitsandbytes refused a bf16 LoRA demo before it trained (found on an H200)."""
    from importlib import metadata

    from rlkit.doctor import versions

    real = metadata.version

    def version(name):
        if name == "bitsandbytes":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(versions.metadata, "version", version)
    assert verdicts(run(GRPO, smoke=True, families=("versions",)))["versions/bitsandbytes"] == "warn"
    report = run(GRPO, ["model.load_in_4bit=true"], families=("versions",))
    assert verdicts(report)["versions/bitsandbytes"] == "fail" and "model.load_in_4bit" in report.summary()
    saved = run(GRPO, ["model.load_in_4bit=false", "model.name_or_path=unsloth/Qwen3-1.7B-unsloth-bnb-4bit"],
                families=("versions",))
    assert verdicts(saved)["versions/bitsandbytes"] == "fail" and "saved in 4-bit" in saved.summary()


def test_ranges_are_none_when_rlkit_runs_from_a_checkout_never_installed(monkeypatch):
    from importlib import metadata

    from rlkit.doctor import versions

    def requires(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(versions.metadata, "requires", requires)
    assert versions.declared() == {}
    assert verdicts(run(GRPO, smoke=True, families=("versions",)))["versions/trl"] == "ok"


def test_gpu_recipe_needs_its_gpu_packages_here():
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    report = run(GRPO, families=("versions",))
    assert verdicts(report)["versions/vllm"] == "fail"


def test_report_files_are_whole(tmp_path, monkeypatch):
    import dataclasses

    from rlkit.doctor.render import markdown, write

    report = run(GRPO, smoke=True, families=CHEAP)
    md, js = write(report, tmp_path)
    assert json.loads(js.read_text())["go"] is True
    assert markdown(report).count("\n| ") >= len(report.checks)
    assert not list(tmp_path.glob(".*partial"))
    before = js.read_text()
    # A second report whose write is killed half-way through doctor.json: each file is the old one or the
    # new one, whole, never half of either.
    second = dataclasses.replace(report, recipe="second")
    real_write_text = Path.write_text

    def killed_in_json(self, data, *args, **kwargs):
        if "doctor.json" in self.name:
            real_write_text(self, data[: len(data) // 2], *args, **kwargs)
            raise KeyboardInterrupt
        return real_write_text(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", killed_in_json)
    with pytest.raises(KeyboardInterrupt):
        write(second, tmp_path)
    monkeypatch.undo()
    assert md.read_text() == markdown(second) != markdown(report)
    assert js.read_text() == before and json.loads(before)["recipe"] == report.recipe
    shutil.rmtree(tmp_path)


def test_learnability_runs_tool_episodes_for_an_agent_recipe():
    """A calculator recipe's probe plays whole episodes: a tool call, its result, then the answer."""
    def reply(request):
        if request["messages"][-1]["role"] != "tool":
            return {"tool_calls": [{"name": "calculate", "arguments": {"expression": "2 + 2"}}]}
        return {"content": f"#### {request['messages'][-1]['content']}"}

    with ScriptedServer(reply) as server:
        report = run(recipes_dir() / "gsm8k_calculator_grpo.yaml", smoke=True, families=("learnability",),
                     samples=2, limit=2, endpoint=server.url)
        tool_results = [m for r in server.requests for m in r["messages"] if m["role"] == "tool"]
    probe = next(c for c in report.checks if c.name == "probe")
    assert len(server.requests) == 8 and tool_results and tool_results[0]["content"].strip() == "4"
    assert probe.data["samples"] == 2 and probe.data["zero_variance"] == 1.0  # same reply every time: no signal
    assert probe.verdict == "fail"


@pytest.mark.trains
def test_no_doctor_skips_the_checks(monkeypatch, tmp_path, capsys):
    # --resume of a run that does not exist fails right after the doctor's place: which error comes first shows
    # whether the doctor ran.
    args = ["train", GRPO, "--smoke", "--resume", "--output-dir", tmp_path / "none",
            "--set", "rewards=[{name: 'tests.test_doctor:always_one'}]"]
    assert cli(monkeypatch, *args) == 1 and "no-go" in capsys.readouterr().err
    assert cli(monkeypatch, *args, "--no-doctor") == 2 and "no run to resume" in capsys.readouterr().err
