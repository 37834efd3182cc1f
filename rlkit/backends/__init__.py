"""Model + tokenizer loading. ``auto`` picks Unsloth on a CUDA machine where it imports, else hf.

The choice is made once per process (:func:`choose`), logged, and never changed silently: asking
for ``unsloth`` where it cannot run is an error. Choosing Unsloth imports it right away, because it
must be imported before trl/transformers/peft to patch them (the one documented import-order rule).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any

from rlkit import compat
from rlkit.cache import cache_dir
from rlkit.errors import UserError
from rlkit.recipe import Recipe

log = logging.getLogger("rlkit")
_chosen: dict[str, str] = {}


def choose(requested: str, *, cuda: bool | None = None) -> str:
    """Resolve ``auto|unsloth|hf`` to the backend this machine will use.

    Only commands that train call this (Unsloth patches trl for training, and importing it costs
    seconds and can fail): eval, chat, rollouts, index and validate load with hf and never import it.
    An Unsloth that fails to import makes ``auto`` use hf, with the reason in the log.
    """
    if requested in _chosen:
        return _chosen[requested]
    if cuda is None:
        cuda = cuda_available()
    has_unsloth = importlib.util.find_spec("unsloth") is not None
    if requested == "unsloth":
        if not cuda:
            raise UserError("model.backend: unsloth needs a CUDA GPU and this machine has none; "
                            "use `backend: hf` (or `auto`) to run on CPU")
        if not has_unsloth:
            raise UserError("model.backend: unsloth is not installed; `pip install 'rlkit[gpu]'` "
                            "or use `backend: hf`")
        name = "unsloth"
    elif requested == "auto":
        name = "unsloth" if cuda and has_unsloth else "hf"
        why = ("CUDA and unsloth available" if name == "unsloth"
               else "no CUDA GPU" if not cuda else "unsloth not installed")
        log.info("backend auto -> %s (%s)", name, why)
    else:
        name = requested
    if name == "unsloth":
        prepare_unsloth_env()
        try:
            from rlkit.backends import unsloth as _  # noqa: F401  (imports unsloth before trl & co.)
        except (ImportError, NotImplementedError) as e:
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if requested == "unsloth":
                raise UserError(f"model.backend: unsloth fails to import ({why}); fix the install or use "
                                "`backend: hf`") from None
            log.warning("backend auto -> hf (unsloth fails to import: %s)", why)
            name = "hf"
    _chosen[requested] = name
    return name


def prepare_unsloth_env() -> None:
    """Settings Unsloth reads at import time.

    Unsloth writes the trainer code it generates into ``./unsloth_compiled_cache`` of whatever directory
    the command runs in (and imports it from there): keep it in rlkit's cache instead. A location the
    user set wins.
    """
    compat.keep_unsloth_compiled_cache_in(cache_dir() / "unsloth_compiled_cache")


# vLLM's switch for FlashInfer's top-k/top-p sampler (vllm/envs.py, 0.26-0.31: on unless set to 0).
FLASHINFER_SAMPLER = "VLLM_USE_FLASHINFER_SAMPLER"


def prepare_vllm_env() -> None:
    """Settings vLLM reads when it builds an engine (TRL's colocated one, Unsloth's, rlkit's eval and rollouts).

    On CUDA, vLLM samples with FlashInfer unless ``VLLM_USE_FLASHINFER_SAMPLER=0``, and to check the GPU it imports
    ``vllm.v1.attention.backends.flashinfer``, which imports ``flashinfer`` (vllm/v1/sample/ops/topk_topp_sampler.py,
    0.26.0): without the ``flashinfer-python`` package (a vLLM carried without it, bench/gpu_carry.py) the engine
    fails to start. There rlkit switches that sampler off (vLLM then samples with its own PyTorch/Triton code;
    greedy decoding is unchanged) and says so once. A value the user set wins.
    """
    if FLASHINFER_SAMPLER in os.environ or importlib.util.find_spec("flashinfer") is not None:
        return
    os.environ[FLASHINFER_SAMPLER] = "0"  # set once: a later call finds it and says nothing
    log.info("vLLM: flashinfer is not installed, so %s=0 (vLLM's own sampler instead of FlashInfer's)",
             FLASHINFER_SAMPLER)


def backend_request(recipe: Recipe) -> str:
    """The backend to ask :func:`choose` for: the recipe's, except that reward and PPO runs always use hf.

    Unsloth patches SFT, DPO and GRPO; TRL's RewardTrainer and experimental PPOTrainer take plain
    transformers models (sequence-classification heads for reward and value), so ``auto`` means hf there
    (and loading refused ``unsloth``).
    """
    if recipe.algorithm in ("reward", "ppo"):
        return "hf"
    if recipe.vllm_server_mode and recipe.model.backend == "auto":
        return "hf"  # Unsloth generates with its own colocated engine, never a vLLM server
    return recipe.model.backend


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def load(recipe: Recipe, *, use_vllm: bool = False, seed: int = 0, head: str = "causal") -> tuple[Any, Any, Any, str]:
    """Load the recipe's model for training: ``(model, tokenizer, peft_config_or_None, backend)``.

    On hf the LoRA is added by TRL from ``peft_config``; on Unsloth the model comes back already
    wrapped (Unsloth's own ``get_peft_model``), so ``peft_config`` is None. With ``init_from`` the
    saved adapter comes back loaded and trainable (after :func:`rlkit.handoff.check` has compared it
    with the recipe), and ``peft_config`` is None.
    """
    backend = choose(backend_request(recipe))
    if use_vllm:
        prepare_vllm_env()
    if backend == "unsloth":
        from rlkit.backends import unsloth

        # Unsloth's fast_inference is its colocated vLLM engine; TRL's server mode needs none here.
        colocated = use_vllm and recipe.trainer.get("vllm_mode", "colocate") == "colocate"
        model, tokenizer = unsloth.load(recipe.model, recipe.lora, recipe.init_from,
                                        fast_inference=colocated, seed=seed)
        return model, tokenizer, None, backend
    from rlkit.backends import hf

    model, tokenizer = hf.load(recipe.model, head=head, training=True)
    if recipe.init_from:
        return hf.attach_adapter(model, recipe.init_from, trainable=True), tokenizer, None, backend
    return model, tokenizer, hf.lora_config(recipe.lora, head=head), backend
