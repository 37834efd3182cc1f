"""Loading a recipe: YAML -> ``--smoke`` substitutions -> ``--set`` overrides (so an explicit override wins
over smoke) -> schema -> the names it uses (task, prompt, environment, rewards) checked against their registries.

Nothing here imports torch, transformers or trl: eval, chat, index and the launcher's parent load recipes
without paying for them. The ``trainer:`` block is checked when ``rlkit train`` (or ``rlkit recipes validate``)
builds the TRL config from it (:func:`rlkit.trainers.trainer_config`).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rlkit.data import TASKS, Prompted, get_task, resolve_prompt
from rlkit.envs import ENVS, check_env_args
from rlkit.errors import UserError
from rlkit.recipe.schema import REWARD_FUNCTION_ALGORITHMS, RLKIT_OWNED_TRAINER_KEYS, Recipe
from rlkit.recipe.smoke import apply_smoke
from rlkit.registry import did_you_mean
from rlkit.rewards import resolve_reward
from rlkit.safety import load_yaml


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such recipe file (see `rlkit recipes list`)")
    try:
        data = load_yaml(path)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserError(f"{path}:{where} malformed YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a recipe is a YAML mapping (key: value), got {type(data).__name__}")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str], source: str = "--set") -> dict[str, Any]:
    """Apply ``a.b=c`` overrides; values are parsed as YAML scalars (``true``, ``5e-6``, ``[a, b]``)."""
    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{source} {item!r}: expected KEY=VALUE, e.g. --set trainer.learning_rate=1e-5")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            raise UserError(f"{source} {item!r}: the value is not valid YAML; quote it") from None
        value = _yaml_float(value)
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise UserError(f"{source} {item!r}: '{part}' is not a section, cannot set a key inside it")
            node = child
        node[parts[-1]] = value
    return data


def _yaml_float(value: Any) -> Any:
    # PyYAML (YAML 1.1) reads `5e-6` as a string; everyone means the number.
    if isinstance(value, str):
        try:
            return float(value) if any(c in value.lower() for c in "e.") and value[0] in "+-.0123456789" else value
        except ValueError:
            return value
    return value


def load_recipe(path: str | Path, overrides: list[str] | None = None, smoke: bool = False) -> Recipe:
    """Read, override and validate a recipe. Raises :class:`UserError` with a one-line message."""
    path = Path(path)
    data = read_yaml(path)
    smoke_changes: list[str] = []
    if smoke:
        data, smoke_changes = apply_smoke(data)
    data = apply_overrides(data, overrides or [])
    recipe = validate(data, source=str(path))
    recipe._smoke_changes = smoke_changes
    return recipe


def validate(data: dict[str, Any], source: str = "<recipe>") -> Recipe:
    data = {k: _floats_in(v) for k, v in data.items()}
    _check_finite(data, source)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as e:
        raise UserError(f"{source}: {_describe(e, data)}") from None
    if recipe.data.task not in TASKS:
        raise UserError(f"{source}: data.task: {TASKS.unknown(recipe.data.task)}")
    _check_task_prompt(recipe, source)
    _check_env(recipe, source)
    _check_backend(recipe, source)
    if recipe.algorithm in REWARD_FUNCTION_ALGORITHMS:
        for i, spec in enumerate(recipe.rewards):
            try:
                resolve_reward(spec.name, spec.args)
            except UserError as e:
                raise UserError(f"{source}: rewards.{i}: {e}") from None
    for key, why in RLKIT_OWNED_TRAINER_KEYS.items():
        if key in recipe.trainer:
            raise UserError(f"{source}: trainer.{key}: set by rlkit; {why}")
    return recipe


def _check_task_prompt(recipe: Recipe, source: str) -> None:
    task = get_task(recipe.data.task)
    columns = {**recipe.data.columns, **(recipe.data.train.columns or {}),
               **((recipe.data.eval.columns if recipe.data.eval else None) or {})}
    valid = getattr(task, "COLUMNS", ())
    for key in columns:
        if key not in valid:
            raise UserError(f"{source}: data.columns.{key}: " + (
                f"task {recipe.data.task!r} maps no columns" if not valid else
                f"not a column of task {recipe.data.task!r}{did_you_mean(key, valid)}; valid: {', '.join(valid)}"))
    prompts = task.PROMPTS if isinstance(task, Prompted) else {"default": None}
    if getattr(task, "CUSTOM_PROMPTS", False):
        try:
            resolve_prompt(task, recipe.data.prompt)
        except UserError as e:
            raise UserError(f"{source}: {e}") from None
    elif recipe.data.prompt not in prompts:
        raise UserError(f"{source}: data.prompt: task {recipe.data.task!r} has no prompt {recipe.data.prompt!r}"
                        f"{did_you_mean(recipe.data.prompt, prompts)}; valid: {', '.join(prompts)}")
    shots = getattr(task, "SHOTS", {}) if getattr(task, "CUSTOM_PROMPTS", False) else {}
    if recipe.data.shots is not None and recipe.data.shots not in shots:
        raise UserError(f"{source}: data.shots: " + (
            f"task {recipe.data.task!r} takes no worked turns" if not shots else
            f"no prompt variant {recipe.data.shots!r} with worked turns{did_you_mean(recipe.data.shots, shots)}; "
            f"valid: {', '.join(shots)}"))


def _check_env(recipe: Recipe, source: str) -> None:
    if recipe.env is None:
        if recipe.retrieval is not None:
            raise UserError(f"{source}: retrieval: is read by a tool environment; add `env: {{name: retrieval}}` "
                            "or remove it")
        return
    if recipe.algorithm not in ("grpo", "sft"):
        raise UserError(f"{source}: env: tool environments train with grpo (and sft recipes use them for eval); "
                        f"not {recipe.algorithm}")
    if recipe.env.name not in ENVS:
        raise UserError(f"{source}: env.name: {ENVS.unknown(recipe.env.name)}")
    if recipe.env.name == "retrieval" and recipe.retrieval is None:
        raise UserError(f"{source}: env retrieval needs a `retrieval:` section (corpus, chunking, top_k)")
    try:
        check_env_args(recipe.env.name, recipe.env.args)
    except UserError as e:
        raise UserError(f"{source}: {e}") from None


def _check_backend(recipe: Recipe, source: str) -> None:
    """Unsloth patches SFT, DPO and GRPO only: TRL's RewardTrainer and experimental PPOTrainer take plain
    transformers models (sequence-classification heads for reward and value)."""
    if recipe.algorithm in ("reward", "ppo") and recipe.model.backend == "unsloth":
        raise UserError(f"{source}: model.backend: unsloth does not support {recipe.algorithm} training; "
                        "use `backend: hf` or `auto`")


def _check_finite(value: Any, source: str, key: str = "") -> None:
    """A NaN or infinite number (`.inf`, `1e999`) anywhere in a recipe trains garbage: refuse it at load."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, source, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, source, f"{key}.{i}")
    elif isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{source}: {key}: {value} is not a finite number")


def _floats_in(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _floats_in(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats_in(v) for v in value]
    return _yaml_float(value)


def _describe(error: ValidationError, data: dict[str, Any]) -> str:
    err = error.errors()[0]
    loc = [str(p) for p in err["loc"]]
    key = ".".join(loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        valid = _valid_keys(loc[:-1])
        if len(loc) == 1 and loc[0] in RLKIT_OWNED_TRAINER_KEYS:  # e.g. output_dir: the run directory is a flag
            return f"{key}: unknown key; {RLKIT_OWNED_TRAINER_KEYS[loc[0]]}"
        return f"{key}: unknown key{did_you_mean(loc[-1], valid)}; valid keys here: {', '.join(sorted(valid))}"
    if err["type"] == "missing":
        return f"{key}: required key is missing"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
    return f"{key}: {msg}{shown}"


def _valid_keys(loc: list[str]) -> list[str]:
    model: type[BaseModel] | None = Recipe
    for part in loc:
        if model is None or part.isdigit():
            continue
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field else None
    return list(model.model_fields) if model else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found:
            return found
    return None
