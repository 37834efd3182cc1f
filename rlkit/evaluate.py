"""``rlkit eval``: greedy pass@1 on a recipe's eval split, batched, with per-example predictions.

The target is a recipe (its base model) or a run directory (base + the run's adapter); ``--model``
names something else to evaluate: a merged model directory, a base model id, an adapter directory
or another run directory.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlkit import jsonl, safety
from rlkit.errors import UserError

log = logging.getLogger("rlkit")


def evaluate(
    target: str | Path,
    model: str | None = None,
    *,
    limit: int | None = None,
    smoke: bool = False,
    out: str | Path | None = None,
    overrides: list[str] | None = None,
    show_progress: bool = True,
    resume: bool = False,
) -> dict[str, Any]:
    """Evaluate and write a results JSON; returns the results (``accuracy``, ``examples``, ...).

    Each example (each trajectory, for an agent) is appended to a JSONL file next to the results as it
    finishes; ``resume`` continues after the ones a killed eval wrote.
    """
    from rlkit.data import get_task, load_rows, task_rows

    if out is not None:  # before any model loads: never a results file rlkit did not write
        safety.check_target(out, "--out")
        if Path(out).exists():
            safety.check_replaceable_file(out, "--out", ("recipe", "model"))
    recipe, run_dir = resolve_target(target, overrides, smoke)
    if recipe.data.eval is None:
        raise UserError(f"{target}: the recipe has no `data.eval` split to evaluate on")
    if recipe.env is not None:
        from rlkit.rollout import evaluate_agent

        return evaluate_agent(recipe, run_dir, model, limit=limit, out=out, show_progress=show_progress,
                              resume=resume)
    if recipe.algorithm == "reward":
        return evaluate_reward_model(recipe, run_dir, model, limit=limit, out=out, show_progress=show_progress)
    task = get_task(recipe.data.task)
    if not hasattr(task, "score"):
        raise UserError(f"{target}: task {recipe.data.task!r} has no answer to check, so no accuracy")
    source = recipe.data.eval.model_copy(update={"limit": limit}) if limit else recipe.data.eval
    rows = task_rows(recipe, "eval", load_rows(recipe.data.task, source))

    lm, tokenizer, label = load_for_eval(recipe, run_dir, model)
    from rlkit.rewards.math import extract_answer

    path = Path(out) if out else _default_out(recipe.name, run_dir, label)
    with safety.hold(path), journal(path, ".examples.jsonl", resume, ("prompt", "completion")) as sink:
        # Examples are written in row order as each batch finishes: a killed eval resumes after the last one.
        todo = rows.select(range(len(sink.done), len(rows)))

        def write_batch(first: int, completions: list[str]) -> None:
            batch = todo.select(range(first, first + len(completions)))
            for row, c, s in zip(batch, completions, task.score(completions, batch), strict=True):
                sink.write({"prompt": row["prompt"][-1]["content"], "gold": row["answer"],
                            "prediction": extract_answer(c), "completion": c, "correct": bool(s)})

        started = time.time()
        generate(lm, tokenizer, list(todo["prompt"]), recipe.model.chat_template_kwargs,
                 max_new_tokens=recipe.eval.max_new_tokens, batch_size=recipe.eval.batch_size,
                 show_progress=show_progress, on_batch=write_batch)
        elapsed = time.time() - started
        examples = jsonl.read_records(sink.path)
        results = {
            "recipe": recipe.name, "model": label, "task": recipe.data.task, "n": len(examples),
            "accuracy": sum(e["correct"] for e in examples) / len(examples), "seconds": round(elapsed, 2),
            "examples": examples,
        }
        return _write(results, path)


@contextmanager
def journal(results: Path, suffix: str, resume: bool, keys: tuple[str, ...]) -> Iterator[Any]:
    """The JSONL file next to ``results`` that an eval appends each finished record to.

    Without ``resume`` an earlier one is replaced, and only if rlkit wrote it.
    """
    path = results.with_suffix(suffix)
    safety.check_target(path, "--out")
    if results.exists():
        safety.check_replaceable_file(results, "--out", ("recipe", "model"))
    if path.exists() and not resume:
        safety.check_replaceable_file(path, "--out", keys)
        path.unlink()
    with safety.JsonlAppender(path, resume=resume, keys=keys) as sink:
        if sink.done:
            log.info("%s: %d records already written; continuing after them", path, len(sink.done))
        yield sink


def resolve_target(target: str | Path, overrides: list[str] | None = None,
                   smoke: bool = False) -> tuple[Any, Path | None]:
    """(recipe, run directory or None) for a run directory or a recipe file."""
    from rlkit import runs
    from rlkit.recipe import load_recipe, validate

    target = Path(target)
    if runs.is_run_dir(target):
        from rlkit.recipe import apply_overrides

        # --set applies to the recorded recipe too (e.g. another eval set); it used to be dropped silently.
        resolved = apply_overrides(runs.read_resolved(target), overrides or [])
        resolved.pop("provenance", None)
        return validate(resolved, source=str(target / runs.RESOLVED)), target
    return load_recipe(target, overrides, smoke=smoke), None


def evaluate_reward_model(recipe: Any, run_dir: Path | None, model: str | None, *, limit: int | None,
                          out: str | Path | None, show_progress: bool = True) -> dict[str, Any]:
    """Pairwise accuracy of a reward model: the share of eval pairs where chosen outscores rejected."""
    import torch

    from rlkit import progress
    from rlkit.data import load_preference_rows
    from rlkit.trainers.reward import load_score_model

    target = model or run_dir
    if target is None:
        raise UserError("a reward recipe's base model has an untrained score head; evaluate a reward run directory "
                        "(rlkit eval RUN_DIR) or pass --model")
    source = recipe.data.eval.model_copy(update={"limit": limit}) if limit else recipe.data.eval
    rows = load_preference_rows(recipe.data.task, source)
    scorer, tokenizer = load_score_model(recipe, target)
    scorer.eval()
    kwargs = recipe.model.chat_template_kwargs

    def text(prompt: Any, answer: Any) -> str:
        if isinstance(prompt, list):
            return tokenizer.apply_chat_template(prompt + answer, tokenize=False, **kwargs)
        return prompt + answer

    started = time.time()
    scores: dict[str, list[float]] = {"chosen": [], "rejected": []}
    size = recipe.eval.batch_size
    with progress.bar("scoring pairs", len(rows), show=show_progress) as advance, torch.inference_mode():
        for i in range(0, len(rows), size):
            batch = rows.select(range(i, min(i + size, len(rows))))
            for side in scores:
                texts = [text(p, a) for p, a in zip(batch["prompt"], batch[side], strict=True)]
                enc = tokenizer(texts, return_tensors="pt", padding=True, truncation=True,
                                max_length=recipe.model.max_seq_length, add_special_tokens=False)
                scores[side].extend(scorer(**enc.to(scorer.device)).logits[:, 0].float().tolist())
            advance(len(batch))
    wins = [c > r for c, r in zip(scores["chosen"], scores["rejected"], strict=True)]
    margins = [c - r for c, r in zip(scores["chosen"], scores["rejected"], strict=True)]
    label = str(target)
    results = {
        "recipe": recipe.name, "model": label, "task": recipe.data.task, "n": len(wins), "metric": "pairwise accuracy",
        "accuracy": sum(wins) / len(wins), "mean_margin": sum(margins) / len(margins),
        "seconds": round(time.time() - started, 2),
        "examples": [{"chosen_score": c, "rejected_score": r, "correct": w}
                     for c, r, w in zip(scores["chosen"], scores["rejected"], wins, strict=True)],
    }
    return _write(results, Path(out) if out else _default_out(recipe.name, run_dir, label))


def _write(results: dict[str, Any], path: Path) -> dict[str, Any]:
    safety.check_target(path, "--out")
    if path.exists():
        safety.check_replaceable_file(path, "--out", ("recipe", "model"))
    safety.make_parent(path, "eval")
    safety.write_text(path, safety.dumps(results, indent=2))
    results["path"] = str(path)
    return results


def _default_out(name: str, run_dir: Path | None, label: str) -> Path:
    return (run_dir / "eval" if run_dir else Path("evals") / name) / f"{model_tag(label)}.json"


def model_tag(label: str) -> str:
    """A file-name-safe tag for a model label (a path, a Hub id or a served model name)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(label).name).strip("_") or "model"


def sampling_kwargs(temperature: float | None, num_return_sequences: int = 1) -> dict[str, Any]:
    """``generate`` kwargs: greedy at temperature 0/None, else plain sampling (no top-k/top-p truncation)."""
    if not temperature:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0,
            "num_return_sequences": num_return_sequences}


def load_for_eval(recipe: Any, run_dir: Path | None, model: str | None) -> tuple[Any, Any, str]:
    """(model, tokenizer, label) for the eval target, always on the hf backend (batched generate), made
    ready for fast generation on this machine (`rlkit.fastgen`)."""
    from rlkit.fastgen import for_generation

    lm, tokenizer, label = _load_for_eval(recipe, run_dir, model)
    return for_generation(lm, recipe.model.dtype), tokenizer, label


def _load_for_eval(recipe: Any, run_dir: Path | None, model: str | None) -> tuple[Any, Any, str]:
    from rlkit import runs
    from rlkit.backends import hf

    if model is None:
        if run_dir is None:
            return (*hf.load(recipe.model), recipe.model.name_or_path)
        return (*_base_plus_adapter(recipe, run_dir / "adapter"), f"{run_dir}/adapter")
    path = Path(model)
    if runs.holds_adapter(path):
        return (*_base_plus_adapter(recipe, hf.adapter_dir(path)), str(hf.adapter_dir(path)))
    spec = recipe.model.model_copy(update={"name_or_path": model, "load_in_4bit": False})
    return (*hf.load(spec), model)


def _base_plus_adapter(recipe: Any, adapter: Path) -> tuple[Any, Any]:
    from rlkit.backends import hf
    from rlkit.backends.recorded import run_dir_of, trained_base

    # The adapter is evaluated on the base it was trained against, as the run recorded it (4-bit stays
    # 4-bit, Unsloth's pre-quantized checkpoint stays that checkpoint).
    spec, quantization = trained_base(recipe.model, run_dir_of(adapter))
    base, _ = hf.load(spec, quantization=quantization)
    model = hf.attach_adapter(base, adapter, trainable=False)
    return model, hf.load_tokenizer(str(adapter))


def generate(model: Any, tokenizer: Any, prompts: list[Any], chat_template_kwargs: dict[str, Any], *,
             max_new_tokens: int, batch_size: int, show_progress: bool = True,
             num_return_sequences: int = 1, temperature: float | None = None,
             description: str = "generating", on_batch: Any = None) -> list[str]:
    """Completions for chat prompts, batched with left padding: greedy, or sampled at ``temperature``.

    With ``num_return_sequences=k`` the result holds k completions per prompt, prompt by prompt.
    ``on_batch(first_prompt_index, completions)`` sees each batch, in prompt order, as soon as it is decoded
    (to write it).
    """
    import torch

    from rlkit import progress
    from rlkit.fastgen import length_order

    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True, **chat_template_kwargs)
             for p in prompts]
    # Similar lengths share a batch (less padding); completions go back in prompt order below. A caller that
    # writes each batch as it ends (on_batch) gets prompt order: its file is then always a prefix of the
    # prompts, which is what --resume continues from.
    order = (list(range(len(texts))) if on_batch is not None else
             length_order([len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]))
    texts = [texts[i] for i in order]
    tokenizer.padding_side = "left"
    model.eval()
    device = next(model.parameters()).device
    out: list[str] = []
    with progress.bar(description, len(texts), show=show_progress) as advance, torch.inference_mode():
        for i in range(0, len(texts), batch_size):
            batch = tokenizer(texts[i:i + batch_size], return_tensors="pt", padding=True,
                              add_special_tokens=False).to(device)
            ids = model.generate(**batch, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                 **sampling_kwargs(temperature, num_return_sequences))
            new = ids[:, batch["input_ids"].shape[1]:]
            decoded = tokenizer.batch_decode(new, skip_special_tokens=True)
            out.extend(decoded)
            if on_batch is not None:
                on_batch(i, decoded)
            advance(len(batch["input_ids"]))
    k = num_return_sequences
    restored: list[str] = [""] * len(out)
    for pos, i in enumerate(order):
        restored[i * k:(i + 1) * k] = out[pos * k:(pos + 1) * k]
    return restored
