"""``rlkit merge`` on a QLoRA adapter trained on the tiny 4-bit model: the faithful merge reproduces the
adapter on its nf4 base, the naive one does not, and the adapter and an existing output survive."""

import hashlib
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from rlkit.errors import UserError
from rlkit.merge import merge, read_source
from rlkit.recipe import recipes_dir
from rlkit.train import train
from tests.test_cli import rlkit

# lr 2e-2 for 3 steps: the adapter visibly learns the `#### N` answer format (max logit change ~1.2) while
# staying in a range where bf16 storage is well-conditioned. (At 5e-2 single positions become sensitive
# to bf16 rounding of the merged weights, max |Δlogits| ~0.07, with or without a faithful merge.)
# dtype float32 (what `auto` means on CPU) keeps the reference in float32 on a GPU machine too.
# Training is seeded, so this adapter and every number below are the same on each run; seed 7 is one whose
# reference has no near-tied top-2 logits on the verification prompts (see the bf16 test).
QLORA = ["model.load_in_4bit=true", "model.dtype=float32", "trainer.learning_rate=2e-2", "trainer.max_steps=3",
         "trainer.seed=7"]

# The thresholds below hold for any LoRA init, not just this seed's: measured over 15 inits, the faithful
# bf16 merge had max |Δlogits| 0.004-0.011, mean 3.5e-4-5.2e-4, top-1 0.978-1.0 (flips only where the
# reference's own top-2 margin was < 3e-3) and greedy match 0.67-1.0; the merge onto the original weights
# had max 0.17-0.39, mean 0.010-0.018, top-1 0.81-0.95 (flips at margins 0.06-0.18), greedy 0.17-0.83.
# In rounding units (eps * max|reference logit|; positions now include the reference's greedy continuation),
# 21 float32- and bf16-recipe inits: correct merges flipped top-1 at <= 1.43 units with mean KL <= 0.07 units^2;
# merges onto the original weights had flips at up to >= 9.9 units and mean KL >= 4.8 (docs/merging.md).


def train_run(out, extra=()):
    # rlkit seeds before the LoRA is created (trainer.seed), so this adapter is the same on every run.
    return train(recipes_dir() / "gsm8k_sft.yaml", [*QLORA, *extra], smoke=True, output_dir=out)


def file_hashes(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_run(tmp_path_factory.mktemp("qlora") / "run")


@pytest.fixture(scope="module")
def adapter_before(run_dir):
    return file_hashes(run_dir / "adapter")


@pytest.fixture(scope="module")
def faithful(run_dir, adapter_before, tmp_path_factory):
    return merge(run_dir, tmp_path_factory.mktemp("merged") / "bf16", show_progress=False)


@pytest.fixture(scope="module")
def original(run_dir, adapter_before, tmp_path_factory):
    return merge(run_dir, tmp_path_factory.mktemp("merged") / "orig", base="original", show_progress=False)


def test_faithful_bf16_merge_reproduces_the_adapter_on_its_4bit_base(faithful):
    m = faithful["metrics"]
    assert faithful["trained_in_4bit"] and faithful["base_mode"] == "dequantized" and faithful["dtype"] == "bfloat16"
    assert m["positions"] > 100 and len(faithful["prompts"]) == 6
    # bf16 storage rounds every weight (relative 2^-9): that is all the error left after a faithful merge.
    assert m["max_abs_logit_diff"] <= 2e-2
    assert m["mean_abs_logit_diff"] <= 1e-3
    assert m["mean_kl"] <= 1e-6
    # Rounding can only break positions the reference itself nearly tied (other seeds: top-1 0.985-0.993,
    # every flip at a reference top-2 margin < 3e-3); on a CPU without AMX this run has none, with AMX (which
    # rounds the products otherwise) an occasional one (trained on a GPU: 0.996, seen on an H200); none decided.
    assert m["top1_agreement"] >= 0.99 and m["decided_flips"] == 0
    assert m["max_abs_logit_diff"] <= 1e-2
    assert m["top1_flip_max_ref_margin"] <= 5e-3
    assert m["greedy_match"] >= 0.5
    # The adapter matters: it moves the logits far more than the merge error (~200x here).
    assert m["adapter_effect_max_abs_logit"] > max(0.5, 20 * m["max_abs_logit_diff"])
    assert m["tokenizer"] == {"chat_template_equal": True, "vocab_equal": True, "prompt_ids_equal": True}
    assert m["rounding_eps"] == 2**-7 and m["decided_flips"] == 0 and m["beyond_rounding"] == []


def test_merged_dir_loads_with_plain_transformers(faithful, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = faithful["out"]
    names = {p.name for p in Path(out).iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "chat_template.jinja", "merge_report.json"} <= names
    assert not any(n.startswith("adapter") for n in names)
    config = json.loads((Path(out) / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.dtype == torch.bfloat16
    assert not any("lora" in n for n, _ in model.named_parameters())
    assert AutoTokenizer.from_pretrained(out).chat_template == AutoTokenizer.from_pretrained(tiny_model_dir).chat_template
    # Not the base in disguise: the merged weights move the logits.
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = torch.tensor([AutoTokenizer.from_pretrained(out)("Each box holds 6 eggs.")["input_ids"]])
    with torch.no_grad():
        delta = (model.float()(ids).logits - base(ids).logits).abs().max().item()
    assert delta > 0.3
    assert json.loads((Path(out) / "merge_report.json").read_text())["metrics"] == faithful["metrics"]


def test_original_weights_merge_drifts_further(faithful, original):
    f, o = faithful["metrics"], original["metrics"]
    assert o["max_abs_logit_diff"] > 10 * f["max_abs_logit_diff"]
    assert o["mean_abs_logit_diff"] > 10 * f["mean_abs_logit_diff"]
    assert o["mean_kl"] > 100 * f["mean_kl"]
    # Its top-1 changes are real decisions, not broken ties.
    assert o["top1_agreement"] < 0.97 and o["top1_flip_max_ref_margin"] > 0.03 and o["greedy_match"] < 1.0
    assert "drifts" in original["base_mode_note"] and "faithful" in faithful["base_mode_note"]
    # Beyond what bf16 rounding does: top-1 changes where the adapter was decided, and KL.
    assert o["decided_flips"] >= 3 and o["top1_flip_max_ref_margin_units"] > 8 and o["mean_kl_units"] > 2
    assert len(o["beyond_rounding"]) == 2 and f["beyond_rounding"] == []


def test_a_correct_bf16_merge_whose_greedy_decodes_differ_raises_no_warning(tmp_path, caplog):
    """The false warning of issue 26: a bf16 recipe (the reference computes in bf16), seed 1. The faithful merge
    changes greedy decodes, but only where the reference was tied within rounding; the naive one is flagged."""
    from rlkit.merge.report import warn_if_unfaithful

    run = train_run(tmp_path / "run", ["model.dtype=bfloat16", "trainer.seed=1"])
    caplog.clear()  # training's own INFO lines are not the merge's warnings
    with caplog.at_level("WARNING", logger="rlkit"):
        report = merge(run, tmp_path / "bf16", show_progress=False)
    m = report["metrics"]
    # Measured: greedy 0.5, top-1 0.969 (7 flips in 227 positions, the largest at 0.87 units), mean KL 0.032 units^2.
    assert m["greedy_match"] < 1.0 and m["top1_agreement"] < 1.0  # the old rule (greedy < 1) warned here
    assert m["decided_flips"] == 0 and m["top1_flip_max_ref_margin_units"] <= 2 and m["mean_kl_units"] < 0.5
    warnings = [r for r in caplog.records if r.name == "rlkit" and r.levelno >= logging.WARNING]
    assert m["beyond_rounding"] == [] and warnings == []
    naive = merge(run, tmp_path / "orig", base="original", show_progress=False)
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlkit"):
        warn_if_unfaithful({**naive, "base_mode": "dequantized"})  # the rule, applied to a wrong merge
    assert naive["metrics"]["decided_flips"] > 0 and "where the adapter was decided" in caplog.text


def test_float32_merge_is_exact_and_overwrite_is_explicit(run_dir, adapter_before, tmp_path):
    out = tmp_path / "fp32"
    out.mkdir()
    (out / "old.txt").write_text("keep me")
    with pytest.raises(UserError, match="not empty; pass --overwrite"):
        merge(run_dir, out, dtype="float32", show_progress=False)
    # --overwrite replaces only what rlkit wrote: a folder of the user's own files is refused.
    with pytest.raises(UserError, match="holds files rlkit did not write"):
        merge(run_dir, out, dtype="float32", overwrite=True, show_progress=False)
    assert [p.name for p in out.iterdir()] == ["old.txt"]
    (out / "old.txt").unlink()
    report = merge(run_dir, out, dtype="float32", show_progress=False)
    m = report["metrics"]
    assert m["max_abs_logit_diff"] <= 1e-4 and m["mean_kl"] <= 1e-10
    assert m["top1_agreement"] == 1.0 and m["greedy_match"] == 1.0
    assert (out / "model.safetensors").is_file() and (out / ".rlkit-owned").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["fp32"]  # no temporary siblings left behind


def test_a_failed_merge_leaves_no_output(run_dir, tmp_path, monkeypatch):
    import rlkit.merge

    def boom(*args, **kwargs):
        raise RuntimeError("verify failed")

    monkeypatch.setattr(rlkit.merge, "verify", boom)
    with pytest.raises(RuntimeError, match="verify failed"):
        merge(run_dir, tmp_path / "out", show_progress=False)
    assert list(tmp_path.iterdir()) == []


def test_base_model_must_be_the_trained_one(run_dir, tmp_path, tiny_model_dir):
    assert read_source(run_dir, "rlkit/tiny-qwen3").spec.name_or_path == "rlkit/tiny-qwen3"
    assert read_source(run_dir / "adapter", str(tiny_model_dir)).spec.load_in_4bit  # adapter dir inside a run
    checkpoint = read_source(run_dir / "checkpoints" / "checkpoint-3")
    assert checkpoint.run_dir == run_dir and checkpoint.spec.load_in_4bit and not checkpoint.notes
    # Only the recorded `model:` section is needed: a reward that no longer imports does not block a merge.
    copy = tmp_path / "copy"
    shutil.copytree(run_dir / "adapter", copy / "adapter")
    resolved = yaml.safe_load((run_dir / "recipe.resolved.yaml").read_text())
    resolved.update(algorithm="grpo", rewards=[{"name": "gone_module:reward"}])
    (copy / "recipe.resolved.yaml").write_text(yaml.safe_dump(resolved))
    assert read_source(copy).spec == read_source(run_dir).spec
    with pytest.raises(UserError, match="trained on 'rlkit/tiny-qwen3'"):
        merge(run_dir, tmp_path / "out", base_model="rlkit/tiny-qwen3-small", show_progress=False)
    assert not (tmp_path / "out").exists()


def test_bad_sources_and_outputs_are_refused(run_dir, tmp_path):
    with pytest.raises(UserError, match="no adapter_config.json"):
        merge(tmp_path, tmp_path / "out", show_progress=False)
    with pytest.raises(UserError, match="overlaps the input directory"):
        merge(run_dir, run_dir, overwrite=True, show_progress=False)
    with pytest.raises(UserError, match="overlaps the input directory"):
        merge(run_dir, run_dir / "adapter" / "merged", show_progress=False)
    with pytest.raises(UserError, match="--dtype"):
        merge(run_dir, tmp_path / "out", dtype="int8", show_progress=False)
    assert (run_dir / "adapter" / "adapter_config.json").is_file() and not (tmp_path / "out").exists()


def test_bare_adapter_dir_is_merged_onto_its_16bit_base(run_dir, tmp_path):
    bare = tmp_path / "adapter"
    shutil.copytree(run_dir / "adapter", bare)
    report = merge(bare, tmp_path / "out", dtype="float32", show_progress=False)
    assert not report["trained_in_4bit"] and "16-bit" in report["reference"]
    assert "same merge" in report["base_mode_note"] and "no run directory" in report["base_mode_note"]
    assert report["metrics"]["max_abs_logit_diff"] <= 1e-4 and report["metrics"]["greedy_match"] == 1.0


def test_modules_to_save_with_tied_embeddings(tmp_path, tiny_model_dir):
    """Real Qwen3-1.7B ties lm_head to embed_tokens; an adapter that trains lm_head must untie them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tied = tmp_path / "tied-base"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    model.save_pretrained(tied)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tied)
    run = train_run(tmp_path / "run", [f"model.name_or_path={tied}", "lora.modules_to_save=[lm_head]"])
    report = merge(run, tmp_path / "out", dtype="float32", show_progress=False)
    m = report["metrics"]
    assert m["max_abs_logit_diff"] <= 1e-4 and m["top1_agreement"] == 1.0 and m["greedy_match"] == 1.0
    assert m["adapter_effect_max_abs_logit"] > 0.5
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is False
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert not torch.equal(merged.lm_head.weight, merged.model.embed_tokens.weight)


def test_cli_merge_writes_report_and_user_errors_exit_2(run_dir, tmp_path):
    res = rlkit("merge", run_dir, "--out", tmp_path / "merged", "--dtype", "float32")
    assert res.returncode == 0, res.stderr
    assert "top-1 agreement" in res.stdout and "max |Δlogits|" in res.stdout
    report = json.loads((tmp_path / "merged" / "merge_report.json").read_text())
    assert report["metrics"]["max_abs_logit_diff"] <= 1e-4 and report["dtype"] == "float32"
    res = rlkit("merge", run_dir, "--out", tmp_path / "merged")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [f"rlkit: error: --out {tmp_path / 'merged'}: directory is not empty; "
                                               "pass --overwrite to replace it"]
    res = rlkit("merge", tmp_path, "--out", tmp_path / "x")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert res.stderr.startswith("rlkit: error:") and "no adapter_config.json" in res.stderr


def test_adapter_files_are_never_modified(run_dir, adapter_before, faithful, original):
    # Last in the file: every merge above read this adapter (bf16, original, fp32, failed, CLI).
    assert file_hashes(run_dir / "adapter") == adapter_before


def test_eval_accepts_the_merged_directory(run_dir, tmp_path):
    from rlkit.evaluate import evaluate

    merged = tmp_path / "fp32"
    merge(run_dir, merged, dtype="float32", show_progress=False)
    adapter = evaluate(run_dir, out=tmp_path / "a.json", show_progress=False)
    exported = evaluate(run_dir, model=str(merged), out=tmp_path / "m.json", show_progress=False)
    # The base the adapter sits on (the recipe's 4-bit tiny model), on the same examples.
    base = evaluate(recipes_dir() / "gsm8k_sft.yaml", smoke=True, overrides=QLORA, out=tmp_path / "b.json",
                    show_progress=False)
    assert exported["model"] == str(merged) and exported["n"] == adapter["n"] == base["n"] == 8
    assert [e["prompt"] for e in base["examples"]] == [e["prompt"] for e in adapter["examples"]]
    # The same greedy completions from the exported model as from the adapter on its 4-bit base,
    # and they are the adapter's: the base alone answers differently.
    completions = [e["completion"] for e in exported["examples"]]
    assert completions == [e["completion"] for e in adapter["examples"]]
    assert sum(a != b for a, b in zip(completions, [e["completion"] for e in base["examples"]], strict=True)) >= 4


def test_compare_on_hand_made_logits():
    import math

    from rlkit.merge.verification import compare

    # Prompt A: one logit off by 0.5, same top-1 and greedy ids. Prompt B: top-1 flips where the
    # reference's margin was 0.1, and greedy decoding differs.
    ref_a, new_a = torch.tensor([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0]]), torch.tensor([[3.0, 1.0, 0.5], [0.0, 2.0, 1.0]])
    ref_b, new_b = torch.tensor([[1.0, 0.9, 0.0]]), torch.tensor([[0.8, 1.0, 0.0]])
    c = compare([(ref_a, [5, 6]), (ref_b, [1])], [(new_a, [5, 6]), (new_b, [2])], eps=2**-7)

    def kl(p, q):  # KL(softmax(p) || softmax(q)), by hand
        zp, zq = sum(math.exp(x) for x in p), sum(math.exp(x) for x in q)
        return sum(math.exp(a) / zp * ((a - math.log(zp)) - (b - math.log(zq))) for a, b in zip(p, q, strict=True))

    kls = [kl([3, 1, 0], [3, 1, 0.5]), 0.0, kl([1, 0.9, 0], [0.8, 1, 0])]
    assert c["positions"] == 3 and c["greedy_match"] == 0.5
    assert c["max_abs_logit_diff"] == pytest.approx(0.5) and c["mean_abs_logit_diff"] == pytest.approx(0.8 / 9)
    assert c["top1_agreement"] == pytest.approx(2 / 3) and c["top1_flip_max_ref_margin"] == pytest.approx(0.1)
    assert c["mean_kl"] == pytest.approx(sum(kls) / 3, rel=1e-6)
    a, b = c["prompts"]
    assert (a["tokens"], a["top1_agreement"], a["greedy_match"], a["top1_flip_max_ref_margin"]) == (2, 1.0, True, 0.0)
    assert a["max_abs_logit_diff"] == pytest.approx(0.5) and a["mean_kl"] == pytest.approx(kls[0] / 2, rel=1e-6)
    assert (b["tokens"], b["top1_agreement"], b["greedy_match"]) == (1, 0.0, False)
    assert b["max_abs_logit_diff"] == pytest.approx(0.2) and b["top1_flip_max_ref_margin"] == pytest.approx(0.1)
    # Rounding units: eps * max|ref logit| per position (A: 3/128 and 2/128, B: 1/128). B's flip was decided
    # (margin 0.1 = 12.8 units > 4); KL in units squared, averaged over positions.
    assert c["rounding_eps"] == 2**-7 and c["top1_flip_max_ref_margin_units"] == pytest.approx(12.8)
    assert c["decided_flips"] == 1 and (a["decided_flips"], b["decided_flips"]) == (0, 1)
    units = [3 / 128, 2 / 128, 1 / 128]
    assert c["mean_kl_units"] == pytest.approx(sum(k / u**2 for k, u in zip(kls, units, strict=True)) / 3, rel=1e-6)
    assert len(c["beyond_rounding"]) == 2 and "1 top-1 change(s)" in c["beyond_rounding"][0]


def report_of(reference, merged, eps=2**-7, mode="dequantized"):
    from rlkit.merge.verification import compare

    checks = compare(reference, merged, eps=eps)
    checks["tokenizer"] = {"chat_template_equal": True}
    return {"metrics": checks, "base_mode": mode, "dtype": "bfloat16", "path": "merge_report.json"}


def test_a_near_tie_flip_is_rounding_and_a_decided_flip_is_not(caplog):
    """A correct bf16 merge breaks the reference's exact ties either way (SmolLM2 in bf16: 6 of 7 flips at
    margin 0.0, logits ~25 quantized in steps of 0.125) and may change a greedy decode there; only a top-1
    change where the reference was decided, or KL beyond the dtype's rounding, is a warning."""
    from rlkit.merge.report import warn_if_unfaithful

    ref = torch.tensor([[24.0, 24.0, 10.0], [25.0, 24.875, 3.0], [20.0, 18.0, 0.0]])
    # Rounding: the tie and the one-ulp lead (0.125 = 0.64 units of 25/128) both go the other way.
    rounded = torch.tensor([[23.98, 24.02, 10.01], [24.97, 24.99, 3.0], [20.01, 17.99, 0.0]])
    tie = report_of([(ref, [0, 0, 0])], [(rounded, [1, 1, 0])])
    m = tie["metrics"]
    assert m["top1_agreement"] == pytest.approx(1 / 3) and m["greedy_match"] == 0.0
    assert m["decided_flips"] == 0 and m["top1_flip_max_ref_margin_units"] == pytest.approx(0.64)
    assert m["mean_kl_units"] < 0.1 and m["beyond_rounding"] == []
    with caplog.at_level("WARNING", logger="rlkit"):
        warn_if_unfaithful(tie)
    assert caplog.records == []
    # A wrong merge: the third position's 2.0 lead (12.8 units of 20/128) is overturned.
    wrong = torch.tensor([[23.98, 24.02, 10.01], [25.0, 24.875, 3.0], [19.0, 19.5, 0.0]])
    decided = report_of([(ref, [0, 0, 0])], [(wrong, [1, 0, 1])])
    assert decided["metrics"]["decided_flips"] == 1
    with caplog.at_level("WARNING", logger="rlkit"):
        warn_if_unfaithful(decided)
    assert len(caplog.records) == 1 and "1 top-1 change(s) where the adapter was decided" in caplog.text
    # KL beyond rounding without any top-1 change: the runner-up pushed down by 4.0 (~20 units), the last up.
    caplog.clear()
    drift = report_of([(ref, [0, 0, 0])], [(ref + torch.tensor([0.0, -4.0, 4.0]), [0, 0, 0])])
    assert drift["metrics"]["decided_flips"] == 0 and drift["metrics"]["mean_kl_units"] > 1
    with caplog.at_level("WARNING", logger="rlkit"):
        warn_if_unfaithful(drift)
    assert len(caplog.records) == 1 and "mean KL" in caplog.text
    # The unit scales with eps: at eps 2^-4 (a unit of 1.25 at logit 20) the same 2.0 lead is 1.6 units, a
    # near-tie. --base original is expected to drift and never warns.
    assert report_of([(ref, [0, 0, 0])], [(wrong, [1, 0, 1])], eps=2**-4)["metrics"]["decided_flips"] == 0
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlkit"):
        warn_if_unfaithful(report_of([(ref, [0, 0, 0])], [(wrong, [1, 0, 1])], mode="original"))
    assert caplog.records == []


def test_verify_measures_a_merge_that_left_the_adapter_out(tmp_path, tiny_model_dir):
    """verify() on a LoRA with a known effect: the true merge matches it, the bare base differs by exactly
    the adapter's effect, and both it and a merge at twice the LoRA scaling are flagged beyond rounding."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit.merge.verification import verify

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                            init_lora_weights=False))  # random B: an adapter that does something
    lora.save_pretrained(tmp_path / "adapter")
    tokenizer.save_pretrained(tmp_path / "adapter")
    for name, weights in {"merged": lora.merge_and_unload(), "base": AutoModelForCausalLM.from_pretrained(tiny_model_dir)}.items():
        weights.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    doubled = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                                        tmp_path / "adapter")
    for module in doubled.modules():
        if isinstance(getattr(module, "scaling", None), dict):
            module.scaling = {name: 2 * value for name, value in module.scaling.items()}
    doubled.merge_and_unload().save_pretrained(tmp_path / "doubled")
    tokenizer.save_pretrained(tmp_path / "doubled")
    src = read_source(tmp_path / "adapter", base_model=str(tiny_model_dir))
    good, bad = verify(src, tmp_path / "merged"), verify(src, tmp_path / "base")
    effect = good["adapter_effect_max_abs_logit"]
    assert effect > 0.05 and bad["adapter_effect_max_abs_logit"] == effect
    assert good["max_abs_logit_diff"] <= 1e-4 and good["top1_agreement"] == 1.0 and good["greedy_match"] == 1.0
    assert bad["max_abs_logit_diff"] == pytest.approx(effect, abs=1e-5)  # merged == base: the diff is the effect
    assert bad["positions"] == good["positions"] > 50 and all(good["tokenizer"].values())
    # float32 on both sides: the rounding unit is TF32's (a GPU may run float32 matmuls in it), no coarser.
    assert good["rounding_eps"] == bad["rounding_eps"] == 2**-10
    assert good["beyond_rounding"] == [] and bad["decided_flips"] > 0 and len(bad["beyond_rounding"]) == 2
    assert len(verify(src, tmp_path / "doubled")["beyond_rounding"]) == 2
