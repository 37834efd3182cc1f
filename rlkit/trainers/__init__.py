"""One builder per algorithm: recipe + loaded model -> a ready TRL trainer. No training loops here."""

from __future__ import annotations

import importlib

BUILDERS = {"sft": "rlkit.trainers.sft", "grpo": "rlkit.trainers.grpo"}


def builder(algorithm: str):
    return importlib.import_module(BUILDERS[algorithm])
