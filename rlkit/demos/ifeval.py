"""The general-ability check every demo ends with: IFEval on a fixed subset, the base model and each trained stage
(``rlkit eval --ifeval``'s code, :mod:`rlkit.evaluate.ifeval`), so each demo shows what its training cost in
instruction following, and flags a drop in prompt-strict accuracy beyond the recipe's ``eval.ifeval.tolerance``.

The subset is the first :data:`LIMIT` prompts of IFEval's file, replies capped at :data:`MAX_NEW_TOKENS` new tokens
(greedy), the same for every demo and every stage: one batch of 256 decoding steps per model, 126 s user + 167 s
system CPU for SmolLM2 in one thread (docs/ifeval.md has the measurements). A prompt that asks for 300+ words
cannot be followed in 256 tokens by any model: the cap lowers every stage alike, and the comparison is paired.
The prompts come from a data folder or the Hub (:func:`rlkit.data.sources.public_sets`, which says when there are
none); without them the check is skipped.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

LIMIT = 50
MAX_NEW_TOKENS = 256
BATCH_SIZE = 50  # one batch: IFEval's prompts are short (at most ~100 tokens of the first 50), whatever the recipe's


def ifeval_check(stages: Any, recipe: Path, overrides: list[str], models: list[tuple[str, str | None]], out: Path,
                 *, prompts: Path | None, limit: int | None = None, fresh: bool = False) -> dict[str, Any] | None:
    """IFEval on each ``(stage name, model)`` (None: the recipe's base model) as one timed stage, written to ``out``
    (a run's ``eval/ifeval``, so its report.md shows it); its table closes the demo and ``demo.json`` holds its
    summary under ``ifeval``. ``prompts``: IFEval's file or its folder (None: skipped). ``limit`` (a demo's quick
    check) and ``overrides`` (``eval.ifeval.*``) win over :data:`LIMIT` and :data:`MAX_NEW_TOKENS`. ``fresh``: in a
    fresh process (:meth:`Stages.run_fresh`)."""
    from rlkit.evaluate.ifeval import compare_models
    from rlkit.evaluate.show import ifeval_table

    if prompts is None:
        return None
    settings = [f"eval.ifeval.limit={limit or LIMIT}", f"eval.ifeval.max_new_tokens={MAX_NEW_TOKENS}",
                f"eval.batch_size={BATCH_SIZE}", *overrides]
    stages.console.rule(f"IFEval: instruction following, {' -> '.join(name for name, _ in models)}")
    roles = [name for name, _ in models]
    # what GRPO cost against the SFT it started from, and against the same minutes of SFT (the control)
    stages_ = [(role, against) for role, against in (("GRPO", "SFT"), ("GRPO", "SFT continued"))
               if {role, against} <= set(roles)]
    check = partial(compare_models, [(name, recipe, model) for name, model in models], prompts, out,
                    overrides=settings, show_progress=False, stages=stages_ or None)
    summary = stages.run_fresh("IFEval check", check) if fresh else stages.run("IFEval check", check)
    stages.extra["ifeval"] = summary
    stages.tables.append(ifeval_table(summary, title=f"general ability: IFEval, first {summary['rows'][0]['n']} "
                                                     f"prompts, up to {summary['max_new_tokens']} new tokens, greedy "
                                                     "(accuracy [95% interval])"))
    return summary
