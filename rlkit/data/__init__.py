"""Task datasets. A task module turns rows of one format into trainer-ready datasets.

Every task provides ``load(source)`` (Hub id or local file, :class:`Task`). Most also provide
``generate(n, seed)`` (a seeded generator in the same format, for smoke runs and the demo,
:class:`Generates`) and the row builders the algorithms need (``sft_rows``, ``grpo_rows``); tasks
with a checkable answer also provide ``eval_rows`` and ``score``; pairs come from ``preference_rows``
(:class:`Paired`; :class:`FiledPairs` read ready pairs from a file), prompts to sample from
``prompt_rows`` (:class:`Sampled`), and named system prompts from ``PROMPTS`` (:class:`Prompted`).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rlkit.data import calc, gsm8k, hh_rlhf, multihop_rag, preference, qa, sft
from rlkit.errors import BadValue, UserError
from rlkit.registry import Registry, did_you_mean

if TYPE_CHECKING:
    from datasets import Dataset

    from rlkit.recipe.schema import DataSource, Recipe


@runtime_checkable
class Task(Protocol):
    """What every task provides: its rows from a Hub id or a local file."""

    def load(self, source: DataSource) -> Dataset: ...


@runtime_checkable
class Generates(Task, Protocol):
    """A task with a seeded generator in its own format (``data.train: {synthetic: N}``). A knob value it refuses
    raises ``rlkit.errors.BadValue`` (one line to the user); any other exception from it is a bug."""

    def generate(self, n: int, seed: int = 0) -> Dataset: ...


@runtime_checkable
class Prompted(Task, Protocol):
    """A task whose rows are built under a named system prompt (``data.prompt``)."""

    PROMPTS: dict[str, Any]


@runtime_checkable
class PresetsEnvArgs(Task, Protocol):
    """A task that presets arguments of the environments it runs with (``ENV_ARGS[env name]``)."""

    ENV_ARGS: dict[str, dict[str, Any]]


@runtime_checkable
class Paired(Task, Protocol):
    """A task that yields preference pairs (``prompt``/``chosen``/``rejected``) for dpo and reward."""

    def preference_rows(self, ds: Dataset) -> Dataset: ...


@runtime_checkable
class FiledPairs(Paired, Protocol):
    """A paired task whose ``path:`` holds ready pairs rather than its own rows (gsm8k), read by ``load_preference``."""

    def load_preference(self, source: DataSource) -> Dataset: ...


@runtime_checkable
class Sampled(Task, Protocol):
    """A task with prompts to sample from (PPO, ``rlkit pairs``)."""

    def prompt_rows(self, ds: Dataset, prompt: str = ...) -> Dataset: ...


@runtime_checkable
class Scored(Task, Protocol):
    """A task with a checkable answer: ``rlkit eval`` scores completions against the rows' gold."""

    def score(self, completions: list[Any], rows: Any) -> list[float]: ...


@runtime_checkable
class WithEvidence(Task, Protocol):
    """A task whose rows name gold evidence passages (``rlkit index eval`` scores retrieval against them)."""

    def retrieval_queries(self, ds: Dataset) -> list[dict[str, Any]]: ...


TASKS: Registry[ModuleType] = Registry("task", {
    "gsm8k": gsm8k,
    "calc": calc,
    "sft": sft,
    "preference": preference,
    "hh_rlhf": hh_rlhf,
    "multihop_rag": multihop_rag,
    "qa": qa,
})


def get_task(name: str) -> ModuleType:
    return TASKS.get(name)


def env_presets(task_name: str, env_name: str) -> dict[str, Any]:
    """The task's preset arguments for environment ``env_name`` (MultiHop-RAG describes its news corpus)."""
    task = get_task(task_name)
    return dict(task.ENV_ARGS.get(env_name, {})) if isinstance(task, PresetsEnvArgs) else {}


def env_factory(recipe: Recipe) -> Callable[[], Any]:
    """TRL's ``environment_factory`` for the recipe's environment, with what its task presets for it."""
    from rlkit.envs import make_factory

    presets = env_presets(recipe.data.task, recipe.env.name) if recipe.env is not None else None
    return make_factory(recipe, presets)


def load_rows(task_name: str, source: DataSource):
    """Rows for a recipe's ``DataSource``: generated, or loaded and checked by the task."""
    task = get_task(task_name)
    if source.synthetic is not None:
        if not isinstance(task, Generates):
            raise UserError(f"task {task_name!r} has no generator; give `path:` instead of `synthetic:`")
        try:
            inspect.signature(task.generate).bind(source.synthetic, seed=source.seed, **source.generator)
        except TypeError as e:
            raise UserError(f"data.generator: {e} (task {task_name!r})") from None
        try:
            ds = task.generate(source.synthetic, seed=source.seed, **source.generator)
        except BadValue as e:  # a knob's value the generator refuses (its message names the knob and the choices)
            raise UserError(f"data.generator: {e} (task {task_name!r})") from None
    else:
        ds = task.load(source)
    return _limited(ds, source)


def _limited(ds, source: DataSource):
    if source.limit is not None and len(ds) > source.limit:
        ds = ds.select(range(source.limit))
    if len(ds) == 0:
        raise UserError(f"{source.path or 'synthetic'}: the dataset is empty")
    return ds


def task_rows(recipe: Recipe, kind: str, ds):
    """The task's ``{kind}_rows`` of ``ds`` (grpo, sft, eval), built with the recipe's prompt variant."""
    task = get_task(recipe.data.task)
    build = getattr(task, f"{kind}_rows", None)
    if build is None:
        raise UserError(f"task {recipe.data.task!r} has no {kind} rows")
    return build(ds, **prompt_args(task, recipe)) if isinstance(task, Prompted) else build(ds)


def prompt_args(task: ModuleType, recipe: Recipe) -> dict[str, Any]:
    """The row builders' prompt arguments: ``prompt`` (a name, or the system prompt's text) and ``shots`` if set."""
    shots = {"shots": recipe.data.shots} if recipe.data.shots is not None else {}
    return {"prompt": resolve_prompt(task, recipe.data.prompt), **shots}


def resolve_prompt(task: ModuleType, value: str) -> str:
    """``data.prompt``: a name in the task's ``PROMPTS`` stays a name; for tasks with ``CUSTOM_PROMPTS`` a
    file's contents or the text itself (anything with a space) is the system prompt."""
    prompts = task.PROMPTS if isinstance(task, Prompted) else {}
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
    hint = did_you_mean(value, prompts)
    name = task.__name__.rpartition(".")[2]
    raise UserError(f"data.prompt: task {name!r} has no prompt {value!r}{hint}; give one of {', '.join(prompts)}, "
                    "a prompt file, or the prompt text itself")


def success_rule(recipe: Recipe) -> Any:
    """``metrics -> bool`` for ``data.success`` (em | f1>=X | accuracy | task), default the task's rule."""
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


def load_preference_rows(task_name: str, source: DataSource):
    """Pairs for dpo/reward: a pairs file (``prompt``/``chosen``/``rejected``, any task), the task's own
    preference format, or the task's generator turned into pairs."""
    task = get_task(task_name)
    if not isinstance(task, Paired):
        raise UserError(f"task {task_name!r} has no preference pairs; use `task: preference` (prompt/chosen/"
                        "rejected files) or `task: hh_rlhf`")
    if source.synthetic is None and isinstance(task, FiledPairs):
        return _limited(task.load_preference(source), source)
    return task.preference_rows(load_rows(task_name, source))


def load_prompt_rows(recipe: Recipe, source: DataSource):
    """Prompts (and gold answers, where the task has them) for on-policy sampling: PPO, ``rlkit pairs``.

    Built with the recipe's ``data.prompt`` like its train and eval rows: samples drawn under another system
    prompt would teach the model answers to prompts it never sees.
    """
    task = get_task(recipe.data.task)
    if not isinstance(task, Sampled):
        raise UserError(f"task {recipe.data.task!r} has no prompts to sample from")
    ds = load_rows(recipe.data.task, source)
    if isinstance(task, Prompted):
        return task.prompt_rows(ds, **prompt_args(task, recipe))
    return task.prompt_rows(ds)
