"""rlkit's CPU generation path (rlkit.inference.fastgen) on the real SmolLM2 weights: what it changes, that an
explicit recipe choice is kept, and that the faster model computes what the slower one did."""

import pytest
import torch

from rlkit.inference.fastgen import EAGER_GQA, SDPA_GQA, cpu_has_native_bf16, for_generation

PROMPTS = ["What is 12 + 30?", "Name a colour.", "Tom has 3 apples and buys 4 more. How many now?",
           "Write one word."]


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    tokenizer.padding_side = "left"
    return tokenizer


def _model(path, dtype, lora=False):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    if not lora:
        return model
    torch.manual_seed(0)
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False))
    return peft.eval()


def _batch(tok):
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in PROMPTS]
    return tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)


def _greedy(model, tok, batch, n=24):
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
    return out[:, batch["input_ids"].shape[1]:]


def test_bf16_gets_eager_attention_and_a_static_cache_that_change_nothing_but_speed(smollm2_dir, tok):
    """The static cache changes how the step runs, not what it computes: greedy tokens are identical to the
    same eager model with a dynamic cache, or part from it only at a near tie (a CPU with AMX rounds the padded
    cache's products apart: measured one bf16 step, 24.375 vs 24.5, after 16 equal tokens). Eager attention rounds differently from SDPA in bf16 but is as
    faithful to the fp32 model (measured: mean |Δlogit| 0.205 vs 0.202, top-1 agreement 0.993 for both)."""
    batch = _batch(tok)
    keep = batch["attention_mask"].bool()
    with torch.inference_mode():
        fp32 = _model(smollm2_dir, torch.float32)(**batch).logits
        sdpa = _model(smollm2_dir, torch.bfloat16)
        sdpa_logits = sdpa(**batch).logits.float()
    fast = for_generation(sdpa, "bfloat16")
    if not cpu_has_native_bf16():  # measured on an AMD EPYC with AVX2: eager's top-1 agreement with fp32 0.974,
        # SDPA's 0.994 (mean |dlogit| 0.211 vs 0.193), so a bf16 model there keeps the attention it was loaded with
        assert fast.config._attn_implementation == "sdpa" and fast.generation_config.cache_implementation is None
        return
    assert fast.config._attn_implementation == "eager"
    assert fast.generation_config.cache_implementation == "static"
    dynamic = _model(smollm2_dir, torch.bfloat16)
    dynamic.set_attn_implementation("eager")
    with torch.inference_mode():
        eager_logits = fast(**batch).logits.float()
        assert torch.equal(eager_logits, dynamic(**batch).logits.float())  # the prompt's forward: the same numbers
    static, grown = _greedy(fast, tok, batch), _greedy(dynamic, tok, batch)
    assert (static == grown).float().mean() > 0.8
    for row in range(len(PROMPTS)):  # later steps attend over a padded cache: a CPU with AMX rounds them apart
        differ = (static[row] != grown[row]).nonzero()
        if len(differ):  # ... only where the dynamic cache's own top two were within a bf16 rounding step
            at = differ[0].item()
            ids = torch.cat([batch["input_ids"][row], static[row, :at]])[None]
            mask = torch.cat([batch["attention_mask"][row], torch.ones(at, dtype=torch.long)])[None]
            with torch.inference_mode():
                logits = dynamic(input_ids=ids, attention_mask=mask).logits[0, -1].float()
            assert abs(logits[static[row, at]] - logits[grown[row, at]]) <= 0.25

    def error(logits):
        return (logits - fp32)[keep].abs().mean().item(), (logits.argmax(-1) == fp32.argmax(-1))[keep].float().mean()

    (eager_err, eager_top1), (sdpa_err, sdpa_top1) = error(eager_logits), error(sdpa_logits)
    assert eager_err < 1.1 * sdpa_err and eager_top1 >= sdpa_top1 - 0.01
    assert eager_top1 > 0.98


def test_grouped_query_heads_are_left_to_torch_and_change_no_number(smollm2_dir, tok):
    """SmolLM2's 9 query heads share 3 key/value heads. transformers copies each key/value head three times before
    CPU SDPA whenever a padded batch has a mask; rlkit's attention hands the grouping to torch (``enable_gqa``). In
    float32 the prompt's logits and the greedy tokens of a padded batch are those of transformers' SDPA."""
    batch = _batch(tok)
    stock = _model(smollm2_dir, torch.float32)
    fast = for_generation(_model(smollm2_dir, torch.float32), "float32")
    assert fast.config._attn_implementation == SDPA_GQA and stock.config._attn_implementation == "sdpa"
    assert not batch["attention_mask"].all()  # padded: the masked path, where the copies were made
    with torch.inference_mode():
        keep = batch["attention_mask"].bool()
        assert (fast(**batch).logits - stock(**batch).logits)[keep].abs().max() < 1e-4
    assert torch.equal(_greedy(fast, tok, batch), _greedy(stock, tok, batch))
    stock.set_attn_implementation("eager")  # a recipe's explicit eager: the same, grouped
    eager = _model(smollm2_dir, torch.float32)
    eager.set_attn_implementation("eager")  # as the model loads with `model.attn_implementation: eager`
    fast = for_generation(eager, "float32", "eager")
    assert fast.config._attn_implementation == EAGER_GQA
    with torch.inference_mode():
        assert (fast(**batch).logits - stock(**batch).logits)[keep].abs().max() < 1e-4
    assert torch.equal(_greedy(fast, tok, batch), _greedy(stock, tok, batch))


@pytest.mark.cpu_only
def test_grpo_trains_through_the_grouped_attention_with_the_same_gradients(smollm2_dir, tok, tmp_path, monkeypatch):
    """GRPO generates inside training, so its float32 CPU model attends with :func:`sdpa_gqa` too where the recipe
    names no attention (SFT keeps transformers' SDPA, a named one is kept); the loss and its gradients are
    transformers' SDPA's to float32 summation order."""
    from rlkit.inference.fastgen import grouped_heads_uncopied
    from rlkit.recipe import load_recipe, recipes_dir
    from rlkit.train import build_trainer

    def attention(name, *overrides):
        recipe = load_recipe(recipes_dir() / name, ["model.dtype=float32", *overrides], smoke=True)
        run_dir = tmp_path / str(len(list(tmp_path.iterdir())))
        run_dir.mkdir()
        return build_trainer(recipe, run_dir, smoke=True)[0].model.config._attn_implementation

    assert attention("tiny_arith_grpo.yaml", "model.attn_implementation=null") == SDPA_GQA  # the tiny model: 4 of 2
    assert attention("tiny_arith_grpo.yaml") == "eager"  # the recipe's own
    assert attention("tiny_arith_sft.yaml", "model.attn_implementation=null") == "sdpa"
    monkeypatch.setattr("rlkit.train.cuda_available", lambda: True)  # a GPU machine: its model loads on the CPU
    assert attention("tiny_arith_grpo.yaml", "model.attn_implementation=null") == "sdpa"
    monkeypatch.undo()
    batch = _batch(tok)
    keep = batch["attention_mask"].bool()
    losses, grads = [], []
    fast = _model(smollm2_dir, torch.float32)
    grouped_heads_uncopied(fast)
    assert fast.config._attn_implementation == SDPA_GQA
    for m in (fast, _model(smollm2_dir, torch.float32)):
        m.train()
        loss = m(**batch).logits[keep].logsumexp(-1).mean()
        loss.backward()
        losses.append(loss.item())
        grads.append(m.model.layers[0].self_attn.k_proj.weight.grad)
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    assert (grads[0] - grads[1]).abs().max() <= 1e-4 * grads[1].abs().max()


def test_an_explicit_attention_choice_is_kept(smollm2_dir):
    model = for_generation(_model(smollm2_dir, torch.bfloat16), "bfloat16", "sdpa")
    assert model.config._attn_implementation == "sdpa"
    assert model.generation_config.cache_implementation is None


def test_an_explicit_fp32_is_kept_and_the_adapter_is_folded_in(smollm2_dir, tok):
    """An explicit dtype stays (no bf16, no eager switch), but the LoRA is merged whatever the dtype: the merged
    model's logits are the adapter's, and the adapter really moves them."""
    peft = _model(smollm2_dir, torch.float32, lora=True)
    batch = _batch(tok)
    with torch.inference_mode():
        adapter_logits = peft(**batch).logits
        with peft.disable_adapter():
            base_logits = peft(**batch).logits
    merged = for_generation(peft, "float32")
    assert not hasattr(merged, "peft_config")
    assert merged.dtype == torch.float32 and merged.config._attn_implementation == SDPA_GQA
    with torch.inference_mode():
        merged_logits = merged(**batch).logits
    keep = batch["attention_mask"].bool()
    assert (merged_logits - adapter_logits)[keep].abs().max() < 1e-3
    assert (base_logits - adapter_logits)[keep].abs().max() > 0.5


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bf16; rlkit keeps fp32 here")
def test_auto_dtype_becomes_bf16_where_the_cpu_has_it(smollm2_dir):
    model = for_generation(_model(smollm2_dir, torch.float32), "auto")
    assert model.dtype == torch.bfloat16 and model.config._attn_implementation == "eager"


def test_a_lora_is_never_folded_into_bf16_weights(smollm2_dir):
    """bf16's rounding step is larger than most of a short run's LoRA update: merged, the model would forget
    it. The adapter stays beside the bf16 weights, as it was trained, and still gets the bf16 speed-ups where bf16 is
    native."""
    peft = _model(smollm2_dir, torch.bfloat16, lora=True)
    model = for_generation(peft, "bfloat16")
    assert hasattr(model, "peft_config")  # the speed-ups (eager, a static cache) where bf16 is native
    assert model.config._attn_implementation == ("eager" if cpu_has_native_bf16() else "sdpa")
    if cpu_has_native_bf16():  # auto: converted to bf16, so not merged either
        assert hasattr(for_generation(_model(smollm2_dir, torch.float32, lora=True), "auto"), "peft_config")
