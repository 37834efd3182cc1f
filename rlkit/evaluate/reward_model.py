"""``rlkit eval`` of a reward recipe: pairwise accuracy on its eval pairs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.errors import UserError
from rlkit.evaluate.results import default_out, write_results

if TYPE_CHECKING:
    from rlkit.recipe import Recipe


def evaluate_reward_model(recipe: Recipe, run_dir: Path | None, model: str | None, *, limit: int | None,
                          out: str | Path | None, show_progress: bool = True) -> dict[str, Any]:
    """Pairwise accuracy of a reward model: the share of eval pairs where chosen outscores rejected."""
    import torch

    from rlkit import progress
    from rlkit.data import load_preference_rows
    from rlkit.trainers.reward import load_score_model

    target = model or run_dir
    if target is None:
        raise UserError("a reward recipe's base model has an untrained score head; evaluate a reward run directory "
                        "(rlkit eval RUN_DIR) or pass --model")
    source = recipe.data.eval.model_copy(update={"limit": limit}) if limit else recipe.data.eval
    rows = load_preference_rows(recipe.data.task, source)
    scorer, tokenizer = load_score_model(recipe, target)
    scorer.eval()
    kwargs = recipe.model.chat_template_kwargs

    def text(prompt: Any, answer: Any) -> str:
        if isinstance(prompt, list):
            return tokenizer.apply_chat_template(prompt + answer, tokenize=False, **kwargs)
        return prompt + answer

    started = time.time()
    scores: dict[str, list[float]] = {"chosen": [], "rejected": []}
    size = recipe.eval.batch_size
    with progress.bar("scoring pairs", len(rows), show=show_progress) as advance, torch.inference_mode():
        for i in range(0, len(rows), size):
            batch = rows.select(range(i, min(i + size, len(rows))))
            for side in scores:
                texts = [text(p, a) for p, a in zip(batch["prompt"], batch[side], strict=True)]
                enc = tokenizer(texts, return_tensors="pt", padding=True, truncation=True,
                                max_length=recipe.model.max_seq_length, add_special_tokens=False)
                scores[side].extend(scorer(**enc.to(scorer.device)).logits[:, 0].float().tolist())
            advance(len(batch))
    wins = [c > r for c, r in zip(scores["chosen"], scores["rejected"], strict=True)]
    margins = [c - r for c, r in zip(scores["chosen"], scores["rejected"], strict=True)]
    label = str(target)
    results = {
        "recipe": recipe.name, "model": label, "task": recipe.data.task, "n": len(wins), "metric": "pairwise accuracy",
        "accuracy": sum(wins) / len(wins), "mean_margin": sum(margins) / len(margins),
        "seconds": round(time.time() - started, 2),
        "examples": [{"chosen_score": c, "rejected_score": r, "correct": w}
                     for c, r, w in zip(scores["chosen"], scores["rejected"], wins, strict=True)],
    }
    return write_results(results, Path(out) if out else default_out(recipe.name, run_dir, label))
