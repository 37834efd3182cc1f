"""``init_from``: continue training a saved adapter (SFT -> DPO/PPO/GRPO), checked before any model loads.

The adapter keeps its own LoRA settings, so a recipe that says something else would be silently
ignored; rlkit compares the two and stops with every difference on one line instead. A different
base model is refused too: the adapter's deltas only mean something on the weights it was trained
against. Training on a 16-bit base from an adapter trained in 4-bit (or the reverse) is allowed and
logged, because that is sometimes what one wants.

Where the adapter came from is read from its run directory (``RUN/recipe.resolved.yaml``) when there
is one, otherwise from ``adapter_config.json``.
"""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING, Any

from rlkit.errors import UserError

if TYPE_CHECKING:
    from rlkit.recipe.schema import Recipe

log = logging.getLogger("rlkit")
_TASK_TYPES = {"causal": "CAUSAL_LM", "score": "SEQ_CLS"}


def check(recipe: Recipe, *, head: str = "causal") -> dict[str, Any]:
    """Compare ``recipe.init_from`` with the recipe; returns the provenance of the starting adapter."""
    from rlkit import runs
    from rlkit.runs import adapter_dir

    directory = adapter_dir(recipe.init_from)
    saved = json.loads((directory / "adapter_config.json").read_text())
    run_dir = directory.parent if runs.is_run_dir(directory.parent) else None
    source = runs.read_resolved(run_dir) if run_dir else None
    where = f"init_from {recipe.init_from}"

    task_type = saved.get("task_type")
    if task_type and task_type != _TASK_TYPES[head]:
        kind = "a reward/value (sequence-classification)" if task_type == "SEQ_CLS" else "a causal-LM"
        raise UserError(f"{where}: this is {kind} adapter ({task_type}); a {recipe.algorithm} recipe needs "
                        f"{_TASK_TYPES[head]}")
    problems = _base_differences(recipe, saved, source) + _lora_differences(recipe, saved, source)
    if problems:
        raise UserError(f"{where}: the adapter does not match this recipe: {'; '.join(problems)}. "
                        "Make the recipe match the adapter, or drop init_from to start a new one")
    trained_4bit = (source or {}).get("model", {}).get("load_in_4bit")
    if trained_4bit is not None and trained_4bit != recipe.model.load_in_4bit:
        log.warning("%s: the adapter was trained on a %s base and continues on a %s one", where,
                    "4-bit" if trained_4bit else "16-bit", "4-bit" if recipe.model.load_in_4bit else "16-bit")
    return {
        "adapter": str(directory.resolve()),
        "run_dir": str(run_dir.resolve()) if run_dir else None,
        "algorithm": (source or {}).get("algorithm"),
        "base_model": _trained_base(saved, source),
        "trained_in_4bit": trained_4bit,
    }


def _trained_base(saved: dict[str, Any], source: dict[str, Any] | None) -> str | None:
    if source:
        return source.get("model", {}).get("name_or_path")
    return saved.get("base_model_name_or_path")


def _base_differences(recipe: Recipe, saved: dict[str, Any], source: dict[str, Any] | None) -> list[str]:
    trained = _trained_base(saved, source)
    if trained is None:
        return []
    if source:  # both are recipe names: compare them as written
        same = trained == recipe.model.name_or_path
    else:  # a bare adapter records the path it loaded; Unsloth may have swapped in its 4-bit repo
        from rlkit.tiny import resolve_model_id

        same = _model_key(trained) == _model_key(resolve_model_id(recipe.model.name_or_path))
    return [] if same else [f"it was trained on {trained!r} and model.name_or_path is {recipe.model.name_or_path!r}"]


def _model_key(name: str) -> str:
    last = name.rstrip("/").rsplit("/", 1)[-1].lower()
    return re.sub(r"(-unsloth)?(-bnb)?-4bit$|-unsloth$", "", last)


def _lora_differences(recipe: Recipe, saved: dict[str, Any], source: dict[str, Any] | None) -> list[str]:
    lora = recipe.lora
    if lora is None:  # the recipe defers to the adapter
        return []
    wanted = {"r": saved.get("r"), "alpha": saved.get("lora_alpha")}
    if source and source.get("lora"):
        wanted["target_modules"] = source["lora"].get("target_modules")
        wanted["modules_to_save"] = source["lora"].get("modules_to_save")
    elif isinstance(lora.target_modules, list):
        wanted["target_modules"] = saved.get("target_modules")
    out = []
    for key, trained in wanted.items():
        mine = getattr(lora, key)
        if trained is None and key != "modules_to_save":
            continue
        if _normal(mine) != _normal(trained):
            out.append(f"lora.{key} is {mine!r} but the adapter has {trained!r}")
    return out


def _normal(value: Any) -> Any:
    if isinstance(value, list | tuple | set):
        return sorted(value) or None
    return value
