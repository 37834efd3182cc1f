"""vLLM's offline engine as an agent policy (GPU only)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

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


class VLLMPolicy:
    """vLLM's offline engine (GPU only). An adapter is applied per request through ``LoRARequest``."""

    concurrent = False

    def __init__(self, model_path: str, tokenizer: Any, *, adapter: str | None, max_lora_rank: int,
                 chat_template_kwargs: dict[str, Any], max_new_tokens: int, temperature: float = 0.0,
                 max_model_len: int | None = None, gpu_memory_utilization: float = 0.8,
                 quantization: str | None = None) -> None:
        try:
            from vllm import LLM, SamplingParams
            from vllm.lora.request import LoRARequest
        except ImportError:
            raise UserError("--backend vllm needs vLLM: pip install 'rlkit[gpu]' (CUDA only)") from None
        from rlkit.backends.unsloth_args import vllm_lora_rank

        self.tokenizer, self.kwargs = tokenizer, chat_template_kwargs
        self.max_new_tokens = max_new_tokens
        extra = {"quantization": quantization} if quantization else {}
        self.llm = LLM(model=model_path, enable_lora=adapter is not None, max_lora_rank=vllm_lora_rank(max_lora_rank),
                       max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization, **extra)
        self.max_model_len = max_model_len or self.llm.llm_engine.model_config.max_model_len
        self.lora = LoRARequest("adapter", 1, adapter) if adapter else None
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
                                   self.max_new_tokens, seconds)
        return turns

