"""rlkit: post-train language models with SFT and GRPO from one YAML recipe.

The Python API mirrors the CLI::

    from rlkit import load_recipe, train, evaluate
    run_dir = train("recipes/gsm8k_sft.yaml", smoke=True)
    results = evaluate(run_dir)

Imports are lazy so ``import rlkit`` (and ``rlkit --help``) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
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
