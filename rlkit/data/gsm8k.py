"""GSM8K: grade-school math word problems, gold answer after ``####``.

Rows have ``question`` and ``answer`` (a full solution ending in ``#### N``). The model is asked
to reason, then end with GSM8K's own final-answer line ``#### N``; ``rlkit.rewards.math`` reads it.
``generate`` makes GSM8K-format arithmetic word problems for smoke runs and the offline demo.
"""

from __future__ import annotations

import random
import re
from typing import Any

SYSTEM_PROMPT = (
    "You are a careful math tutor. Reason step by step, then give the final answer "
    "on the last line in the form `#### <number>`."
)
# Prompt variants (`data.prompt` in a recipe). `calculator` goes with `env: {name: calculator}`.
PROMPTS = {
    "default": SYSTEM_PROMPT,
    "calculator": (
        "You are a careful math tutor with a `calculate` tool for arithmetic. Reason step by step and call the "
        "tool for any calculation you are not sure of, then give the final answer on the last line in the form "
        "`#### <number>`."
    ),
    # For thinking mode (`enable_thinking: true`): the reasoning goes in the think block, kept short.
    "thinking": (
        "You are a careful math tutor. Think briefly: a few short steps are enough. Then give the final answer "
        "on the last line in the form `#### <number>`."
    ),
}
_CALC_ANNOTATION = re.compile(r"<<[^<>]*>>")


def load(source: Any):
    from rlkit.data.sources import load_source

    return load_source(source, required=("question", "answer"))


def chat_prompt(question: str, variant: str = "default") -> list[dict[str, str]]:
    return [{"role": "system", "content": PROMPTS[variant]}, {"role": "user", "content": question.strip()}]


def solution_text(answer: str) -> str:
    """A GSM8K solution as the assistant should write it: calculator annotations removed."""
    return _CALC_ANNOTATION.sub("", answer).strip()


def gold(answer: str) -> str:
    from rlkit.rewards.math import gold_answer

    return gold_answer(answer) or ""


def sft_rows(ds, prompt: str = "default"):
    """Conversational prompt/completion rows: TRL computes the loss on the completion only."""
    return ds.map(
        lambda row: {
            "prompt": chat_prompt(row["question"], prompt),
            "completion": [{"role": "assistant", "content": solution_text(row["answer"])}],
        },
        remove_columns=ds.column_names,
    )


def grpo_rows(ds, prompt: str = "default"):
    """Conversational prompts plus the gold number in ``answer`` (passed to the rewards by TRL)."""
    return ds.map(
        lambda row: {"prompt": chat_prompt(row["question"], prompt), "answer": gold(row["answer"])},
        remove_columns=ds.column_names,
    )


eval_rows = grpo_rows
prompt_rows = grpo_rows  # PPO and `rlkit pairs` sample from these prompts and score against `answer`


def load_preference(source: Any):
    """A GSM8K dpo recipe trains on pairs sampled from the model (``rlkit pairs``), not on GSM8K rows."""
    from rlkit.data.preference import load as load_pairs

    return load_pairs(source)


def preference_rows(ds):
    """Pairs from GSM8K rows: the reference solution (chosen) vs the same steps with a wrong final answer.

    Real GSM8K DPO trains on pairs the model sampled itself (``rlkit pairs``); these exist so a dpo
    recipe has generated data for ``--smoke``.
    """
    from rlkit.data.preference import normalize

    def pair(row: dict[str, Any]) -> dict[str, Any]:
        right = solution_text(row["answer"])
        head, _, number = right.rpartition("####")
        wrong = f"{head}#### {_off_by_one(number.strip())}"
        return {"prompt": chat_prompt(row["question"]), "chosen": [{"role": "assistant", "content": right}],
                "rejected": [{"role": "assistant", "content": wrong}]}

    return normalize(ds.map(pair, remove_columns=ds.column_names), "gsm8k pairs")


def _off_by_one(number: str) -> str:
    try:
        return str(int(number.replace(",", "")) + 1)
    except ValueError:
        return number + "1"


def score(completions: list[str], rows) -> list[float]:
    from rlkit.rewards.math import gsm8k_correct

    return gsm8k_correct(completions, answer=list(rows["answer"]))


def episode_metrics(completion: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, float]:
    """An agent episode's answer metrics (``rlkit rollout``): GSM8K is right or wrong, so EM = accuracy."""
    correct = score([completion], {"answer": [row["answer"]]})[0]
    return {"em": correct, "accuracy": correct}


def success(metrics: dict[str, float]) -> bool:
    return metrics.get("accuracy", 0.0) == 1.0


# ---------------------------------------------------------------------------------------------
# Synthetic problems in GSM8K's format

_NAMES = ["Tom", "Mia", "Ravi", "Ana", "Leo", "Sara", "Ken", "Ines", "Omar", "Lucy", "Ben", "Zoe"]
_ITEMS = ["apples", "books", "marbles", "stickers", "pencils", "cookies", "cards", "shells", "coins", "eggs"]
_GAIN = ["buys {n} more", "finds {n} more", "gets {n} more from a friend", "is given {n} more"]
_LOSS = ["gives away {n}", "loses {n}", "eats {n}", "sells {n}"]


def generate(n: int, seed: int = 0, max_value: int = 20, max_steps: int = 2):
    """``n`` seeded word problems with one or two additions/subtractions, GSM8K-formatted.

    >>> generate(1, seed=3)[0]["answer"].splitlines()[-1].startswith("####")
    True
    """
    import datasets

    rng = random.Random(seed)
    rows = [_problem(rng, max_value, max_steps) for _ in range(n)]
    return datasets.Dataset.from_list(rows)


def _problem(rng: random.Random, max_value: int, max_steps: int) -> dict[str, str]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    total = rng.randint(1, max_value)
    sentences = [f"{name} has {total} {item}."]
    lines = []
    for _ in range(rng.randint(1, max_steps)):
        if total > 1 and rng.random() < 0.5:
            k = rng.randint(1, total - 1)
            sentences.append(f"Then {name} {rng.choice(_LOSS).format(n=k)}.")
            lines.append(f"{total} - {k} = {total - k}")
            total -= k
        else:
            k = rng.randint(1, max_value)
            sentences.append(f"Then {name} {rng.choice(_GAIN).format(n=k)}.")
            lines.append(f"{total} + {k} = {total + k}")
            total += k
    sentences.append(f"How many {item} does {name} have now?")
    return {"question": " ".join(sentences), "answer": "\n".join(lines) + f"\n#### {total}"}
