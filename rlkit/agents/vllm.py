"""vLLM's offline engine (GPU only): an agent policy (:class:`VLLMPolicy`) and greedy replies to plain chat prompts
for ``rlkit eval --backend vllm`` (:class:`VLLMCompleter`)."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlkit.agents.episodes import Turn
from rlkit.agents.turns import (
    completion_budgets,
    overflow_turn,
    parsed_turn,
    prompt_lengths,
    require_response_parser,
    training_template,
)
from rlkit.errors import UserError

if TYPE_CHECKING:
    from rlkit.inference.generate import OnBatch


def require_vllm(flag: str = "--backend vllm") -> None:
    """One line naming what this machine lacks for vLLM, before any model or data loads."""
    from rlkit.backends import cuda_available

    lacking = [why for why, absent in (("vLLM is not installed (pip install 'rlkit[gpu]')",
                                        importlib.util.find_spec("vllm") is None),
                                       ("this machine has no CUDA GPU", not cuda_available())) if absent]
    if lacking:
        raise UserError(f"{flag} needs vLLM on a CUDA GPU: {'; '.join(lacking)}; use --backend hf")


def engine(model_path: str, *, adapter: str | None, max_lora_rank: int, max_model_len: int | None,
           gpu_memory_utilization: float = 0.8, quantization: str | None = None,
           dtype: Any = "auto") -> tuple[Any, Any]:
    """(vLLM's ``LLM``, the adapter's ``LoRARequest`` or None): the base as the run trained on it, the adapter
    applied per request."""
    from vllm import LLM
    from vllm.lora.request import LoRARequest

    from rlkit.backends import prepare_vllm_env
    from rlkit.backends.unsloth_args import vllm_lora_rank

    prepare_vllm_env()
    extra = {"quantization": quantization} if quantization else {}
    llm = LLM(model=model_path, enable_lora=adapter is not None, max_lora_rank=vllm_lora_rank(max_lora_rank),
              max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization, dtype=dtype, **extra)
    return llm, (LoRARequest("adapter", 1, adapter) if adapter else None)


class VLLMCompleter:
    """Greedy replies to chat prompts, for ``rlkit eval --backend vllm``. The prompts are rendered and tokenized
    as the hf backend does (:func:`rlkit.inference.generate.render` / ``tokenize``) and handed to vLLM as token
    ids, and the replies are decoded as it decodes them, so the two backends differ only in the forward passes
    (and in the stop tokens: vLLM also stops at the tokenizer's EOS, hf at the generation config's)."""

    def __init__(self, llm: Any, lora: Any, tokenizer: Any, *, chat_template_kwargs: dict[str, Any],
                 max_new_tokens: int) -> None:
        self.llm, self.lora, self.tokenizer = llm, lora, tokenizer
        self.kwargs, self.max_new_tokens = chat_template_kwargs, max_new_tokens

    def complete(self, prompts: list[Any], *, batch_size: int = 64, show_progress: bool = True,
                 description: str = "generating", on_batch: OnBatch | None = None) -> list[str]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from rlkit import progress
        from rlkit.inference.generate import render, tokenize

        ids = tokenize(self.tokenizer, render(self.tokenizer, prompts, self.kwargs))
        params = SamplingParams(temperature=0.0, max_tokens=self.max_new_tokens, detokenize=False)
        replies: list[str] = []
        with progress.bar(description, len(ids), show=show_progress) as advance:
            for first in range(0, len(ids), batch_size):  # vLLM batches itself; chunks are for on_batch (--resume)
                chunk = [TokensPrompt(prompt_token_ids=p) for p in ids[first:first + batch_size]]
                outputs = self.llm.generate(chunk, params, lora_request=self.lora, use_tqdm=False)
                texts = [self.tokenizer.decode(list(o.outputs[0].token_ids), skip_special_tokens=True)
                         for o in outputs]
                if on_batch is not None:
                    on_batch(first, texts, [o.outputs[0].finish_reason == "length" for o in outputs])
                replies += texts
                advance(len(chunk))
        return replies


class VLLMPolicy:
    """vLLM's offline engine (GPU only). An adapter is applied per request through ``LoRARequest``."""

    concurrent = False

    def __init__(self, model_path: str, tokenizer: Any, *, adapter: str | None, max_lora_rank: int,
                 chat_template_kwargs: dict[str, Any], max_new_tokens: int, temperature: float = 0.0,
                 max_model_len: int | None = None, gpu_memory_utilization: float = 0.8,
                 quantization: str | None = None, dtype: Any = "auto") -> None:
        require_vllm()
        from vllm import SamplingParams

        self.tokenizer, self.kwargs = tokenizer, chat_template_kwargs
        self.max_new_tokens = max_new_tokens
        self.llm, self.lora = engine(model_path, adapter=adapter, max_lora_rank=max_lora_rank,
                                     max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
                                     quantization=quantization, dtype=dtype)
        self.max_model_len = max_model_len or self.llm.llm_engine.model_config.max_model_len
        self.sampling = SamplingParams(temperature=temperature, max_tokens=max_new_tokens)
        require_response_parser(tokenizer)
        self.template = training_template(tokenizer)

    def generate(self, conversations: Sequence[list[dict[str, Any]]], tools: list[dict]) -> list[Turn]:
        from vllm import SamplingParams

        started = time.time()
        lengths = prompt_lengths(self.tokenizer, conversations, tools, self.template, self.kwargs)
        budgets = completion_budgets(lengths, self.max_model_len, self.max_new_tokens)
        fit = [i for i, b in enumerate(budgets) if b is not None]
        turns = [overflow_turn(n, self.max_model_len) for n in lengths]
        if not fit:
            return turns
        params = [SamplingParams(temperature=self.sampling.temperature, max_tokens=budgets[i]) for i in fit]
        outputs = self.llm.chat([conversations[i] for i in fit], params, tools=tools, lora_request=self.lora,
                                chat_template=self.template, chat_template_kwargs=self.kwargs, use_tqdm=False)
        seconds = (time.time() - started) / max(len(conversations), 1)
        for i, o in zip(fit, outputs, strict=True):
            turns[i] = parsed_turn(self.tokenizer, list(o.outputs[0].token_ids), list(o.prompt_token_ids),
                                   o.outputs[0].finish_reason == "length", seconds)
        return turns

