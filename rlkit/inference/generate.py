"""The one batched generation loop: eval, pairs, chat, rollouts (``HFPolicy``) and merge verification.

Prompts are token ids (the caller renders chat prompts with :func:`render` and :func:`tokenize`), batched
with left padding; greedy, or plain sampling at a temperature.

When a batch's prompts share a long token prefix (a system prompt, tool schemas, worked turns: 497 of the
~530 tokens of the calculator agent's prompts), the prefix is run once and its KV cache copied to every row;
each prompt's own tail is padded in the middle (``[prefix][pad...][tail]``, masked, positions from the
mask), so nothing else changes: in fp32 the tokens are identical to the plain batch. Measured on 50 of those
prompts, 48 new tokens, bf16, 2 cores: 45 s -> 15 s.

A model that decodes with eager attention (rlkit's bf16 CPU setting, :mod:`rlkit.inference.fastgen`) reads long
prompts with SDPA instead: eager attention builds every L x L probability matrix, which at L = 1,000 made
the prompt pass of 8 prompts twice as slow as SDPA's (124-150 s against 63-69 s on one loaded core). From
``SDPA_PREFILL_MIN`` tokens to read, the prompt runs through the model with SDPA into the KV cache before
``generate``, which then decodes with eager attention from that cache (the search agent's later turns are
prompts of 800-1,200 tokens).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rlkit.inference.fastgen import length_order

# ``on_batch(first_prompt_index, completions, cut)``: a batch of replies in prompt order, as it ends, and which of
# them the token limit cut (every completer of :mod:`rlkit.evaluate.served` hands its batches on this way).
OnBatch = Callable[[int, list[str], list[bool]], None]

# Below this many shared tokens the saved prefill does not pay for giving up the static cache.
SHARED_PREFIX_MIN = 64
# From this many prompt tokens to read per row, an eager-attention model reads them with SDPA (module docstring).
SDPA_PREFILL_MIN = 256


@dataclass
class Generation:
    """One generated sequence."""

    prompt_ids: list[int]  # the prompt's tokens, without padding
    ids: list[int]  # the new tokens (after an EOS, padding up to the batch's longest)
    seconds: float  # the batch's generation time, per prompt
    cut: bool = False  # it ran to max_new_tokens without a stop token: the token limit ended it


def sampling_kwargs(temperature: float | None, num_return_sequences: int = 1) -> dict[str, Any]:
    """``generate`` kwargs: greedy at temperature 0/None, else plain sampling (no top-k/top-p truncation)."""
    if not temperature:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0,
            "num_return_sequences": num_return_sequences}


def render(tokenizer: Any, conversations: Sequence[Any], chat_template_kwargs: dict[str, Any], *,
           tools: list[dict] | None = None, template: str | None = None) -> list[str]:
    """Each conversation as the model is prompted with it (chat template, tools, generation prompt)."""
    return [tokenizer.apply_chat_template(c, tools=tools, tokenize=False, add_generation_prompt=True,
                                          chat_template=template, **chat_template_kwargs) for c in conversations]


def tokenize(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of rendered prompts (the chat template already holds the special tokens)."""
    return tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []


def generate_ids(model: Any, tokenizer: Any, prompts: Sequence[list[int]], *, max_new_tokens: int, batch_size: int,
                 temperature: float | None = None, num_return_sequences: int = 1, show_progress: bool = False,
                 description: str = "generating",
                 on_batch: Callable[[int, list[Generation]], None] | None = None) -> list[Generation]:
    """``num_return_sequences`` generations per prompt, prompt by prompt, in prompt order.

    Similar lengths share a batch (less padding). A caller that writes each batch as it ends
    (``on_batch(first_prompt_index, generations)``) gets the batches in prompt order instead: its file is
    then always a prefix of the prompts, which is what --resume continues from.
    """
    import torch

    from rlkit import progress
    from rlkit.cpu_memory import heap_trimmer

    order = list(range(len(prompts))) if on_batch is not None else length_order([len(p) for p in prompts])
    tokenizer.padding_side = "left"
    model.eval()
    device = next(model.parameters()).device
    trimmer = heap_trimmer() if device.type == "cpu" else None
    stops = stop_ids(model, tokenizer)
    k = num_return_sequences
    done: list[Generation] = []
    with progress.bar(description, len(prompts), show=show_progress) as advance, torch.inference_mode():
        for start in range(0, len(prompts), batch_size):
            chosen = [prompts[i] for i in order[start:start + batch_size]]
            started = time.time()
            shared = shared_prefix(chosen)
            if shared < SHARED_PREFIX_MIN or len(chosen) * k == 1:
                shared = 0
            sdpa = _eager(model) and max(map(len, chosen)) - shared >= SDPA_PREFILL_MIN
            if shared or sdpa:
                out, width = _generate_cached(model, tokenizer, chosen, shared, max_new_tokens, temperature, k,
                                              sdpa_prefill=sdpa)
            else:
                batch = tokenizer.pad({"input_ids": chosen}, return_tensors="pt").to(device)
                out = model.generate(**batch, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                     **sampling_kwargs(temperature, k))
                width = batch["input_ids"].shape[1]
            seconds = (time.time() - started) / len(chosen)
            generations = [Generation(chosen[j // k], row[width:], seconds,
                                      cut=len(row) - width >= max_new_tokens and not stops.intersection(row[width:]))
                           for j, row in enumerate(out.tolist())]
            done.extend(generations)
            if on_batch is not None:
                on_batch(start, generations)
            advance(len(chosen))
            if trimmer is not None:
                trimmer.check()
    position = {i: pos for pos, i in enumerate(order)}
    return [done[position[j // k] * k + j % k] for j in range(len(done))]


def stop_ids(model: Any, tokenizer: Any) -> set[int]:
    """The tokens ``generate`` stops at: the generation config's EOS (one id or several), else the tokenizer's."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    return {i for i in (eos if isinstance(eos, (list, tuple)) else [eos]) if i is not None}


def shared_prefix(prompts: Sequence[list[int]]) -> int:
    """How many leading tokens all ``prompts`` share; each keeps at least one token of its own."""
    return min(len(os.path.commonprefix(list(prompts))), min(len(p) for p in prompts) - 1)


def _generate_cached(model: Any, tokenizer: Any, prompts: list[list[int]], shared: int, max_new_tokens: int,
                     temperature: float | None, k: int, *, sdpa_prefill: bool) -> tuple[Any, int]:
    """``generate`` from a KV cache rlkit fills itself. The first ``shared`` tokens, the same in every prompt,
    run once at batch size 1 and their cache is copied to every row; the tails are padded between prefix and
    tail (``[prefix][pad...][tail]``, masked; positions from the mask). With ``sdpa_prefill`` every prompt token
    but the last is read with SDPA attention into the cache, and ``generate`` decodes with the model's own.
    Returns (sequences, width of the padded prompts); rows are prompt by prompt, ``k`` per prompt, like
    ``num_return_sequences``."""
    import torch
    from transformers import DynamicCache

    device = next(model.parameters()).device
    tails = [p[shared:] for p in prompts for _ in range(k)]
    width = max(map(len, tails))
    pad = tokenizer.pad_token_id
    prefix = prompts[0][:shared]
    ids = torch.tensor([prefix + [pad] * (width - len(t)) + t for t in tails], device=device)
    mask = torch.tensor([[1] * shared + [0] * (width - len(t)) + [1] * len(t) for t in tails], device=device)
    # Positions count real tokens only, so a tail continues right after the prefix whatever its padding.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    with _attention(model, "sdpa" if sdpa_prefill else None):
        if shared:
            model(input_ids=ids[:1, :shared], past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.batch_repeat_interleave(len(tails))
        if sdpa_prefill and width > 1:  # all but the last token: generate needs one to start from
            model(input_ids=ids[:, shared:-1], attention_mask=mask[:, :-1], position_ids=positions[:, shared:-1],
                  past_key_values=cache, use_cache=True, logits_to_keep=1)
    # A cache object and a cache_implementation (fastgen's static cache) cannot both be given to generate.
    out = model.generate(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                         cache_implementation=None, max_new_tokens=max_new_tokens, pad_token_id=pad,
                         **sampling_kwargs(temperature, 1))
    return out, shared + width


def _eager(model: Any) -> bool:
    return getattr(model.config, "_attn_implementation", None) == "eager"


@contextmanager
def _attention(model: Any, implementation: str | None) -> Iterator[None]:
    """The model runs with ``implementation`` inside the block (None: as it is); transformers reads the
    config's setting at every forward."""
    config = model.config
    before = config._attn_implementation
    if implementation is not None:
        config._attn_implementation = implementation
    try:
        yield
    finally:
        config._attn_implementation = before


def generate(model: Any, tokenizer: Any, prompts: list[Any], chat_template_kwargs: dict[str, Any], *,
             max_new_tokens: int, batch_size: int, show_progress: bool = True,
             num_return_sequences: int = 1, temperature: float | None = None,
             description: str = "generating", on_batch: OnBatch | None = None) -> list[str]:
    """Completions (text) for chat prompts: ``num_return_sequences`` per prompt, prompt by prompt.

    ``on_batch(first_prompt_index, completions, cut)`` sees each batch, in prompt order, as soon as it is decoded
    (to write it); ``cut[i]``: completion i ran to ``max_new_tokens`` without a stop token.
    """
    def decoded(generations: list[Generation]) -> list[str]:
        return [tokenizer.decode(g.ids, skip_special_tokens=True) for g in generations]

    write = None if on_batch is None else (
        lambda first, generations: on_batch(first, decoded(generations), [g.cut for g in generations]))
    ids = tokenize(tokenizer, render(tokenizer, prompts, chat_template_kwargs))
    return decoded(generate_ids(model, tokenizer, ids, max_new_tokens=max_new_tokens, batch_size=batch_size,
                                temperature=temperature, num_return_sequences=num_return_sequences,
                                show_progress=show_progress, description=description, on_batch=write))


def logits(model: Any, ids: list[int]) -> Any:
    """The float32 next-token logits at every position of one unpadded prompt, on the CPU."""
    import torch

    model.eval()
    with torch.inference_mode():
        input_ids = torch.tensor([ids], device=next(model.parameters()).device)
        return model(input_ids=input_ids).logits[0].float().cpu()
