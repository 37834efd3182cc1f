"""Verification: the saved directory against the adapter on its training base, on fixed prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlkit.merge.source import Source

MAX_NEW_TOKENS = 16
# Fixed verification prompts: chat turns go through the run's chat template, texts are tokenized as-is.
CHAT_PROMPTS = [
    [{"role": "user", "content": "Tom has 12 apples. He buys 7 more. How many apples does Tom have now?"}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a short poem about the sea."}],
]
TEXT_PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Scientists study how plants grow under different light conditions, and",
    "Each box holds 6 eggs. Maria has 9 boxes. How many eggs are there in total?\n",
]


def verify(src: Source, merged_dir: Path) -> dict[str, Any]:
    """Logit, decode and tokenizer agreement of the merged model with the adapter on its training base."""
    import gc

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit.inference.load import with_adapter

    tokenizer = AutoTokenizer.from_pretrained(str(src.adapter))
    merged_tokenizer = AutoTokenizer.from_pretrained(str(merged_dir))
    prompts = verification_prompts(tokenizer, src.spec.chat_template_kwargs)
    reference = with_adapter(src.spec, src.adapter, src.quantization)
    ref_out = outputs(reference, tokenizer, prompts)
    with reference.disable_adapter():
        base_logits = [logits for logits, _ in outputs(reference, tokenizer, prompts, generate=False)]
    del reference
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # else the reference's freed blocks count as used in fits_on_gpu
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    if torch.cuda.is_available() and fits_on_gpu(merged):
        merged.to("cuda")
    merged_out = outputs(merged, tokenizer, prompts)
    checks = compare(ref_out, merged_out)
    checks["adapter_effect_max_abs_logit"] = max(
        (ref - b).abs().max().item() for (ref, _), b in zip(ref_out, base_logits, strict=True))
    checks["tokenizer"] = {
        "chat_template_equal": merged_tokenizer.chat_template == tokenizer.chat_template,
        "vocab_equal": merged_tokenizer.get_vocab() == tokenizer.get_vocab(),
        "prompt_ids_equal": verification_prompts(merged_tokenizer, src.spec.chat_template_kwargs) == prompts,
    }
    for row, (kind, text, _), (_, ref_ids), (_, merged_ids) in zip(checks["prompts"], prompts, ref_out, merged_out,
                                                                    strict=True):
        row.update(kind=kind, prompt=text, reference=tokenizer.decode(ref_ids), merged=tokenizer.decode(merged_ids))
    return checks


def fits_on_gpu(model: Any, free_bytes: int | None = None) -> bool:
    """Whether ``model`` fits in 90% of the GPU's free memory (else the check runs on the CPU, slower)."""
    if free_bytes is None:
        import torch

        free_bytes = torch.cuda.mem_get_info()[0]
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return size <= 0.9 * free_bytes


def verification_prompts(tokenizer: Any, chat_template_kwargs: dict[str, Any]) -> list[tuple[str, str, list[int]]]:
    """``(kind, text, token ids)`` for the fixed chat and plain-text prompts."""
    from rlkit.inference.generate import render, tokenize

    texts = render(tokenizer, CHAT_PROMPTS, chat_template_kwargs)
    rows = [("chat", text, ids) for text, ids in zip(texts, tokenize(tokenizer, texts), strict=True)]
    for text in TEXT_PROMPTS:
        rows.append(("text", text, tokenizer(text)["input_ids"]))
    return rows


def outputs(model: Any, tokenizer: Any, prompts: list[tuple[str, str, list[int]]], *,
            generate: bool = True) -> list[tuple[Any, list[int]]]:
    """Per prompt: float32 logits on CPU and the greedy continuation (one prompt at a time: no padding)."""
    from rlkit.inference.generate import generate_ids, logits

    ids = [prompt_ids for _, _, prompt_ids in prompts]
    scores = [logits(model, prompt_ids) for prompt_ids in ids]
    if not generate:
        return [(s, []) for s in scores]
    generations = generate_ids(model, tokenizer, ids, max_new_tokens=MAX_NEW_TOKENS, batch_size=1)
    return [(s, g.ids) for s, g in zip(scores, generations, strict=True)]


def compare(reference: list[tuple[Any, list[int]]], merged: list[tuple[Any, list[int]]]) -> dict[str, Any]:
    """Logit and decode agreement of ``merged`` with ``reference``, over all positions and per prompt."""
    import torch

    rows, diffs, kls, agree = [], [], [], []
    for (ref, ref_ids), (new, new_ids) in zip(reference, merged, strict=True):
        diff = (ref - new).abs()
        log_p, log_q = ref.double().log_softmax(-1), new.double().log_softmax(-1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)
        ref_top, new_top = ref.argmax(-1), new.argmax(-1)
        same = ref_top == new_top
        # How decided the reference was where top-1 changed: ~0 means a tie that rounding may break either way.
        gap = (ref.gather(-1, ref_top[:, None]) - ref.gather(-1, new_top[:, None]))[~same]
        diffs.append(diff.flatten())
        kls.append(kl)
        agree.append(same)
        rows.append({"tokens": ref.shape[0], "max_abs_logit_diff": diff.max().item(),
                     "mean_abs_logit_diff": diff.mean().item(), "top1_agreement": same.float().mean().item(),
                     "mean_kl": kl.mean().item(), "top1_flip_max_ref_margin": gap.max().item() if gap.numel() else 0.0,
                     "greedy_match": ref_ids == new_ids})
    diff, kl, same = torch.cat(diffs), torch.cat(kls), torch.cat(agree)
    return {
        "max_abs_logit_diff": diff.max().item(),
        "mean_abs_logit_diff": diff.mean().item(),
        "top1_agreement": same.float().mean().item(),
        "top1_flip_max_ref_margin": max(r["top1_flip_max_ref_margin"] for r in rows),
        "mean_kl": kl.mean().item(),
        "greedy_match": sum(r["greedy_match"] for r in rows) / len(rows),
        "positions": same.numel(),
        "prompts": rows,
    }

