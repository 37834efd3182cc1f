"""Agent eval during GRPO training (eval.agent_every): scores logged every N steps, the best adapter kept."""

import json

from rlkit.recipe import load_recipe, recipes_dir

MULTIHOP = recipes_dir() / "multihop_rag_grpo.yaml"


def test_grpo_with_an_env_scores_the_agent_every_n_steps_and_keeps_the_best(tmp_path, monkeypatch):
    from rlkit.train import build_trainer

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    recipe = load_recipe(MULTIHOP, ["trainer.max_steps=3", "eval.agent_every=2", "eval.agent_limit=3",
                                    "eval.max_new_tokens=8", "trainer.logging_steps=1"], smoke=True)
    trainer, _ = build_trainer(recipe, tmp_path, smoke=True)
    trainer.train()
    entries = [json.loads(line) for line in (tmp_path / "agent_eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in entries] == [2, 3]  # every 2 steps, and once at the end
    assert all(e["n"] == 3 and 0.0 <= e["f1"] <= 1.0 for e in entries)
    best = json.loads((tmp_path / "best.json").read_text())
    top = max(entries, key=lambda e: (e["f1"], -e["step"]))
    assert best["step"] == top["step"] and best["f1"] == top["f1"] and "highest held-out F1" in best["why"]
    assert (tmp_path / "best" / "adapter_config.json").exists()
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "agent_eval/f1" in r][:1] == [2]
    from rlkit.report import write_report

    summary = write_report(tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert f"Step **{best['step']}**, kept in `best/`" in report and "agent_eval.png" in report
    assert any(p.name == "agent_eval.png" for p in summary["plots"])


def test_agent_eval_is_off_by_default_and_its_fields_are_strict():
    import pytest

    from rlkit.errors import UserError

    assert load_recipe(MULTIHOP, []).eval.agent_every is None
    with pytest.raises(UserError):
        load_recipe(MULTIHOP, ["eval.agent_every=0"])
