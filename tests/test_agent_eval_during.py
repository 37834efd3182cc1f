"""Agent eval during GRPO training (eval.agent_every): scores logged every N steps, the best adapter kept."""

import json

import pytest

from rlkit.recipe import load_recipe, recipes_dir
from rlkit.stats import wilson

MULTIHOP = recipes_dir() / "multihop_rag_grpo.yaml"


def _train_with_agent_eval(tmp_path, monkeypatch, overrides: list[str]):
    """The smoke multihop GRPO recipe with the agent eval on 3 questions, trained: the recipe, the trainer and
    the agent_eval.jsonl rows."""
    from rlkit.train import build_trainer

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    recipe = load_recipe(MULTIHOP, [*overrides, "eval.agent_limit=3", "eval.max_new_tokens=8"], smoke=True)
    trainer, _ = build_trainer(recipe, tmp_path, smoke=True)
    trainer.train()
    return recipe, trainer, [json.loads(line) for line in (tmp_path / "agent_eval.jsonl").read_text().splitlines()]


def test_grpo_with_an_env_scores_the_agent_every_n_steps_and_keeps_the_best(tmp_path, monkeypatch):
    _, _, entries = _train_with_agent_eval(tmp_path, monkeypatch, ["trainer.max_steps=3", "eval.agent_every=2",
                                                                "trainer.logging_steps=1"])
    assert [e["step"] for e in entries] == [0, 2, 3]  # the start, every 2 steps, and once at the end
    assert all(e["n"] == 3 and 0.0 <= e["f1"] <= 1.0 for e in entries)
    assert all(e["f1_interval"][0] <= e["f1"] <= e["f1_interval"][1] for e in entries)
    assert all(e["em_interval"] == pytest.approx(list(wilson(round(3 * e["em"]), 3)), abs=1e-4) for e in entries)
    best = json.loads((tmp_path / "best.json").read_text())
    top = max(entries, key=lambda e: (e["f1"], -e["step"]))
    assert best["step"] == top["step"] and best["f1"] == top["f1"] and "highest held-out F1" in best["why"]
    assert (tmp_path / "best" / "adapter_config.json").exists() and (tmp_path / "best" / "tokenizer_config.json").exists()
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "agent_eval/f1" in r][:1] == [2]
    from rlkit.report import write_report

    summary = write_report(tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert f"Step **{best['step']}**, kept in `best/`: {best['why']}." in report and "agent_eval.png" in report
    assert any(p.name == "agent_eval.png" for p in summary["plots"])


def test_when_no_step_beats_the_start_best_is_the_start_and_says_so(tmp_path, monkeypatch):
    """At learning rate 0 every step scores what the start scored: the tie keeps step 0, and best.json says that
    no update beat it; a resumed run's callback starts from the kept best, not from nothing."""
    from rlkit.evaluate.during import agent_eval_callback
    recipe, trainer, entries = _train_with_agent_eval(tmp_path, monkeypatch, ["trainer.max_steps=2",
                                                                              "eval.agent_every=1",
                                                                              "trainer.learning_rate=0"])
    assert [e["step"] for e in entries] == [0, 1, 2] and len({e["f1"] for e in entries}) == 1
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["step"] == 0 and "(the model before any update)" in best["why"]
    assert best["why"].endswith("no training step scored higher than the start (step 0, before any update), so "
                                "`best/` holds the adapter training began from")
    # Resuming: the callback reads the kept best, so a later step must beat step 0's F1 to replace it.
    from transformers import TrainerControl, TrainerState

    callback = agent_eval_callback(recipe, tmp_path, trainer.processing_class)
    callback.on_step_end(trainer.args, TrainerState(global_step=3), TrainerControl(), model=trainer.model)
    entries = [json.loads(line) for line in (tmp_path / "agent_eval.jsonl").read_text().splitlines()]
    assert entries[-1]["step"] == 3 and entries[-1]["f1"] == best["f1"]  # scored, the same F1: a tie
    assert json.loads((tmp_path / "best.json").read_text())["step"] == 0  # without the kept best, step 3 would be


def test_best_holds_the_trained_adapter_alone_beside_a_kl_reference(tmp_path, monkeypatch, sft_run):
    """From init_from with beta > 0, TRL trains "default" beside a frozen "ref" copy and PEFT saves every adapter:
    best/ keeps the trained one alone (as the run's adapter/ does), and it is the one the model trained."""
    from safetensors.torch import load_file

    _, trainer, entries = _train_with_agent_eval(tmp_path, monkeypatch, [
        f"init_from={sft_run}", "lora=null", "trainer.beta=0.04", "trainer.max_steps=1", "eval.agent_every=1",
        "trainer.learning_rate=1e-2"])
    assert [e["step"] for e in entries] == [0, 1] and "ref" in trainer.model.peft_config
    assert not (tmp_path / "best" / "ref").exists()
    kept = load_file(tmp_path / "best" / "adapter_model.safetensors")
    assert kept and not any(".ref." in name for name in kept)


def _records(right: int) -> list[dict]:
    """Ten scored episodes: the first ``right`` answered exactly (F1 1), the others half right (F1 0.5)."""
    return [{"metrics": {"f1": 1.0 if i < right else 0.5, "em": float(i < right)}, "tool_calls": [{}, {}]}
            for i in range(10)]


def test_agent_eval_rows_best_json_and_the_report_carry_intervals(tmp_path):
    """EM 1/10 and 3/10: Wilson [0.018, 0.404] and [0.108, 0.603]; F1 of 3 ones and 7 halves: bootstrap [0.5, 0.8]."""
    from rlkit.evaluate.during import scores, why
    from rlkit.report import write_report
    from tests.test_report import make_run

    earlier, entry = scores(_records(1), 2, 1.0), scores(_records(3), 4, 1.234)
    assert earlier["em_interval"] == pytest.approx([0.0179, 0.4042], abs=1e-4)
    assert entry == {"step": 4, "n": 10, "f1": 0.65, "f1_interval": [0.5, 0.8], "em": 0.3,
                     "em_interval": pytest.approx([0.1078, 0.6032], abs=1e-4), "searches": 2.0, "seconds": 1.23}
    reason = why(entry, earlier)
    assert reason == ("the highest held-out F1 (0.650 [0.500, 0.800]; EM 0.300 [0.108, 0.603]; greedy, n=10) of the "
                      "agent evals so far; step 2 had F1 0.550 [0.500, 0.650]")
    run = make_run(tmp_path / "run", "grpo", [{"step": 4, "reward": 0.5}])
    (run / "best.json").write_text(json.dumps({**entry, "why": reason}))
    write_report(run)
    assert ("Step **4**, kept in `best/`: the highest held-out F1 (0.650 [0.500, 0.800]; EM 0.300 [0.108, 0.603]; "
            "greedy, n=10)") in (run / "report.md").read_text()


def test_agent_eval_is_off_by_default_and_its_fields_are_strict():
    from rlkit.errors import UserError

    assert load_recipe(MULTIHOP, []).eval.agent_every is None
    with pytest.raises(UserError):
        load_recipe(MULTIHOP, ["eval.agent_every=0"])
