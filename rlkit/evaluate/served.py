"""The model an eval scores: a local one (run dir, adapter, merged model, Hub id) or a model served at an
OpenAI-compatible endpoint, named by its base URL (``--model http://localhost:8000/v1``).

:func:`completer` gives both the same face, ``complete(prompts, ...) -> texts``, so ``rlkit eval``, its
``--suite`` and ``--ifeval`` score a vLLM server, a hosted model or a local checkpoint with the same prompts,
answer rule and files. Agent recipes take the endpoint as their policy (:func:`rlkit.agents.policies.make_policy`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.errors import UserError

if TYPE_CHECKING:
    from rlkit.inference.generate import OnBatch
    from rlkit.recipe import Recipe

Complete = Callable[..., list[str]]


@dataclass(frozen=True)
class Served:
    """How to reach an endpoint model: ``--api-key`` (default ``$OPENAI_API_KEY``, never written anywhere) and
    ``--served-model`` (default: the endpoint's only model); requests in flight, the total deadline of one
    request and its retries."""

    api_key: str | None = None
    served_model: str | None = None
    concurrency: int = 8
    timeout: float = 120.0
    retries: int = 2


def is_endpoint(ref: object) -> bool:
    return isinstance(ref, str) and ref.startswith(("http://", "https://"))


def endpoint_of(recipe: Recipe, run_dir: Path | None, model: str | None) -> str | None:
    """The endpoint URL an eval of ``(recipe, run_dir, model)`` scores, or None for a local model."""
    if is_endpoint(model):
        if run_dir is not None:
            raise UserError(f"--model {model}: an endpoint serves its own weights; give a recipe as TARGET, not a "
                            "run directory (whose adapter it would ignore)")
        return model
    if model is None and run_dir is None and is_endpoint(recipe.model.name_or_path):
        return recipe.model.name_or_path
    return None


@dataclass
class Completer:
    """``complete(prompts, batch_size=, show_progress=, description=, on_batch=)``: greedy replies, prompt by
    prompt; ``on_batch(first, replies, cut)`` sees them in prompt order as they finish, with which of them ran to
    the token limit (:data:`rlkit.inference.generate.OnBatch`). ``local`` is ``(model,
    tokenizer)`` for a local model (sampled metrics need it), None for an endpoint."""

    complete: Complete
    label: str
    local: tuple[Any, Any] | None = None


def completer(recipe: Recipe, run_dir: Path | None, model: str | None, *, max_new_tokens: int,
              served: Served | None = None, backend: str = "hf") -> Completer:
    url = endpoint_of(recipe, run_dir, model)
    if url is not None:
        return _endpoint_completer(url, served or Served(), max_new_tokens)
    if backend == "vllm":
        from rlkit.agents.policies import vllm_setup
        from rlkit.agents.vllm import VLLMCompleter, engine

        kwargs, tokenizer, label = vllm_setup(recipe, run_dir, model)
        llm, lora = engine(**kwargs)
        subject = VLLMCompleter(llm, lora, tokenizer, chat_template_kwargs=recipe.model.chat_template_kwargs,
                                max_new_tokens=max_new_tokens)
        return Completer(subject.complete, label)
    from rlkit.inference.generate import generate
    from rlkit.inference.load import load_for_generation

    lm, tokenizer, label = load_for_generation(recipe, run_dir, model)

    def complete(prompts: list[Any], **options: Any) -> list[str]:
        return generate(lm, tokenizer, prompts, recipe.model.chat_template_kwargs, max_new_tokens=max_new_tokens,
                        **options)

    return Completer(complete, label, (lm, tokenizer))


def _endpoint_completer(url: str, served: Served, max_new_tokens: int) -> Completer:
    from rlkit.agents.policies import endpoint_policy

    policy, label = endpoint_policy(url, api_key=served.api_key, served_model=served.served_model,
                                    max_new_tokens=max_new_tokens, temperature=0.0, timeout=served.timeout,
                                    retries=served.retries)

    def complete(prompts: list[Any], *, batch_size: int = 0, show_progress: bool = True,
                 description: str = "generating", on_batch: OnBatch | None = None) -> list[str]:
        del batch_size  # the server batches; ``served.concurrency`` requests are in flight at once
        return asyncio.run(_complete(policy, url, prompts, served.concurrency, show_progress, description, on_batch))

    return Completer(complete, label)


async def _complete(policy: Any, url: str, prompts: list[Any], concurrency: int, show_progress: bool,
                    description: str, on_batch: OnBatch | None) -> list[str]:
    """``concurrency`` prompts at a time, each chunk handed to ``on_batch`` when it is whole. A request that still
    fails after its retries stops the eval in one line (not a wrong answer counted against the model), after the
    replies before it are handed on."""
    from rlkit import progress

    replies: list[str] = []
    try:
        with progress.bar(description, len(prompts), show=show_progress) as advance:
            for first in range(0, len(prompts), concurrency):
                turns = await asyncio.gather(*(policy.agenerate(p, []) for p in prompts[first:first + concurrency]))
                failed = next((i for i, turn in enumerate(turns) if turn.error is not None), None)
                chunk = [turn.message.get("content") or "" for turn in turns[:failed]]
                if on_batch is not None and chunk:  # the replies before a failure are kept
                    on_batch(first, chunk, [turn.finish_reason == "length" for turn in turns[:len(chunk)]])
                replies += chunk
                advance(len(chunk))
                if failed is not None:
                    turn = turns[failed]
                    raise UserError(f"--model {url}: prompt {first + failed + 1} of {len(prompts)} failed after "
                                    f"{turn.retries} retries ({turn.error}); check the server (rlkit eval --resume "
                                    "continues after the replies already written)")
    finally:
        await policy.client.close()
    return replies
