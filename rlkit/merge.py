"""``rlkit merge``: fold a LoRA adapter into its base and save a plain transformers model, verified.

Why not just ``merge_and_unload()`` on whatever base is at hand: a QLoRA adapter was trained against
dequant(nf4(W)), not W. Added to the original 16-bit W (what most export tools do) it shifts every
logit (tiny model: mean |Δlogits| ~30x the faithful merge's, top-1 agreement 0.81-0.95); merged into the
4-bit model it is re-quantized. The faithful merge (``--base dequantized``, the default) loads the base
exactly as training did (same ``BitsAndBytesConfig`` and dtype, via :func:`rlkit.backends.hf.load`),
dequantizes it, merges in float32 and casts once to ``--dtype``: float32 reproduces the adapter to ~1e-6,
bf16 to its rounding (positions the adapter itself nearly tied may flip). ``--base original`` merges into
the unquantized weights, for comparison; for an adapter trained on a 16-bit base the two modes are the
same merge. A recipe's ``dtype: auto`` resolves on the merging machine (bf16 on a GPU, float32 on CPU).
See stack-facts.md.

Every merge is checked: the saved directory is reloaded with plain ``AutoModelForCausalLM`` and compared
with the adapter on its training base (4-bit stays 4-bit) on fixed chat and plain-text prompts: max and
mean |Δlogits|, top-1 agreement, KL(ref||merged) and greedy decodes. The numbers go to
``DIR/merge_report.json``. The model is written to a temporary sibling of DIR and renamed into place at
the end, so a failure never leaves a half-written DIR; the adapter is only read.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit import safety
from rlkit.errors import UserError

log = logging.getLogger("rlkit")

BASE_MODES = ("dequantized", "original")
DTYPES = ("bfloat16", "float16", "float32")
REPORT = "merge_report.json"
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


@dataclass
class Source:
    """What the adapter was trained on, read from the run directory (or the adapter's own config)."""

    adapter: Path
    run_dir: Path | None
    spec: Any  # rlkit.recipe.ModelSpec: how training loaded the base (and prompted the model)
    notes: list[str] = field(default_factory=list)
    # The bitsandbytes config the base was trained under, as recorded (None: rlkit's nf4 or 16-bit).
    quantization: dict[str, Any] | None = None
    # The recipe's model (the 16-bit original that `--base original` merges into).
    recipe_model: str | None = None


def merge(
    source: str | Path,
    out: str | Path,
    *,
    base: str = "dequantized",
    dtype: str = "bfloat16",
    base_model: str | None = None,
    overwrite: bool = False,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Merge the adapter of ``source`` (a run or adapter directory) into ``out``; returns the report."""
    if base not in BASE_MODES:
        raise UserError(f"--base: expected one of {', '.join(BASE_MODES)}, got {base!r}")
    if dtype not in DTYPES:
        raise UserError(f"--dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    src = read_source(source, base_model)
    out = Path(out)
    inputs = [src.adapter, Path(_canonical(src.spec.name_or_path))]
    safety.check_target(out, "--out", inputs)
    with safety.hold(out):  # one merge into --out at a time
        _check_out(out, inputs, overwrite)
        return _merge(src, out, base, dtype, show_progress)


def _merge(src: Source, out: Path, base: str, dtype: str, show_progress: bool) -> dict[str, Any]:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from rlkit import progress as progress_

    tmp = _sibling(out, "merging")
    safety.make_dir(tmp, "merge")  # the marker moves into --out with the model
    seconds: dict[str, float] = {}
    started = time.time()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    try:
        with Progress(*columns, disable=not (show_progress and progress_.interactive()), transient=True,
                      console=progress_.console()) as progress:
            with _stage(progress, seconds, "load base"):
                model = load_base(src.spec, base, quantization=src.quantization, original=src.recipe_model)
            with _stage(progress, seconds, "merge"):
                model = merge_adapter(model, src.adapter)
            with _stage(progress, seconds, "save"):
                save(model, src.adapter, tmp, dtype)
                del model
            with _stage(progress, seconds, "verify"):
                checks = verify(src, tmp)
        seconds["total"] = round(time.time() - started, 2)
        report = _report(src, out, base, dtype, checks, seconds)
        (tmp / REPORT).write_text(json.dumps(report, indent=2))
        _move_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report["path"] = str(out / REPORT)
    _warn_if_unfaithful(report)
    return report


# ---------------------------------------------------------------------------------------------
# Where the adapter came from


def read_source(source: str | Path, base_model: str | None = None) -> Source:
    """The adapter and its training base: from ``recipe.resolved.yaml`` when there is a run directory."""
    from rlkit import runs
    from rlkit.backends import hf
    from rlkit.backends.recorded import trained_base
    from rlkit.recipe import ModelSpec

    adapter = hf.adapter_dir(source)
    trained_on = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    # RUN, RUN/adapter or RUN/checkpoints/checkpoint-N: the run directory knows whether the base was 4-bit.
    run_dir = next((d for d in (Path(source), *adapter.parents[:2]) if runs.is_run_dir(d)), None)
    if run_dir is not None:
        resolved = runs.read_resolved(run_dir)
        provenance = resolved.pop("provenance", None) or {}
        spec = _model_spec(ModelSpec, resolved.get("model"), run_dir / runs.RESOLVED)
        if spec.dtype == "auto" and provenance.get("dtype") in ("bfloat16", "float16", "float32"):
            # `auto` resolves per machine: load the base in the dtype training actually used.
            spec = spec.model_copy(update={"dtype": provenance["dtype"]})
        recipe_model = spec.name_or_path
        # The checkpoint training really loaded (Unsloth swaps in its pre-quantized repo) and its quantization.
        spec, quantization = trained_base(spec, run_dir)
        known = [recipe_model, spec.name_or_path, provenance.get("model_loaded"), trained_on]
        notes = []
    else:
        if not trained_on and not base_model:
            raise UserError(f"{adapter}: adapter_config.json names no base model; pass --base-model")
        spec = ModelSpec(name_or_path=trained_on or base_model)
        recipe_model, quantization = spec.name_or_path, None
        known = [trained_on] if trained_on else []
        notes = ["no run directory: base model from adapter_config.json, assumed 16-bit; "
                 "merge a QLoRA adapter from its run directory"]
    if base_model is not None and known and not _same_model(base_model, known):
        raise UserError(f"--base-model {base_model!r}: the adapter was trained on {known[0]!r}; merging onto "
                        "another base gives a different model (omit --base-model to use the recorded one)")
    if base_model is not None:
        spec = spec.model_copy(update={"name_or_path": base_model})
    return Source(adapter=adapter, run_dir=run_dir, spec=spec, notes=notes, quantization=quantization,
                  recipe_model=recipe_model)


def _model_spec(cls: type, data: Any, source: Path) -> Any:
    # Only `model:` matters here: a run whose rewards or data cannot be resolved today still merges.
    from pydantic import ValidationError

    try:
        return cls.model_validate(data or {})
    except ValidationError as e:
        err = e.errors()[0]
        raise UserError(f"{source}: model.{'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def _same_model(name: str, known: list[str | None]) -> bool:
    return _canonical(name) in {_canonical(k) for k in known if k}


def _canonical(name: str) -> str:
    from rlkit.tiny import resolve_model_id

    resolved = resolve_model_id(name)
    path = Path(resolved).expanduser()
    return str(path.resolve()) if path.exists() else resolved


def _check_out(out: Path, inputs: list[Path], overwrite: bool) -> None:
    safety.check_target(out, "--out", inputs)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise UserError(f"--out {out}: directory is not empty; pass --overwrite to replace it")
        safety.remove(out, "--out", inputs, delete=False)  # replaced only once the new model is verified


def _sibling(out: Path, tag: str) -> Path:
    path = out.parent / f".{out.name}.{tag}-{uuid.uuid4().hex[:8]}"
    safety.make_parent(path, "merge")
    path.mkdir()  # unlike mkdtemp, honours the umask: the renamed DIR gets the usual permissions
    return path


def _move_into_place(tmp: Path, out: Path) -> None:
    old = _sibling(out, "old") / out.name if out.exists() else None
    if old is not None:
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old.parent, ignore_errors=True)


@contextmanager
def _stage(progress: Any, seconds: dict[str, float], name: str) -> Iterator[None]:
    task = progress.add_task(name, total=None)
    started = time.time()
    yield
    seconds[name] = round(time.time() - started, 2)
    progress.update(task, total=1, completed=1)


# ---------------------------------------------------------------------------------------------
# Merge and save


def load_base(spec: Any, mode: str, *, quantization: dict[str, Any] | None = None, original: str | None = None):
    """The base in float32, as the adapter saw it (``dequantized``) or as published (``original``).

    Always on the CPU: a float32 copy takes 4 bytes per parameter (28 GB for a 7B model), more than many
    GPUs hold, and merging is a few additions per weight, not worth a GPU.
    """
    import torch

    from rlkit.backends import hf

    if spec.load_in_4bit and mode == "dequantized":
        # The same bitsandbytes config (recorded, or rlkit's nf4) and compute dtype as training.
        model, _ = hf.load(spec, quantization=quantization, device="cpu")
        model.dequantize(dtype=torch.float32)
        return _plain(model.to(torch.float32))
    name = original if spec.load_in_4bit and original else spec.name_or_path
    model, _ = hf.load(spec.model_copy(update={"name_or_path": name, "load_in_4bit": False, "dtype": "float32"}),
                       device="cpu")
    return model


def _plain(model: Any):
    """The same weights in a model built from its config alone.

    A model loaded from a pre-quantized checkpoint (Unsloth's ``*-bnb-4bit``) keeps the loader's weight
    conversions after ``dequantize()``, and ``save_pretrained`` then fails trying to reverse them
    (transformers 5: ``Bnb4bitDeserialize.reverse_op`` raises NotImplementedError).
    """
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), strict=True)
    plain.generation_config = copy.deepcopy(model.generation_config)
    return plain


def merge_adapter(model: Any, adapter: Path):
    """LoRA deltas folded into the weights; ``modules_to_save`` replace their modules (PEFT unties
    tied embeddings in the config when the adapter changed one side)."""
    from rlkit.backends import hf

    return hf.attach_adapter(model, adapter, trainable=False).merge_and_unload(safe_merge=True)


def save(model: Any, adapter: Path, out: Path, dtype: str) -> None:
    """Safetensors weights, config and generation config, plus the tokenizer the trainer saved."""
    from transformers import AutoTokenizer

    from rlkit.backends import hf

    model.to(hf.torch_dtype(dtype)).save_pretrained(out)  # safetensors
    AutoTokenizer.from_pretrained(str(adapter)).save_pretrained(out)


# ---------------------------------------------------------------------------------------------
# Verify: the saved directory against the adapter on its training base


def verify(src: Source, merged_dir: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit.backends import hf

    tokenizer = AutoTokenizer.from_pretrained(str(src.adapter))
    merged_tokenizer = AutoTokenizer.from_pretrained(str(merged_dir))
    prompts = verification_prompts(tokenizer, src.spec.chat_template_kwargs)
    base, _ = hf.load(src.spec, quantization=src.quantization)
    reference = hf.attach_adapter(base, src.adapter, trainable=False)
    ref_out = _outputs(reference, prompts, tokenizer.pad_token_id)
    with reference.disable_adapter():
        base_logits = [logits for logits, _ in _outputs(reference, prompts, tokenizer.pad_token_id, generate=False)]
    del reference, base
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    if torch.cuda.is_available() and fits_on_gpu(merged):
        merged.to("cuda")
    merged_out = _outputs(merged, prompts, tokenizer.pad_token_id)
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
    rows = []
    for messages in CHAT_PROMPTS:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **chat_template_kwargs)
        rows.append(("chat", text, tokenizer(text, add_special_tokens=False)["input_ids"]))
    for text in TEXT_PROMPTS:
        rows.append(("text", text, tokenizer(text)["input_ids"]))
    return rows


def _outputs(model: Any, prompts: list[tuple[str, str, list[int]]], pad_token_id: int | None, *,
             generate: bool = True) -> list[tuple[Any, list[int]]]:
    """Per prompt: float32 logits on CPU and the greedy continuation (one prompt at a time: no padding)."""
    import torch

    model.eval()
    device = next(model.parameters()).device
    out = []
    with torch.inference_mode():
        for _, _, ids in prompts:
            input_ids = torch.tensor([ids], device=device)
            logits = model(input_ids=input_ids).logits[0].float().cpu()
            new: list[int] = []
            if generate:
                gen = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                     max_new_tokens=MAX_NEW_TOKENS, do_sample=False, pad_token_id=pad_token_id)
                new = gen[0, input_ids.shape[1]:].tolist()
            out.append((logits, new))
    return out


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


# ---------------------------------------------------------------------------------------------
# Report


def _report(src: Source, out: Path, mode: str, dtype: str, checks: dict[str, Any],
            seconds: dict[str, float]) -> dict[str, Any]:
    from importlib import metadata

    from rlkit.backends import hf
    from rlkit.tiny import resolve_model_id

    spec = src.spec
    if not spec.load_in_4bit:
        note = "the adapter was trained on a 16-bit base: 'dequantized' and 'original' are the same merge"
    elif mode == "dequantized":
        note = "faithful: nf4 base loaded as in training, dequantized, merged in float32"
    else:
        note = ("original 16-bit weights: the adapter was trained on nf4-dequantized weights, so this merge "
                "drifts from the trained model; --base dequantized is faithful")
    prompts = checks.pop("prompts")
    return {
        "source": str(src.adapter if src.run_dir is None else src.run_dir),
        "adapter": str(src.adapter),
        "out": str(out),
        "base_model": spec.name_or_path,
        "base_model_loaded": resolve_model_id(spec.name_or_path),
        "base_quantization": src.quantization,
        "recipe_model": src.recipe_model,
        "trained_in_4bit": spec.load_in_4bit,
        "reference": f"adapter on the {'nf4' if spec.load_in_4bit else '16-bit'} base, "
                     f"{str(hf.torch_dtype(spec.dtype)).removeprefix('torch.')} compute",
        "base_mode": mode,
        "base_mode_note": "; ".join([note, *src.notes]),
        "dtype": dtype,
        "metrics": checks,
        "prompts": prompts,
        "seconds": seconds,
        "versions": {name: metadata.version(name) for name in ("torch", "transformers", "peft", "bitsandbytes")},
    }


def _warn_if_unfaithful(report: dict[str, Any]) -> None:
    m = report["metrics"]
    # Top-1 flips at near-ties (tiny reference margin) are rounding, not a wrong merge; a changed greedy
    # decode is what a user would notice.
    if report["base_mode"] == "dequantized" and m["greedy_match"] < 1.0:
        log.warning("merged model's greedy decodes differ from the adapter's on %.0f%% of the check prompts "
                    "(top-1 agreement %.4f, max |Δlogits| %.3g); see %s", 100 * (1 - m["greedy_match"]),
                    m["top1_agreement"], m["max_abs_logit_diff"], report["path"])
    if not all(m["tokenizer"].values()):
        log.warning("the saved tokenizer differs from the adapter's: %s", m["tokenizer"])


def print_merge_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    m = report["metrics"]
    table = Table(title=f"merge: {report['source']} -> {report['out']}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("base model", report["base_model"]),
        ("base mode", report["base_mode"]),
        ("dtype", report["dtype"]),
        ("max |Δlogits|", f"{m['max_abs_logit_diff']:.3g}"),
        ("mean |Δlogits|", f"{m['mean_abs_logit_diff']:.3g}"),
        ("top-1 agreement", f"{m['top1_agreement']:.4f}"),
        ("largest ref margin at a top-1 flip", f"{m['top1_flip_max_ref_margin']:.3g}"),
        ("mean KL(ref||merged)", f"{m['mean_kl']:.3g}"),
        ("greedy decode match", f"{m['greedy_match']:.3f}"),
        ("adapter effect max |Δlogits|", f"{m['adapter_effect_max_abs_logit']:.3g}"),
        ("tokenizer + chat template", "same" if all(m["tokenizer"].values()) else "DIFFERENT"),
        ("seconds", f"{report['seconds']['total']:.1f}"),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    console = Console()
    console.print(table)
    console.print(f"[dim]{report['base_mode_note']}[/]", highlight=False)
    console.print(f"report: {report['path']}")
