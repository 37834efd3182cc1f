"""TRL's config, with TRL's defaults, whichever backend is loaded.

Importing Unsloth replaces ``trl.GRPOConfig`` (and SFT/DPO...) with generated subclasses whose
``__init__`` has other defaults: learning rate 5e-5, weight decay 0.001, warm-up 0.1, seed 3407,
``adamw_8bit``, no vLLM importance-sampling correction, and more (unsloth/models/rl.py, ``replacements``).
GRPO's ``loss_type``/``beta`` default to ``None`` there and resolve to TRL's ``dapo``/``0.0``, but an
*explicit* ``dapo`` is read as "the user asked for DAPO" and sets ``epsilon_high=0.28`` (unsloth 2026.10.9,
rl.py:3525 and :3559-3565); TRL leaves ``epsilon_high=None`` and clips at ``epsilon``
(trl/trainer/grpo_trainer.py:934). So a field TRL resolves from another at training time is passed
resolved (``epsilon_high = epsilon``). A recipe validated on a CPU machine (plain TRL) would
train differently on a GPU for every field it leaves unset. So for a replaced class rlkit passes every
field the recipe leaves unset at TRL's own default, then compares what the backend's class made of
the settings with what TRL's class makes of them: a changed batch shape is an error (the run would not
be the experiment the recipe describes), any other change is logged, and the exact config is recorded
in the run directory (``trainer_config.json``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from rlkit.errors import UserError

log = logging.getLogger("rlkit")

# Fields that set how many samples a step sees: a backend changing one silently changes the experiment.
BATCH_FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                "generation_batch_size", "steps_per_generation", "num_train_epochs", "max_steps")


# Fields whose value changes how, not what, is computed: the backend keeps its own choice. (SFT's
# "chunked_nll" is "nll" computed in chunks, which would bypass Unsloth's fused loss kernel.)
IMPLEMENTATION_FIELDS = {"dataset_num_proc", "torch_empty_cache_steps", "dataloader_pin_memory",
                         "logging_nan_inf_filter", "include_tokens_per_second"}
_IMPLEMENTATION_BY_CLASS = {"SFTConfig": {"loss_type"}}


# Fields TRL leaves None and resolves from another field when training: a backend may fill the None.
RESOLVED_FROM = {"epsilon_high": "epsilon"}  # trl/trainer/grpo_trainer.py:934 (TRL 1.12.0)


def implementation_fields(cls: type) -> set[str]:
    return IMPLEMENTATION_FIELDS | _IMPLEMENTATION_BY_CLASS.get(trl_class(cls).__name__, set())


def trl_class(cls: type) -> type:
    """TRL's own config class behind ``cls`` (``cls`` itself unless a backend replaced it)."""
    for klass in cls.__mro__:
        if klass.__module__.startswith("trl.") and dataclasses.is_dataclass(klass):
            return klass
    return cls


def trl_defaults(cls: type) -> dict[str, Any]:
    """Every init field of TRL's class behind ``cls`` at TRL's default (``output_dir`` aside)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(trl_class(cls)):
        if not f.init or f.name == "output_dir":
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def with_trl_defaults(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` plus TRL's default for every field left unset, when ``cls`` is not TRL's own class."""
    if trl_class(cls) is cls:
        return kwargs
    skip = implementation_fields(cls)
    defaults = {k: v for k, v in trl_defaults(cls).items() if k not in skip}
    out = {**defaults, **kwargs}
    for field, source in RESOLVED_FROM.items():
        if field in defaults and out.get(field) is None and source in out:
            out[field] = out[source]
    return out


def backend_changes(config: Any, kwargs: dict[str, Any], backend: str = "current") -> dict[str, tuple[Any, Any]]:
    """``{field: (TRL's value, the backend's value)}`` where ``config`` (built from ``kwargs`` by a
    backend's class) differs from what TRL's own class builds from the same ``kwargs``.

    Settings TRL's class rejects are a UserError: the backend's class accepted them only by changing them
    (Unsloth resets a batch that ``num_generations`` does not divide to ``num_generations``).
    """
    cls = type(config)
    base = trl_class(cls)
    if base is cls:
        return {}
    try:
        reference = base(**kwargs).to_dict()
    except (ValueError, TypeError) as e:
        raise UserError(f"trainer: {base.__name__} rejects these settings ({str(e).splitlines()[0]}); the {backend} "
                        "backend would silently train with others instead") from None
    ours = config.to_dict()
    skip = implementation_fields(cls)
    return {k: (v, ours.get(k)) for k, v in reference.items() if ours.get(k) != v and k not in skip}


def check_backend_changes(config: Any, kwargs: dict[str, Any], backend: str) -> None:
    """Refuse a changed batch shape, log any other change the backend's config class made."""
    changes = backend_changes(config, kwargs, backend)
    shape = {k: v for k, v in changes.items() if k in BATCH_FIELDS}
    if shape:
        said = "; ".join(f"trainer.{k}: {a!r} -> {b!r}" for k, (a, b) in shape.items())
        raise UserError(f"the {backend} backend changes the batch shape of this recipe ({said}); set values it "
                        "keeps (e.g. per_device_train_batch_size x gradient_accumulation_steps a multiple of "
                        "num_generations)")
    for k, (a, b) in changes.items():
        log.warning("the %s backend sets trainer.%s to %r (TRL: %r); set it in the recipe to choose",
                    backend, k, b, a)
