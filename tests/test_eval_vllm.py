"""`rlkit eval --backend vllm`: one-line refusals where vLLM cannot run, the exact prompt tokens the hf path generates
from handed to vLLM's engine (a stand-in `vllm` on CPU), and on a GPU the two backends' greedy answers compared."""

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from rlkit import backends
from rlkit.errors import UserError
from rlkit.recipe import recipes_dir

ROOT = Path(__file__).resolve().parent.parent
NO_VLLM_HERE = importlib.util.find_spec("vllm") is None


@pytest.mark.cpu_only
@pytest.mark.skipif(not NO_VLLM_HERE, reason="vLLM is installed here")
def test_without_vllm_and_a_gpu_the_eval_says_what_is_missing_in_one_line():
    done = subprocess.run([sys.executable, "-m", "rlkit", "eval", str(recipes_dir() / "gsm8k_sft.yaml"), "--smoke",
                           "--backend", "vllm"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "rlkit: error: --backend vllm needs vLLM on a CUDA GPU: vLLM is not installed (pip install 'rlkit[gpu]'); "
        "this machine has no CUDA GPU; use --backend hf"]


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"backend": "tpu"}, "--backend 'tpu': use hf or vllm"),
    ({"backend": "vllm", "samples": 4}, "--samples samples with the hf backend"),
    ({"backend": "vllm", "model": "http://127.0.0.1:9/v1"}, "an endpoint generates on its server"),
])
def test_a_backend_that_cannot_do_what_is_asked_is_refused_before_anything_loads(kwargs, said):
    from rlkit.evaluate import evaluate

    with pytest.raises(UserError, match=said.replace("(", r"\(").replace(")", r"\)")):
        evaluate(recipes_dir() / "gsm8k_sft.yaml", smoke=True, **kwargs)


def test_the_suite_and_ifeval_stay_on_hf():
    from rlkit.cli.eval_cmd import eval_

    with pytest.raises(UserError, match="--backend vllm evaluates one eval split"):
        eval_("runs/x", model=None, served_model=None, api_key=None, limit=None, smoke=False, set_=[], out=None,
              resume=False, suite="arith", ifeval=None, base=None, no_base=False, samples=None, temperature=None,
              backend="vllm")


class FakeLLM:
    """vLLM's `LLM` as far as rlkit's eval uses it: records what it is given, replies with fixed token ids."""

    made: list = []
    reply: list[int] = []
    prompt: list[int] = []  # what chat() says it was prompted with
    finish_reason = "stop"

    def __init__(self, **kwargs):
        FakeLLM.made.append(kwargs)
        FakeLLM.last = self
        self.calls = []

    def generate(self, prompts, params, *, lora_request=None, use_tqdm=True):
        self.calls.append((prompts, params, lora_request))
        reply = types.SimpleNamespace(token_ids=list(FakeLLM.reply), finish_reason=FakeLLM.finish_reason)
        return [types.SimpleNamespace(outputs=[reply]) for _ in prompts]

    def chat(self, conversations, params, *, tools=None, lora_request=None, chat_template=None,
             chat_template_kwargs=None, use_tqdm=True):  # the agent policy's call
        self.calls.append((conversations, params, lora_request))
        reply = types.SimpleNamespace(token_ids=list(FakeLLM.reply), finish_reason=FakeLLM.finish_reason)
        return [types.SimpleNamespace(prompt_token_ids=list(FakeLLM.prompt), outputs=[reply]) for _ in conversations]


@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in `vllm` package (LLM, SamplingParams, TokensPrompt, LoRARequest) on a machine taken to have CUDA."""

    def module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)
        return mod

    module("vllm", LLM=FakeLLM, SamplingParams=lambda **kw: types.SimpleNamespace(**kw))
    module("vllm.inputs", TokensPrompt=lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids})
    module("vllm.lora")
    module("vllm.lora.request", LoRARequest=lambda name, lid, path: types.SimpleNamespace(name=name, path=path))
    monkeypatch.setattr(backends, "cuda_available", lambda: True)
    monkeypatch.setenv(backends.FLASHINFER_SAMPLER, "unset below")
    monkeypatch.delenv(backends.FLASHINFER_SAMPLER)  # restored to absent afterwards
    FakeLLM.made.clear()


@pytest.mark.trains
def test_the_vllm_backend_gets_the_prompt_tokens_the_hf_backend_generates_from(fake_vllm, sft_run, tmp_path):
    from rlkit.agents.policies import vllm_setup
    from rlkit.backends import hf
    from rlkit.backends.unsloth_args import vllm_lora_rank
    from rlkit.data import load_rows, task_rows
    from rlkit.evaluate import evaluate
    from rlkit.inference.generate import render, tokenize
    from rlkit.inference.reference import resolve_target

    recipe, run_dir = resolve_target(sft_run)
    tokenizer = hf.load_tokenizer(str(run_dir / "adapter"))
    FakeLLM.reply = [*tokenizer.encode("3 + 4 = 7\n#### 7", add_special_tokens=False), tokenizer.eos_token_id]
    results = evaluate(sft_run, backend="vllm", limit=3, out=tmp_path / "r.json", show_progress=False)
    assert results["model"] == f"{run_dir}/adapter@vllm" and results["n"] == 3
    assert [e["completion"] for e in results["examples"]] == ["3 + 4 = 7\n#### 7"] * 3
    assert [e["prediction"] for e in results["examples"]] == ["7"] * 3
    assert results["cut"] == 0  # vLLM said each reply stopped
    (made,) = FakeLLM.made
    kwargs, _, _ = vllm_setup(recipe, run_dir, None)
    assert made["model"] == kwargs["model_path"] and Path(made["model"]).is_dir()
    assert made["enable_lora"] is True and made["max_lora_rank"] == vllm_lora_rank(recipe.lora.r)
    assert made["max_model_len"] == recipe.model.max_seq_length and made["dtype"] == hf.torch_dtype(recipe.model.dtype)
    rows = task_rows(recipe, "eval", load_rows(recipe.data.task, recipe.data.eval.model_copy(update={"limit": 3})))
    expected = tokenize(tokenizer, render(tokenizer, list(rows["prompt"]), recipe.model.chat_template_kwargs))
    sent = [p["prompt_token_ids"] for prompts, _, _ in FakeLLM.last.calls for p in prompts]
    assert sent == expected and len(sent) == 3
    for _, params, lora in FakeLLM.last.calls:
        assert (params.temperature, params.max_tokens) == (0.0, recipe.eval.max_new_tokens)
        assert lora.path == str(run_dir / "adapter")
    assert os.environ[backends.FLASHINFER_SAMPLER] == "0"  # no flashinfer here: rlkit switched its sampler off
    FakeLLM.finish_reason = "length"  # vLLM says the token limit ended each one
    try:
        cut = evaluate(sft_run, backend="vllm", limit=3, out=tmp_path / "cut.json", show_progress=False)
    finally:
        FakeLLM.finish_reason = "stop"
    assert cut["cut"] == 1 and [e["cut"] for e in cut["examples"]] == [True] * 3


def test_a_vllm_agent_turn_is_cut_when_vllm_says_so_not_by_its_length(fake_vllm, tiny_model_dir):
    """Near the context's end vLLM gets a smaller token budget than max_new_tokens; a turn cut there is cut."""
    from rlkit.agents.vllm import VLLMPolicy
    from rlkit.backends import hf
    from rlkit.inference.generate import render, tokenize

    tokenizer = hf.load_tokenizer(str(tiny_model_dir))
    policy = VLLMPolicy(str(tiny_model_dir), tokenizer, adapter=None, max_lora_rank=8, chat_template_kwargs={},
                        max_new_tokens=16, max_model_len=4096)
    FakeLLM.reply = tokenizer.encode("#### 4", add_special_tokens=False)
    conversations = [[{"role": "user", "content": "2 + 2?"}]]
    FakeLLM.prompt = tokenize(tokenizer, render(tokenizer, conversations, {}, tools=[], template=policy.template))[0]
    FakeLLM.finish_reason = "length"
    try:
        (cut,) = policy.generate(conversations, [])
    finally:
        FakeLLM.finish_reason = "stop"
    (stopped,) = policy.generate(conversations, [])
    assert len(FakeLLM.reply) < 16 and (cut.finish_reason, stopped.finish_reason) == ("length", "stop")
    assert cut.message["content"] == stopped.message["content"] == "#### 4"


def test_an_agent_eval_asks_for_a_vllm_policy(monkeypatch):
    import rlkit.agents.vllm
    import rlkit.evaluate.agent
    from rlkit.evaluate import evaluate

    asked = {}

    def make_policy(*args, **kwargs):
        asked.update(kwargs)
        raise UserError("stop here")

    monkeypatch.setattr(rlkit.agents.vllm, "require_vllm", lambda flag="--backend vllm": None)
    monkeypatch.setattr(rlkit.evaluate.agent, "make_policy", make_policy)
    with pytest.raises(UserError, match="stop here"):
        evaluate(recipes_dir() / "gsm8k_calculator_grpo.yaml", smoke=True, backend="vllm", limit=2)
    assert asked["backend"] == "vllm"


@pytest.mark.gpu
@pytest.mark.skipif(NO_VLLM_HERE, reason="needs vLLM (pip install 'rlkit[gpu]', or bench/gpu_carry.py)")
def test_hf_and_vllm_give_the_same_greedy_answers_on_the_same_adapter_or_differ_only_at_near_ties(sft_run):
    """Greedy token ids from both backends on the same prompts; where they part, hf's logits at that point must
    be a near-tie between the two tokens (kernels and LoRA paths round differently, nothing more)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from rlkit.agents.policies import vllm_setup
    from rlkit.agents.vllm import engine
    from rlkit.data import load_rows, task_rows
    from rlkit.inference.generate import generate_ids, logits, render, tokenize
    from rlkit.inference.load import load_for_generation
    from rlkit.inference.reference import resolve_target

    recipe, run_dir = resolve_target(sft_run)
    rows = task_rows(recipe, "eval", load_rows(recipe.data.task, recipe.data.eval.model_copy(update={"limit": 16})))
    lm, tokenizer, _ = load_for_generation(recipe, run_dir, None)
    prompts = tokenize(tokenizer, render(tokenizer, list(rows["prompt"]), recipe.model.chat_template_kwargs))
    n = recipe.eval.max_new_tokens
    eos = tokenizer.eos_token_id

    def cut(ids):
        ids = list(ids)
        return ids[:ids.index(eos)] if eos in ids else ids

    ours = [cut(g.ids) for g in generate_ids(lm, tokenizer, prompts, max_new_tokens=n, batch_size=8)]
    kwargs, _, _ = vllm_setup(recipe, run_dir, None)
    llm, lora = engine(**kwargs, gpu_memory_utilization=0.3)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                           SamplingParams(temperature=0.0, max_tokens=n), lora_request=lora, use_tqdm=False)
    theirs = [cut(o.outputs[0].token_ids) for o in outputs]
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    assert same >= len(prompts) // 2, (same, len(prompts))
    for prompt, a, b in zip(prompts, ours, theirs, strict=True):
        if a == b:
            continue
        k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        x, y = (a[k] if k < len(a) else eos), (b[k] if k < len(b) else eos)  # the shorter one stopped there
        row = logits(lm, prompt + a[:k])[-1]
        assert float(row[x] - row[y]) < 0.5, f"a decided token differs at {k}: hf {x}, vLLM {y}"
