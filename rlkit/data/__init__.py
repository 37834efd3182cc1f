"""Task datasets. A task module turns rows of one format into trainer-ready datasets.

Each task module provides ``load(source)`` (Hub id or local file), ``generate(n, seed)`` (a seeded
generator in the same format, for smoke runs and the demo), and the row builders the algorithms
need (``sft_rows``, ``grpo_rows``). Tasks with a checkable answer also provide ``eval_rows`` and
``score``.
"""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType
from typing import Any

from rlkit.errors import UserError

# name -> module; imported lazily so `rlkit --help` stays cheap.
TASKS = {
    "gsm8k": "rlkit.data.gsm8k",
    "sft": "rlkit.data.sft",
    "preference": "rlkit.data.preference",
    "hh_rlhf": "rlkit.data.hh_rlhf",
    "multihop_rag": "rlkit.data.multihop_rag",
    "qa": "rlkit.data.qa",
    "calc": "rlkit.data.calc",
}


def get_task(name: str) -> ModuleType:
    if name not in TASKS:
        raise UserError(f"unknown task {name!r}; valid: {', '.join(sorted(TASKS))}")
    return importlib.import_module(TASKS[name])


def load_rows(task_name: str, source: Any):
    """Rows for a recipe's ``DataSource``: generated, or loaded and checked by the task."""
    task = get_task(task_name)
    if source.synthetic is not None:
        if not hasattr(task, "generate"):
            raise UserError(f"task {task_name!r} has no generator; give `path:` instead of `synthetic:`")
        try:
            inspect.signature(task.generate).bind(source.synthetic, seed=source.seed, **source.generator)
        except TypeError as e:
            raise UserError(f"data.generator: {e} (task {task_name!r})") from None
        ds = task.generate(source.synthetic, seed=source.seed, **source.generator)
    else:
        ds = task.load(source)
    return _limited(ds, source)


def _limited(ds, source: Any):
    if source.limit is not None and len(ds) > source.limit:
        ds = ds.select(range(source.limit))
    if len(ds) == 0:
        raise UserError(f"{source.path or 'synthetic'}: the dataset is empty")
    return ds


def task_rows(recipe: Any, kind: str, ds):
    """The task's ``{kind}_rows`` of ``ds`` (grpo, sft, eval), built with the recipe's prompt variant."""
    task = get_task(recipe.data.task)
    build = getattr(task, f"{kind}_rows", None)
    if build is None:
        raise UserError(f"task {recipe.data.task!r} has no {kind} rows")
    return build(ds, prompt=resolve_prompt(task, recipe.data.prompt)) if hasattr(task, "PROMPTS") else build(ds)


def resolve_prompt(task: ModuleType, value: str) -> str:
    """``data.prompt``: a name in the task's ``PROMPTS`` stays a name; for tasks with ``CUSTOM_PROMPTS`` a
    file's contents or the text itself (anything with a space) is the system prompt."""
    from pathlib import Path

    prompts = getattr(task, "PROMPTS", {})
    if value in prompts or not getattr(task, "CUSTOM_PROMPTS", False):
        return value
    path = Path(value).expanduser()
    if path.is_file():
        text = path.read_text(encoding="utf-8", errors="replace").strip()
        if not text:
            raise UserError(f"data.prompt: {value} is empty")
        return text
    if len(value.split()) > 1:  # text: a prompt file name has no spaces
        return value
    if path.suffix in (".txt", ".md", ".jinja") or "/" in value:
        raise UserError(f"data.prompt: no such prompt file {value}")
    import difflib

    close = difflib.get_close_matches(value, prompts, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    name = task.__name__.rpartition(".")[2]
    raise UserError(f"data.prompt: task {name!r} has no prompt {value!r}{hint}; give one of {', '.join(prompts)}, "
                    "a prompt file, or the prompt text itself")


def success_rule(recipe: Any) -> Any:
    """``metrics -> bool`` for ``data.success`` (em | f1>=X | accuracy | task), default the task's rule."""
    import re

    rule = recipe.data.success
    task = get_task(recipe.data.task)
    if rule is None or rule == "task":
        return task.success
    if rule == "em":
        return lambda metrics: metrics.get("em") == 1.0
    if rule == "accuracy":
        return lambda metrics: metrics.get("accuracy") == 1.0
    threshold = float(re.sub(r"^f1\s*>=\s*", "", rule))
    return lambda metrics: (metrics.get("f1") or 0.0) >= threshold


def load_preference_rows(task_name: str, source: Any):
    """Pairs for dpo/reward: a pairs file (``prompt``/``chosen``/``rejected``, any task), the task's own
    preference format, or the task's generator turned into pairs."""
    task = get_task(task_name)
    if not hasattr(task, "preference_rows"):
        raise UserError(f"task {task_name!r} has no preference pairs; use `task: preference` (prompt/chosen/"
                        "rejected files) or `task: hh_rlhf`")
    if source.synthetic is None and hasattr(task, "load_preference"):
        return _limited(task.load_preference(source), source)
    return task.preference_rows(load_rows(task_name, source))


def load_prompt_rows(recipe: Any, source: Any):
    """Prompts (and gold answers, where the task has them) for on-policy sampling: PPO, ``rlkit pairs``.

    Built with the recipe's ``data.prompt`` like its train and eval rows: samples drawn under another system
    prompt would teach the model answers to prompts it never sees.
    """
    task = get_task(recipe.data.task)
    if not hasattr(task, "prompt_rows"):
        raise UserError(f"task {recipe.data.task!r} has no prompts to sample from")
    ds = load_rows(recipe.data.task, source)
    if hasattr(task, "PROMPTS"):
        return task.prompt_rows(ds, prompt=resolve_prompt(task, recipe.data.prompt))
    return task.prompt_rows(ds)
