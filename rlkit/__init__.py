"""rlkit: post-train language models with SFT, DPO, reward modelling, PPO and GRPO from one YAML recipe.

What it does: loads a recipe (``rlkit.recipe``), picks a backend (transformers + PEFT + bitsandbytes,
or Unsloth on a GPU) and hands the model, the task's data, the rewards and, for agents, a multi-turn
tool environment (calculator, retrieval search) to the TRL trainer (``rlkit.trainers``); the run
directory it writes (``rlkit.runs``) is what ``rlkit eval``, ``rollout``, ``analyze``, ``report``,
``chat``, ``pairs`` and ``merge`` read. ``rlkit doctor`` checks a recipe before the GPU-hours are spent.
Two models are built in for CPU work: a tiny random Qwen3 (tests) and SmolLM2-135M-Instruct (demo).

The Python API mirrors the CLI::

    from rlkit import load_recipe, train, evaluate
    run_dir = train("recipes/gsm8k_sft.yaml", smoke=True)
    results = evaluate(run_dir)

Imports are lazy so ``import rlkit`` (and ``rlkit --help``) stays cheap. The layering of the
subpackages is in ``pyproject.toml`` (``[tool.importlinter]``) and the README's Architecture section.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"
__all__ = ["load_recipe", "train", "evaluate", "UserError"]

if TYPE_CHECKING:
    from rlkit.errors import UserError
    from rlkit.evaluate import evaluate
    from rlkit.recipe import load_recipe
    from rlkit.train import train

_LAZY = {"load_recipe": "rlkit.recipe", "train": "rlkit.train", "evaluate": "rlkit.evaluate",
         "UserError": "rlkit.errors"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rlkit' has no attribute {name!r}")
