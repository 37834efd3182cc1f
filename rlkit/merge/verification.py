"""Verification: the saved directory against the adapter on its training base, on fixed prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlkit.merge.source import Source

MAX_NEW_TOKENS = 16
# What rounding can do, in units of eps * max|reference logit| at a position (eps: the coarsest machine epsilon
# among the reference's compute dtype and the saved dtype; one unit is about one ulp of the largest logit).
# Measured over 21 tiny-model adapters and SmolLM2 (docs/merging.md): a correct merge flips top-1 only where
# the reference's margin was <= 1.43 units and has mean KL <= 0.07 units^2; a merge onto the original weights
# has flips at >= 9.9 units and mean KL >= 4.8; a dropped adapter or a doubled scaling, far more.
FLIP_UNITS = 4.0
KL_UNITS = 1.0
# A GPU's float32 matmuls may run in TF32 (10 mantissa bits, like fp16): never assume finer than that.
EPS_FLOOR = 2.0 ** -10
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
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from rlkit.inference.load import with_adapter

    tokenizer = AutoTokenizer.from_pretrained(str(src.adapter))
    merged_tokenizer = AutoTokenizer.from_pretrained(str(merged_dir))
    prompts = verification_prompts(tokenizer, src.spec.chat_template_kwargs)
    reference = with_adapter(src.spec, src.adapter, src.quantization)
    ref_out = outputs(reference, tokenizer, prompts)
    # Both models are scored on the same tokens: each prompt and the reference's greedy continuation, so a
    # greedy decode that parts ways shows as a top-1 flip at a position where the reference's margin is known.
    continuations = [ids for _, ids in ref_out]
    with reference.disable_adapter():
        base_logits = [lg for lg, _ in outputs(reference, tokenizer, prompts, continuations, generate=False)]
    dtypes = compute_dtypes(reference)
    del reference
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # else the reference's freed blocks count as used in fits_on_gpu
    dtypes.add(AutoConfig.from_pretrained(merged_dir).dtype or torch.float32)  # what the weights were saved in
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    if torch.cuda.is_available() and fits_on_gpu(merged):
        merged.to("cuda")
    merged_out = outputs(merged, tokenizer, prompts, continuations)
    checks = compare(ref_out, merged_out, eps=max(EPS_FLOOR, *(torch.finfo(d).eps for d in dtypes)))
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


def compute_dtypes(model: Any) -> set[Any]:
    """The dtypes ``model`` computes in: its floating-point weights' and its 4-bit layers' compute dtype."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return dtypes | {m.compute_dtype for m in model.modules() if getattr(m, "compute_dtype", None) is not None}


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


def outputs(model: Any, tokenizer: Any, prompts: list[tuple[str, str, list[int]]],
            continuations: list[list[int]] | None = None, *, generate: bool = True) -> list[tuple[Any, list[int]]]:
    """Per prompt: float32 logits on CPU at every position of the prompt and its continuation (the given one,
    else the model's own greedy one), and the greedy continuation (one prompt at a time: no padding)."""
    from rlkit.inference.generate import generate_ids, logits

    ids = [prompt_ids for _, _, prompt_ids in prompts]
    generations = [g.ids for g in generate_ids(model, tokenizer, ids, max_new_tokens=MAX_NEW_TOKENS, batch_size=1)] \
        if generate else [[] for _ in ids]
    scored = generations if continuations is None else continuations
    # The last token is only predicted, never fed: each position's logits predict the next scored token.
    scores = [logits(model, prompt_ids + cont[:-1]) for prompt_ids, cont in zip(ids, scored, strict=True)]
    return list(zip(scores, generations, strict=True))


def compare(reference: list[tuple[Any, list[int]]], merged: list[tuple[Any, list[int]]], *,
            eps: float) -> dict[str, Any]:
    """Logit and decode agreement of ``merged`` with ``reference``, over all positions and per prompt.

    ``eps`` sets the rounding unit of each position, ``eps * max|reference logit|``: a top-1 change is
    *decided* where the reference's margin between its own top-1 and the merged model's exceeded
    ``FLIP_UNITS`` units (a near-tie that rounding may break either way is not), and KL is also given in
    units squared. ``beyond_rounding`` lists what a correct merge at this precision would not show.
    """
    import torch

    rows, diffs, kls, agree, margins, units = [], [], [], [], [], []
    for (ref, ref_ids), (new, new_ids) in zip(reference, merged, strict=True):
        diff = (ref - new).abs()
        log_p, log_q = ref.double().log_softmax(-1), new.double().log_softmax(-1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)
        unit = eps * ref.abs().amax(-1).double().clamp_min(1e-30)
        ref_top, new_top = ref.argmax(-1), new.argmax(-1)
        same = ref_top == new_top
        # How decided the reference was where top-1 changed: ~0 means a tie that rounding may break either way.
        margin = (ref.gather(-1, ref_top[:, None]) - ref.gather(-1, new_top[:, None]))[:, 0].double()
        gap = margin[~same]
        decided = int((margin / unit > FLIP_UNITS).sum())
        diffs.append(diff.flatten())
        kls.append(kl)
        agree.append(same)
        margins.append(margin / unit)
        units.append(unit)
        rows.append({"tokens": ref.shape[0], "max_abs_logit_diff": diff.max().item(),
                     "mean_abs_logit_diff": diff.mean().item(), "top1_agreement": same.float().mean().item(),
                     "mean_kl": kl.mean().item(), "top1_flip_max_ref_margin": gap.max().item() if gap.numel() else 0.0,
                     "decided_flips": decided, "greedy_match": ref_ids == new_ids})
    diff, kl, same, unit = torch.cat(diffs), torch.cat(kls), torch.cat(agree), torch.cat(units)
    margin_units = torch.cat(margins)[~same]
    checks = {
        "max_abs_logit_diff": diff.max().item(),
        "mean_abs_logit_diff": diff.mean().item(),
        "top1_agreement": same.float().mean().item(),
        "top1_flip_max_ref_margin": max(r["top1_flip_max_ref_margin"] for r in rows),
        "mean_kl": kl.mean().item(),
        "greedy_match": sum(r["greedy_match"] for r in rows) / len(rows),
        "positions": same.numel(),
        "rounding_eps": eps,
        "top1_flip_max_ref_margin_units": margin_units.max().item() if margin_units.numel() else 0.0,
        "decided_flips": sum(r["decided_flips"] for r in rows),
        "mean_kl_units": (kl / unit**2).mean().item(),
        "prompts": rows,
    }
    checks["beyond_rounding"] = beyond_rounding(checks)
    return checks


def beyond_rounding(checks: dict[str, Any]) -> list[str]:
    """What in ``checks`` a correct merge would not show at its precision (empty: within rounding).

    Greedy decodes are not judged apart: both models are scored on the reference's continuation, so where
    they part ways is a top-1 change whose margin is judged like any other.
    """
    found = []
    if checks["decided_flips"]:
        found.append(f"{checks['decided_flips']} top-1 change(s) where the adapter was decided (reference margin up "
                     f"to {checks['top1_flip_max_ref_margin_units']:.3g} rounding units, > {FLIP_UNITS:g})")
    if checks["mean_kl_units"] > KL_UNITS:
        found.append(f"mean KL {checks['mean_kl_units']:.3g} rounding units squared (> {KL_UNITS:g})")
    return found
