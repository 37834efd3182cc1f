"""The recipe's ``trainer:`` block -> the TRL config of its algorithm, built once per ``rlkit train``.

The block uses TRL's field names verbatim and is validated by building the TRL config class itself:
rlkit never re-declares TRL's fields. rlkit adds what it decides (the builder's ``rlkit_fields``) and
what depends on the machine (:func:`device_defaults`). trl is imported only here, inside functions,
so that a chosen Unsloth is imported before it (:func:`rlkit.backends.choose`).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError

from rlkit.backends import cuda_available
from rlkit.backends.trl_config import check_backend_changes, with_trl_defaults
from rlkit.errors import UserError
from rlkit.recipe import Recipe
from rlkit.registry import did_you_mean
from rlkit.tracking import check as check_trackers
from rlkit.trainers.builders import BUILDERS

if TYPE_CHECKING:
    from transformers import TrainingArguments


# Where a config built only to check the recipe says it would write (nothing is written there).
CHECK_DIR = "/tmp/rlkit-validate"


def config_class(algorithm: str) -> type[TrainingArguments]:
    """The TRL config class of ``algorithm`` (the one a backend such as Unsloth replaced, once it is imported)."""
    return BUILDERS.get(algorithm).config_class()


def check_trainer(recipe: Recipe, source: str = "<recipe>") -> TrainingArguments:
    """Build the recipe's TRL config only to check it (``rlkit recipes validate``, the launcher's parent)."""
    return trainer_config(recipe, output_dir=CHECK_DIR, source=source)


def trainer_config(recipe: Recipe, output_dir: str, source: str = "<recipe>",
                   backend: str | None = None) -> TrainingArguments:
    """Build the TRL config for ``recipe``: its ``trainer:`` block plus the fields rlkit decides.

    Device-dependent defaults are filled for this machine (see :func:`device_defaults`), so a GPU
    recipe validates on a laptop without a GPU. Where a backend replaced TRL's config class (Unsloth),
    unset fields keep TRL's defaults and ``backend`` names it in the check of what it changed
    (:mod:`rlkit.backends.trl_config`).
    """
    algo = BUILDERS.get(recipe.algorithm)
    try:
        cls = algo.config_class()
    except UserError as e:  # this TRL lacks the trainer (PPO on TRL >= 1.13): name the recipe, as `validate` lists many
        raise UserError(f"{source}: {e}") from None
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in recipe.trainer.items():
        if key not in fields:
            raise UserError(f"{source}: trainer.{key}: not a {cls.__name__} field{did_you_mean(key, fields)}")
        kwargs[key] = _coerce(cls, key, value, source)
    kwargs.update(device_defaults(recipe))
    kwargs.update(algo.rlkit_fields(recipe))
    kwargs = with_trl_defaults(cls, kwargs)
    try:
        config = cls(output_dir=output_dir, **kwargs)
    except (ValueError, TypeError) as e:
        raise UserError(f"{source}: trainer: {cls.__name__} rejected the settings: {str(e).splitlines()[0]}") from None
    check_backend_changes(config, {"output_dir": output_dir, **kwargs}, backend or "current")
    algo.check_config(config, source)  # what the trainer, not the config class, would reject
    check_trackers(config.report_to or [], source)
    return config


def _coerce(cls: type, key: str, value: Any, source: str) -> Any:
    try:
        annotation = typing.get_type_hints(cls)[key]
    except Exception:  # an annotation TRL's module cannot resolve at runtime: let TRL judge the value
        return value
    try:
        return TypeAdapter(annotation).validate_python(value)
    except ValidationError as e:
        msg = e.errors()[0]["msg"]
        raise UserError(f"{source}: trainer.{key}: {msg} (got {value!r})") from None
    except Exception:  # pydantic cannot build a validator for this annotation: let TRL judge it
        return value


def device_defaults(recipe: Recipe, cuda: bool | None = None, bf16_supported: bool | None = None) -> dict[str, Any]:
    """Fields that depend on the machine: TRL defaults to bf16, which a CPU-only machine and pre-Ampere
    GPUs (T4, V100) lack; there TRL's config raises, so rlkit trains in fp16 mixed precision instead."""
    if cuda is None:
        cuda = cuda_available()
    if not cuda:
        out: dict[str, Any] = {"use_cpu": True}
        if "bf16" not in recipe.trainer:
            out["bf16"] = False
        return out
    if bf16_supported is None:
        import torch

        bf16_supported = torch.cuda.is_bf16_supported()
    if bf16_supported or "bf16" in recipe.trainer:
        return {}
    return {"bf16": False, **({} if "fp16" in recipe.trainer else {"fp16": True})}
