"""The offline demos, one small module each, behind ``rlkit demo`` / ``make demo*``: ``arith`` (SmolLM2 with
GRPO on arithmetic, ``make demo``), ``calc`` (the calculator agent, ``make demo-calc``), ``tiny`` (the random tiny
Qwen3, ``make demo-tiny``), and ``stages`` (the checks and stage timer they share).

Nothing in the library imports this package; the import-linter layers in ``pyproject.toml`` put it right under
the CLI, so they say so.
"""
