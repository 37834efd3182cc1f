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

An agent's conversation grows turn by turn: its next prompt is this one, the reply and a tool result. A
:class:`TurnCache` keeps each row's KV cache (prompt and reply) from one call to the next; a prompt that
continues a kept row reads only its new tail (a plain left-padded batch whose first columns come from the kept
caches).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rlkit.inference.fastgen import EAGER_GQA, length_order

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
                 description: str = "generating", on_batch: Callable[[int, list[Generation]], None] | None = None,
                 turn_cache: TurnCache | None = None) -> list[Generation]:
    """``num_return_sequences`` generations per prompt, prompt by prompt, in prompt order.

    Similar lengths share a batch (less padding). A caller that writes each batch as it ends
    (``on_batch(first_prompt_index, generations)``) gets the batches in prompt order instead: its file is
    then always a prefix of the prompts, which is what --resume continues from. With ``turn_cache`` (one
    sequence per prompt) a prompt that continues a sequence of the previous call reads only its new tokens, and
    this call's sequences are kept for the next.
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
    if turn_cache is not None and k != 1:
        raise ValueError("a turn cache continues one sequence per prompt")
    kept = turn_cache.start() if turn_cache is not None else None
    done: list[Generation] = []
    with progress.bar(description, len(prompts), show=show_progress) as advance, torch.inference_mode():
        for start in range(0, len(prompts), batch_size):
            chosen = [prompts[i] for i in order[start:start + batch_size]]
            started = time.time()
            heads = _continued(kept, chosen) if kept is not None else None
            if kept is not None and start + batch_size >= len(prompts):
                kept.clear()  # what no prompt continues (episodes that ended) is not held while generating
            shared = shared_prefix(chosen)
            if shared < SHARED_PREFIX_MIN or len(chosen) * k == 1 or heads:
                shared = 0
            read = max(len(p) - (h.used if h else 0) for p, h in zip(chosen, heads, strict=True)) if heads else \
                max(map(len, chosen)) - shared
            sdpa = _eager(model) and read >= SDPA_PREFILL_MIN
            if shared or sdpa or turn_cache is not None:
                out, layout = _generate_cached(model, tokenizer, chosen, max_new_tokens, temperature, k, shared=shared,
                                               heads=heads, sdpa_prefill=sdpa)
                width = layout.width
            else:
                batch = tokenizer.pad({"input_ids": chosen}, return_tensors="pt").to(device)
                out = model.generate(**batch, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                     **sampling_kwargs(temperature, k))
                width = batch["input_ids"].shape[1]
            seconds = (time.time() - started) / len(chosen)
            generations = [Generation(chosen[j // k], row[width:], seconds,
                                      cut=len(row) - width >= max_new_tokens and not stops.intersection(row[width:]))
                           for j, row in enumerate(out.tolist())]
            if turn_cache is not None:
                turn_cache.keep(layout, chosen, [g.ids for g in generations], stops)
            out = layout = None  # this batch's cache is not held while the next one generates
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


@dataclass
class _Layout:
    """Where each row's prompt sits in a batch of ``width`` columns, the new tokens after it: ``heads[i]`` tokens
    ending at column ``head``, then ``tails[i]`` tokens ending at ``width`` (the rest is masked padding)."""

    heads: list[int]
    tails: list[int]
    head: int
    width: int
    cache: Any = None  # the batch's DynamicCache after generation


def _generate_cached(model: Any, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int,
                     temperature: float | None, k: int, *, shared: int, heads: list[Any] | None,
                     sdpa_prefill: bool) -> tuple[Any, _Layout]:
    """``generate`` from a KV cache rlkit fills itself, so that no row reads what is already known:

    - ``heads`` (from a :class:`TurnCache`, None where a row continues nothing): a plain left-padded batch whose
      first columns, up to where the row with the most new tokens starts, come from each row's kept cache; a
      row that kept more reads a few of its kept tokens again, and no row is padded more than in a plain batch;
    - else the first ``shared`` tokens, the same in every prompt, run once at batch size 1 and their cache is
      copied to every row; rows are ``[prefix][pad][tail]`` (masked; positions from the mask, so a tail
      continues right after the prefix whatever its padding).

    With ``sdpa_prefill`` every prompt token but the last is read with SDPA attention into the cache, and
    ``generate`` decodes with the model's own. Returns (sequences, layout); rows are prompt by prompt, ``k`` per
    prompt, like ``num_return_sequences``."""
    import torch
    from transformers import DynamicCache

    device = next(model.parameters()).device
    rows = [p for p in prompts for _ in range(k)]
    pad = tokenizer.pad_token_id
    if heads:
        width = max(map(len, rows))
        cached = width - max(len(p) - (h.used if h else 0) for p, h in zip(rows, heads, strict=True))
        layout = _Layout([0] * len(rows), [len(p) for p in rows], 0, width)
    else:
        tails = [p[shared:] for p in rows]
        cached, width = shared, shared + max(map(len, tails))
        layout = _Layout([shared] * len(rows), [len(t) for t in tails], shared, width)
    ids = torch.tensor([[pad] * (layout.head - n) + p[:n] + [pad] * (width - layout.head - t) + p[n:]
                        for p, n, t in zip(rows, layout.heads, layout.tails, strict=True)], device=device)
    mask = torch.tensor([[0] * (layout.head - n) + [1] * n + [0] * (width - layout.head - t) + [1] * t
                         for n, t in zip(layout.heads, layout.tails, strict=True)], device=device)
    # Positions count real tokens only, so a tail continues right after its prefix whatever the padding.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    with _attention(model, "sdpa" if sdpa_prefill else None):
        if heads and cached:
            for layer, (keys, values) in enumerate(_stacked(heads, [cached - (width - len(p)) for p in rows],
                                                            cached)):
                cache.update(keys, values, layer)
        elif shared:
            model(input_ids=ids[:1, :shared], past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.batch_repeat_interleave(len(rows))
        if sdpa_prefill and width - cached > 1:  # all but the last token: generate needs one to start from
            model(input_ids=ids[:, cached:-1], attention_mask=mask[:, :-1], position_ids=positions[:, cached:-1],
                  past_key_values=cache, use_cache=True, logits_to_keep=1)
    # A cache object and a cache_implementation (fastgen's static cache) cannot both be given to generate.
    out = model.generate(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                         cache_implementation=None, max_new_tokens=max_new_tokens, pad_token_id=pad,
                         **sampling_kwargs(temperature, 1))
    layout.cache = cache
    return out, layout


def _stacked(heads: list[Any], counts: list[int], columns: int) -> Iterator[tuple[Any, Any]]:
    """Per layer, each row's first ``counts[i]`` kept keys and values ending at column ``columns`` (zeros before:
    masked), one batch; each kept layer is let go once copied, so the kept caches and the batch's are not both
    held whole."""
    import torch

    kept = [h for h in heads if h is not None]
    for layer in range(len(kept[0].layers)):
        keys, values = (torch.zeros((len(heads), some.shape[1], columns, some.shape[3]), dtype=some.dtype,
                                    device=some.device) for some in kept[0].layers[layer])
        for row, (h, n) in enumerate(zip(heads, counts, strict=True)):
            if n > 0:
                keys[row, :, columns - n:], values[row, :, columns - n:] = (t[0, :, :n] for t in h.layers[layer])
        for h in kept:
            h.layers[layer] = None
        yield keys, values


@dataclass
class _Kept:
    """A kept sequence: its tokens and, per layer, (keys, values) of shape [1, heads, tokens, dim]; ``used``: how
    many of them a prompt reuses."""

    ids: list[int]
    layers: list[tuple[Any, Any]]
    used: int = 0


class TurnCache:
    """Each sequence's KV cache from one :func:`generate_ids` call, for the next: an agent's next prompt is its
    last one plus the reply and a tool result, and reads only those. Kept sequences that the next call does not
    continue are dropped then (their episode ended), so it holds at most one call's rows: a caller bounds
    its memory by the prompts it passes per call."""

    def __init__(self) -> None:
        self._kept: list[_Kept] = []

    def start(self) -> list[_Kept]:
        """The previous call's sequences, handed to this call (which keeps its own from now on)."""
        previous, self._kept = self._kept, []
        return previous

    def keep(self, layout: _Layout, prompts: list[list[int]], generated: list[list[int]], stops: set[int]) -> None:
        """Each row's prompt and reply (up to its first stop token) with their keys and values, out of the batch's
        cache; the batch cache is emptied layer by layer as it is read."""
        import torch

        cache = layout.cache
        if not cache.layers or any(type(layer).__name__ != "DynamicLayer" or layer.keys is None or
                                   layer.keys.shape[-2] < layout.width for layer in cache.layers):
            return  # sliding-window layers, or a cache that does not hold the batch: nothing kept
        length = cache.layers[0].keys.shape[-2]
        spans = []
        for n, t, prompt, new in zip(layout.heads, layout.tails, prompts, generated, strict=True):
            reply = next((i + 1 for i, token in enumerate(new) if token in stops), len(new))
            reply = min(reply, length - layout.width)  # the last new token was never read back
            index = [*range(layout.head - n, layout.head), *range(layout.width - t, layout.width + reply)]
            spans.append((prompt + new[:reply], torch.tensor(index, device=cache.layers[0].keys.device)))
        kept = [_Kept(ids, []) for ids, _ in spans]
        for layer in cache.layers:
            for row, (_, index) in enumerate(spans):
                kept[row].layers.append((layer.keys[row:row + 1, :, index], layer.values[row:row + 1, :, index]))
            layer.keys = layer.values = None
        self._kept.extend(kept)


def _continued(pool: list[_Kept], prompts: list[list[int]]) -> list[_Kept | None] | None:
    """Per prompt, the kept sequence of ``pool`` it continues furthest (reusing all but at least its last token), or
    None; None when no prompt continues one. The matched sequences leave ``pool``."""
    heads: list[_Kept | None] = []
    for prompt in prompts:
        best, used = None, 0
        for kept in pool:
            n = min(len(os.path.commonprefix([kept.ids, prompt])), len(prompt) - 1)
            if n > used:
                best, used = kept, n
        heads.append(None if best is None else _Kept(best.ids, best.layers, used))
    matched = {id(h.layers) for h in heads if h is not None}
    pool[:] = [k for k in pool if id(k.layers) not in matched]
    return heads if matched else None


def _eager(model: Any) -> bool:
    return getattr(model.config, "_attn_implementation", None) in ("eager", EAGER_GQA)


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
