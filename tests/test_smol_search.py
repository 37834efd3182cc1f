"""The search-agent recipes for SmolLM2-135M: a 2-step GRPO with `env: retrieval` on the real model whose
tool mask covers exactly the tool text of two-search episodes, and which trains the LoRA, not the base."""

import json

import pytest
import yaml

from rlkit.recipe import load_recipe, recipes_dir
from tests.helpers import script_and_capture

from .conftest import SHARED_DATA

SFT = recipes_dir() / "smol_search_sft.yaml"
GRPO = recipes_dir() / "smol_search_grpo.yaml"


def test_recipes_load_with_the_retrieval_env_on_the_synthetic_corpus():
    for path in (SFT, GRPO):
        recipe = load_recipe(path, [])
        assert recipe.env.name == "retrieval" and recipe.retrieval.synthetic == 40
        assert recipe.data.task == "multihop_rag" and recipe.data.eval == load_recipe(GRPO, []).data.eval
    recipe = load_recipe(GRPO, [])
    assert [(r.name, r.weight, r.args.get("metric")) for r in recipe.rewards] == [
        ("qa_correct", 1.0, "f1"), ("answer_format", 0.1, None)]


def _script_oracle(trainer, tok, gold):
    """The trainer's generation made the oracle's moves: search each hop, then answer the gold (every other
    episode answers "Nobody" instead, so a group's rewards differ and GRPO has an advantage to learn from)."""
    answers = {"n": 0}

    def scripted(prompt_ids, images, multimodal_fields, *args, **kwargs):  # TRL 1.14 adds num_generations
        completions = []
        for ids in prompt_ids:
            text = tok.decode(ids)
            question = next(q for q in gold if q in text)
            done = text.count("<|im_start|>tool\n")
            hops = gold[question]["searches"]
            if done < len(hops):
                call = {"name": "search", "arguments": {"query": hops[done]}}
                reply = f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>"
            else:
                answers["n"] += 1
                answer = gold[question]["answer"] if answers["n"] % 2 else "Nobody"
                reply = f"<answer>{answer}</answer><|im_end|>"
            completions.append(tok(reply, add_special_tokens=False)["input_ids"])
        return completions, None

    return script_and_capture(trainer, scripted)


@pytest.mark.slow  # two real GRPO steps of a 135M model on CPU (generation scripted)
@pytest.mark.timeout(300)
def test_two_grpo_steps_with_retrieval_mask_exactly_the_tool_text_and_train_only_the_lora(smollm2_dir, tmp_path):
    import torch

    from rlkit.agents.oracle import oracle_gold
    from rlkit.envs.retrieval import RetrievalEnv, factory_kwargs
    from rlkit.train import build_trainer

    overrides = ["trainer.max_steps=2", "trainer.per_device_train_batch_size=2", "trainer.num_generations=2",
                 "trainer.learning_rate=1e-2", "trainer.save_steps=2", "trainer.max_completion_length=512",
                 "data.train.synthetic=8", "retrieval.top_k=1",  # one passage per search: small, fast steps
                 "eval.agent_limit=2"]  # the recipe's agent eval (step 0 and the end) on 2 questions, not 20
    from rich.console import Console

    from rlkit.demos.stages import machine_overrides

    # float32 where bf16 would be emulated, as the demos choose (timed out at 300 s in bf16 on an AMD EPYC with AVX2)
    recipe = load_recipe(GRPO, machine_overrides(Console(stderr=True)) + overrides)
    gold = oracle_gold(recipe, "train", None)  # 8 questions: two hops each, one search for the 2 null ones
    trainer, tok = build_trainer(recipe, tmp_path)
    batches = _script_oracle(trainer, tok, gold)
    lora = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    base = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}
    trainer.train()

    env = RetrievalEnv(**factory_kwargs(recipe))
    assert len(batches) == 2
    two_search = 0
    for batch in batches:
        for ids, mask, tool in zip(batch["completion_ids"], batch["completion_mask"], batch["tool_mask"], strict=True):
            keep = mask.bool()
            model_text, tool_text = tok.decode(ids[keep & tool.bool()]), tok.decode(ids[keep & ~tool.bool()])
            calls = [json.loads(c.partition("\n</tool_call>")[0]) for c in model_text.split("<tool_call>\n")[1:]]
            if len(calls) < 2:
                continue  # a null question: one search for its own words
            two_search += 1
            results = [env.search(c["arguments"]["query"]) for c in calls]
            # What the model wrote: the two calls and the answer. Masked: exactly the two tool turns.
            assert model_text.count("<|im_end|>") == 3 and model_text.endswith("</answer><|im_end|>")
            assert tool_text == "".join(f"\n<|im_start|>tool\n<tool_response>\n{r}\n</tool_response><|im_end|>\n"
                                        "<|im_start|>assistant\n" for r in results)
    assert two_search >= 2
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(lora[n], after[n].detach()) for n in lora), "the LoRA did not train"
    assert all(torch.equal(base[n], after[n].detach()) for n in base), "a base weight changed"


@pytest.mark.report
@pytest.mark.timeout(600)
def test_search_demo_runs_every_stage_and_reports_the_three_models_on_every_set(tmp_path):
    """`make demo-search`'s wiring, on the tiny model with one SFT and one GRPO step (the numbers are the demo's job)."""
    from rlkit.demos.search import run_search_demo

    tiny = ["model.name_or_path=rlkit/tiny-qwen3", "model.dtype=float32", "trainer.max_steps=1",
            "trainer.save_steps=1", "model.max_seq_length=1024", "eval.max_new_tokens=8", "eval.ifeval.max_new_tokens=8"]
    grpo = ["trainer.num_generations=2", "trainer.max_completion_length=16"]  # float32: 4 completions a pass, twice
    data = SHARED_DATA if SHARED_DATA.is_dir() else None  # HotpotQA's closed set and IFEval's prompts, when here
    summary = run_search_demo(tmp_path / "demo", tiny, grpo, teacher_questions=4, limit=3, data_dir=data)
    slugs = ["heldout", "newwording"] + (["hotpotqa"] if (SHARED_DATA / "hotpotqa_closed").is_dir() else [])
    assert [r["slug"] for r in summary["rows"]] == slugs and all(r["n"] == 3 for r in summary["rows"])
    for r in summary["rows"]:
        assert all(0 <= r[f"{k}_f1"] <= 1 and r[f"{k}_searches"] >= 0 for k in ("base", "sft", "grpo", "control"))
        assert r["grpo_minus_sft"]["diff"] == pytest.approx(r["grpo_f1"] - r["sft_f1"])
        assert r["sft_minus_base"]["diff"] == pytest.approx(r["sft_f1"] - r["base_f1"])
        assert r["grpo_minus_control"]["diff"] == pytest.approx(r["grpo_f1"] - r["control_f1"])
    assert [s["stage"] for s in summary["stages"]] == ["model build / cache check", "base eval", "teacher rollout",
                                                       "SFT training", "SFT eval", "GRPO training", "GRPO eval",
                                                       "SFT continued (control)", "control eval",
                                                       *(["IFEval check"] if (SHARED_DATA / "ifeval").is_dir() else [])]
    control = (demo := tmp_path / "demo") / "sft-continued" / "recipe.resolved.yaml"
    assert f"init_from: {demo / 'sft'}" in control.read_text() and "sft_rows.jsonl" in control.read_text()
    demo = tmp_path / "demo"
    teacher = [json.loads(line) for line in (demo / "teacher" / "sft_rows.jsonl").read_text().splitlines()]
    assert len(teacher) == 4 and all(row["messages"][-1]["content"].startswith("<answer>") for row in teacher)
    grpo_run = yaml.safe_load((demo / "grpo" / "recipe.resolved.yaml").read_text())
    assert grpo_run["init_from"] == str(demo / "sft")
    assert (grpo_run["trainer"]["per_device_train_batch_size"], grpo_run["trainer"]["gradient_accumulation_steps"]) == (
        4, 2)  # the demo's float32 GRPO (FLOAT32_GRPO)
    assert grpo_run["model"]["attn_implementation"] is None  # float32: transformers' default, not the recipe's eager
    assert grpo_run["trainer"]["cache_implementation"] is None  # and its default cache, not the recipe's static
    assert sorted(p.name for p in (demo / "grpo" / "eval").glob("*.json")) == sorted(
        f"{tag}-{slug}.json" for tag in ("base", "sft", "grpo", "control") for slug in slugs)
    assert sorted(p.name for p in (demo / "grpo" / "eval").glob("*.trajectories.jsonl")) == sorted(
        f"{tag}-{slug}.trajectories.jsonl" for tag in ("base", "sft", "grpo", "control") for slug in slugs)
    # report.md analyses every stage's episodes in the order they were played: base, then SFT, then GRPO
    report = (demo / "grpo" / "report.md").read_text()
    rows = [line.split("`")[1] for line in report.split("## Agent episodes", 1)[1].splitlines()
            if line.startswith("| `eval/")]
    assert rows == [f"eval/{tag}-{slug}.json" for tag in ("base", "sft", "grpo", "control") for slug in slugs]
    peaks = [s["peak_rss_gb"] for s in summary["stages"]]
    assert peaks[0] > 0.1 and peaks == sorted(peaks) and summary["peak_rss_gb"] >= peaks[-1]
    # every stage that loads a model ran in its own process, its own peak recorded; the teacher (no model) here
    fresh = {s["stage"]: s for s in summary["stages"] if "stage_peak_rss_gb" in s}
    assert [s["stage"] for s in summary["stages"] if s["stage"] not in fresh] == ["teacher rollout"]
    for name in ("SFT training", "GRPO training", "SFT continued (control)"):  # each imported torch and TRL and loaded the model itself
        assert fresh[name]["stage_peak_rss_gb"] > 0.3 and fresh[name]["demo_rss_gb"] > 0.1
    kept = json.loads((demo / "grpo" / "best.json").read_text())  # step 0 or 1: the agent eval's pick is evaluated
    assert summary["grpo_kept"]["step"] == kept["step"] in (0, 1)
    assert json.loads((demo / "grpo" / "eval" / "grpo-heldout.json").read_text())["model"].endswith("best")
    assert (demo / "f1_by_stage.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((demo / "demo.json").read_text())["rows"] == summary["rows"]
    asked = [json.loads(line)["messages"][1]["content"]
             for line in (demo / "eval" / "base-newwording.trajectories.jsonl").read_text().splitlines()]
    assert len(asked) == 3 and not any(shape in q for shape in ("Which company", "What price did", "report higher", "published before")
                                    for q in asked)
