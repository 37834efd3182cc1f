"""The recipe as gepa sees it: a ``GEPAAdapter`` whose one text component is the system prompt.

``evaluate`` renders each row under the candidate system prompt exactly as the recipe's row builder does
(its worked turns kept), generates greedily with the recipe's model through rlkit's batched generation, and
scores the completions with the recipe's rewards (:class:`~rlkit.rewards.RewardSet`, TRL's calling convention):
a row's score is the weighted total. ``make_reflective_dataset`` shows the reflection model each row's question,
the completion, every reward's value and the gold answer: the facts the rewards saw, in words.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

COMPONENT = "system_prompt"


@dataclass
class Scored:
    """Every row of one pass: the completions, their weighted rewards (per reward too) and correctness."""

    completions: list[str]
    totals: list[float]
    per_reward: dict[str, list[float]]
    correct: list[float] | None  # the task's answer rule (what `rlkit eval` reports); None: no checkable answer
    questions: list[str] = field(default_factory=list)
    golds: list[Any] = field(default_factory=list)


class PromptAdapter:
    """gepa's adapter for a recipe without tools: rows are the train split's raw rows (dicts)."""

    propose_new_texts = None  # gepa's own proposer, with the reflection model

    def __init__(self, task: ModuleType, shots: str | None, lm: Any, tokenizer: Any, rewards: Any, *,
                 chat_template_kwargs: dict[str, Any], max_new_tokens: int, batch_size: int) -> None:
        self.task, self.shots, self.lm, self.tokenizer, self.rewards = task, shots, lm, tokenizer, rewards
        self.chat_template_kwargs = chat_template_kwargs
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self.rows_generated = 0
        self.seconds = 0.0

    def rows(self, raw: list[dict[str, Any]], system: str) -> Any:
        """The rows as the recipe builds them with ``data.prompt`` = ``system`` (and ``data.shots``)."""
        import datasets

        shots = {"shots": self.shots} if self.shots is not None else {}
        return self.task.grpo_rows(datasets.Dataset.from_list(raw), prompt=system, **shots)

    def run(self, raw: list[dict[str, Any]], system: str) -> Scored:
        """Generate for ``raw`` under ``system`` and score every completion."""
        from rlkit.inference.generate import generate

        rows = self.rows(raw, system)
        prompts = list(rows["prompt"])
        started = time.perf_counter()
        texts = generate(self.lm, self.tokenizer, prompts, self.chat_template_kwargs,
                         max_new_tokens=self.max_new_tokens, batch_size=self.batch_size, show_progress=False)
        self.seconds += time.perf_counter() - started
        self.rows_generated += len(texts)
        # Conversational completions, as TRL hands them to the rewards for conversational prompts.
        completions = [[{"role": "assistant", "content": t}] for t in texts]
        columns = {c: list(rows[c]) for c in rows.column_names if c != "prompt"}
        totals, per_reward = self.rewards(prompts, completions, **columns)
        score = getattr(self.task, "score", None)
        correct = [float(c) for c in score(texts, rows)] if score is not None else None
        return Scored(texts, totals, per_reward, correct, questions=[p[-1]["content"] for p in prompts],
                      golds=columns.get("answer", [None] * len(texts)))

    # gepa's GEPAAdapter protocol -------------------------------------------------------------------------------

    def evaluate(self, batch: list[dict[str, Any]], candidate: dict[str, str], capture_traces: bool = False) -> Any:
        from gepa import EvaluationBatch

        scored = self.run(batch, candidate[COMPONENT])
        traces = None
        if capture_traces:
            traces = [{"question": q, "completion": c, "total": t, "gold": g,
                       "rewards": {name: values[i] for name, values in scored.per_reward.items()}}
                      for i, (q, c, t, g) in enumerate(zip(scored.questions, scored.completions, scored.totals,
                                                           scored.golds, strict=True))]
        return EvaluationBatch(outputs=scored.completions, scores=scored.totals, trajectories=traces)

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: Any,
                                components_to_update: list[str]) -> dict[str, list[dict[str, Any]]]:
        records = [{"Inputs": t["question"], "Generated Outputs": t["completion"], "Feedback": feedback(t)}
                   for t in eval_batch.trajectories]
        return {name: records for name in components_to_update}


def feedback(trace: dict[str, Any]) -> str:
    """What the rewards said about one completion, in words.

    >>> feedback({"total": 0.1, "rewards": {"gsm8k_correct": 0.0, "answer_format": 1.0}, "gold": "7"})
    'Reward 0.1 in all (gsm8k_correct 0, answer_format 1). The correct answer is 7.'
    """
    parts = ", ".join(f"{name} {value:g}" for name, value in trace["rewards"].items())
    gold = f" The correct answer is {trace['gold']}." if trace.get("gold") not in (None, "", []) else ""
    return f"Reward {trace['total']:g} in all ({parts}).{gold}"
