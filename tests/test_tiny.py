"""The tiny offline Qwen3: loads like the real one, is deterministic, and TRL treats it as Qwen3."""

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList
from trl import chat_template_utils as ctu

from rlkit import tiny

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'
TOOL_CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Tom has 12 apples. He buys 7 more. How many apples does he have now?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12+7"}}}]},
    {"role": "tool", "name": "calculator", "content": "19"},
    {"role": "assistant", "content": "12 + 7 = 19\n#### 19"},
]
CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny.build_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def _hashes(path):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


def test_loads_with_auto_classes_and_ids_agree(model, tokenizer):
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in tiny.SPECIAL_TOKENS + tiny.ADDED_TOKENS}
    assert list(ids.values()) == list(range(1015, 1024))
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"  # the class real Qwen3 loads as
    assert len(tokenizer) == model.config.vocab_size == tiny.VOCAB_SIZE
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None and tokenizer.model_max_length == 2048
    assert model.config.eos_token_id == model.generation_config.eos_token_id == ids["<|im_end|>"]
    assert model.config.pad_token_id == model.generation_config.pad_token_id == ids["<|endoftext|>"]
    assert model.generation_config.do_sample is False
    assert model.dtype == torch.float32 and not model.config.tie_word_embeddings
    assert sum(p.numel() for p in model.parameters()) == 254_336


def test_build_is_byte_identical_for_a_seed(tmp_path, model_dir):
    rng_before = torch.get_rng_state()
    first = _hashes(tiny.build_tiny_model(tmp_path / "a"))
    assert torch.equal(torch.get_rng_state(), rng_before)  # the global RNG is untouched
    assert set(first) >= {"model.safetensors", "tokenizer.json", "config.json", "generation_config.json"}
    assert first == _hashes(tmp_path / "a") and first == _hashes(model_dir)
    other = _hashes(tiny.build_tiny_model(tmp_path / "b", seed=1))
    assert other["model.safetensors"] != first["model.safetensors"]
    assert other["tokenizer.json"] == first["tokenizer.json"]  # the tokenizer does not depend on the seed


def test_chat_template_is_trls_qwen3_and_trl_recognises_it(tokenizer):
    assert tokenizer.chat_template == ctu.qwen3_chat_template
    assert ctu.supports_tool_calling(tokenizer)
    # Qwen3 drops earlier <think> blocks, so TRL swaps in its prefix-preserving training template.
    assert not ctu.is_chat_template_prefix_preserving(tokenizer)
    assert ctu.get_training_chat_template(tokenizer) == ctu.qwen3_training_chat_template


def test_trl_parses_a_tool_call(model_dir):
    tokenizer = ctu.add_response_schema(AutoTokenizer.from_pretrained(model_dir))
    assert tokenizer.response_template is ctu.qwen3_template
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 1+2?"}], tools=[CALCULATOR],
                                           add_generation_prompt=True, tokenize=True, return_dict=False)
    completion = tokenizer(CALL + "<|im_end|>")["input_ids"]
    parsed = ctu.parse_response(tokenizer, completion, prefix=prompt)
    assert parsed["tool_calls"] == [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1+2"}}}]
    assert parsed["content"] == ""


@pytest.mark.parametrize("text", ["12345", " 2024", "x=10.75", "$1,234"])
def test_digits_are_one_token_each(tokenizer, text):
    tokens = [tokenizer.decode([i]) for i in tokenizer(text)["input_ids"]]
    digits = [t.strip() for t in tokens if any(ch.isdigit() for ch in t)]
    assert digits == [ch for ch in text if ch.isdigit()]


def test_chat_with_tool_calls_round_trips(tokenizer):
    text = tokenizer.apply_chat_template(TOOL_CONVERSATION, tools=[CALCULATOR], tokenize=False)
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12+7"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n19\n</tool_response><|im_end|>" in text
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    for tag in tiny.SPECIAL_TOKENS[1:] + tiny.ADDED_TOKENS:
        if tag in text:
            assert tokenizer.convert_tokens_to_ids(tag) in ids  # one token, not spelled out
    # Added tags are not special (as in Qwen3), so they survive skip_special_tokens.
    assert "<tool_call>" in tokenizer.decode(ids, skip_special_tokens=True)
    assert "<|im_start|>" not in tokenizer.decode(ids, skip_special_tokens=True)


def test_generation_prompt(tokenizer):
    text = tokenizer.apply_chat_template(TOOL_CONVERSATION[:2], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_forward_and_backward(model, tokenizer):
    batch = tokenizer(["12 + 7 = 19", "Tom has 3 apples."], padding=True, return_tensors="pt")
    out = model(**batch, labels=batch["input_ids"])
    assert out.logits.shape == (2, batch["input_ids"].shape[1], tiny.VOCAB_SIZE)
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad(set_to_none=True)


class _EosAfter(LogitsProcessor):
    """Make `<|im_end|>` the argmax once `n` tokens were generated: a random model never picks it."""

    def __init__(self, prompt_len, n, eos_id):
        self.stop_at, self.eos_id = prompt_len + n, eos_id

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] >= self.stop_at:
            scores[:, self.eos_id] = scores.max() + 1.0
        return scores


def test_generate_stops_at_eos(model, tokenizer):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    n = prompt["input_ids"].shape[1]
    out = model.generate(**prompt, max_new_tokens=30,
                         logits_processor=LogitsProcessorList([_EosAfter(n, 4, tokenizer.eos_token_id)]))
    assert out.shape[1] == n + 5 and out[0, -1].item() == tokenizer.eos_token_id


def test_cached_path_builds_once_and_resolves(tmp_path, monkeypatch):
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path))
    path = tiny.tiny_model_path()
    assert path == tmp_path / tiny.CACHE_VERSION / "tiny"
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert tiny.tiny_model_path() == path and (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in path.parent.iterdir()] == ["tiny"]  # no temp dirs left behind
    assert tiny.resolve_model_id(tiny.TINY_MODEL) == str(path)
    assert tiny.resolve_model_id("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    with pytest.raises(ValueError, match="valid: tiny, small"):
        tiny.tiny_model_path("huge")


def test_cached_path_survives_a_lost_race(tmp_path, monkeypatch):
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path))
    real_build = tiny.build_tiny_model

    def build_while_another_process_finishes_first(out_dir, **kwargs):
        real_build(tmp_path / tiny.CACHE_VERSION / "tiny", **kwargs)  # the winner's rename
        return real_build(out_dir, **kwargs)

    monkeypatch.setattr(tiny, "build_tiny_model", build_while_another_process_finishes_first)
    path = tiny.tiny_model_path()
    assert (path / "model.safetensors").is_file()
    assert [p.name for p in path.parent.iterdir()] == ["tiny"]


def test_import_is_cheap():
    heavy = "{'torch', 'transformers', 'tokenizers', 'trl'}"
    code = f"import sys, rlkit.tiny; print(sorted({heavy} & set(sys.modules)))"
    repo = Path(tiny.__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo)
    assert out.stdout.strip() == "[]"
