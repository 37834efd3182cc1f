"""GSM8K: grade-school math word problems, gold answer after ``####``.

Rows have ``question`` and ``answer`` (a full solution ending in ``#### N``). The model is asked
to reason, then end with GSM8K's own final-answer line ``#### N``; ``rlkit.rewards.math`` reads it.
``generate`` makes GSM8K-format arithmetic word problems for smoke runs and the offline demo.
"""

from __future__ import annotations

import random
import re
from typing import Any

from rlkit.prompts import MATH_TUTOR

SYSTEM_PROMPT = MATH_TUTOR
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
    # Two lines, shown by example (``SHOTS``): a small model (SmolLM2-135M) copies the format from two worked
    # turns far more reliably than from an instruction, and short answers keep CPU generation cheap.
    "short": "Answer with the calculation, then `#### <number>`.",
}
# Worked example turns placed between the system prompt and the question, per prompt variant.
SHOTS = {
    "short": [
        {"role": "user", "content": "Ana has 3 pens. Then Ana buys 4 more. How many pens does Ana have now?"},
        {"role": "assistant", "content": "3 + 4 = 7\n#### 7"},
        {"role": "user", "content": "Max has 9 cups. Then Max breaks 2. How many cups does Max have now?"},
        {"role": "assistant", "content": "9 - 2 = 7\n#### 7"},
    ],
}
_CALC_ANNOTATION = re.compile(r"<<[^<>]*>>")


def load(source: Any):
    from rlkit.data.sources import load_source

    return load_source(source, required=("question", "answer"))


def chat_prompt(question: str, variant: str = "default") -> list[dict[str, str]]:
    return [{"role": "system", "content": PROMPTS[variant]}, *SHOTS.get(variant, []),
            {"role": "user", "content": question.strip()}]


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


def generate(n: int, seed: int = 0, max_value: int = 20, max_steps: int = 2, wording: str = "classic"):
    """``n`` seeded word problems with one or two additions/subtractions, GSM8K-formatted.

    ``wording="other"`` draws one-step problems from a second family that shares no name, item, verb
    or sentence shape with the classic one: a held-out check that a gain is not tied to the wording.

    >>> generate(1, seed=3)[0]["answer"].splitlines()[-1].startswith("####")
    True
    """
    import datasets

    if wording not in ("classic", "other"):
        raise ValueError(f"wording must be 'classic' or 'other', not {wording!r}")
    rng = random.Random(seed)
    make = _problem if wording == "classic" else _other_problem
    rows = [make(rng, max_value, max_steps) for _ in range(n)]
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


# The second family: other names, things, verbs and sentence shapes (one step each).
_OTHER_NAMES = ["Priya", "Jonas", "Amara", "Diego", "Hana", "Felix", "Noor", "Tariq", "Elena", "Kofi"]
_OTHER_ADD = [
    "A baker made {a} {thing} in the morning and {b} {thing} in the afternoon. How many {thing} did the baker make "
    "in all?",
    "{who} read {a} pages on Monday and {b} pages on Tuesday. How many pages did {who} read altogether?",
    "There are {a} {thing} in the red basket and {b} {thing} in the blue basket. How many {thing} are there in total?",
    "{who} collected {a} {thing} last week. This week {who} collected another {b}. What is the total number of "
    "{thing} {who} collected?",
]
_OTHER_SUB = [
    "There were {a} {thing} on the table. {who} took {b} of them away. How many {thing} are still on the table?",
    "A shop had {a} {thing} for sale and sold {b} of them before noon. How many {thing} were left?",
    "{who} baked {a} {thing} for a party, and the guests ate {b}. How many {thing} remained?",
    "The bus carried {a} passengers. At the next stop, {b} passengers got off. How many passengers stayed on the bus?",
]
_OTHER_THINGS = ["muffins", "tulips", "buttons", "crayons", "oranges", "bottles", "candles", "ribbons"]


def _other_problem(rng: random.Random, max_value: int, max_steps: int) -> dict[str, str]:
    who, thing = rng.choice(_OTHER_NAMES), rng.choice(_OTHER_THINGS)
    a = rng.randint(2, max_value)
    if rng.random() < 0.5:
        b = rng.randint(1, max_value)
        question, line, total = rng.choice(_OTHER_ADD), f"{a} + {b} = {a + b}", a + b
    else:
        b = rng.randint(1, a - 1)
        question, line, total = rng.choice(_OTHER_SUB), f"{a} - {b} = {a - b}", a - b
    return {"question": question.format(a=a, b=b, who=who, thing=thing), "answer": f"{line}\n#### {total}"}


def solution_steps(answer: str) -> int:
    """Steps in a GSM8K solution: its lines before the ``#### N`` line."""
    return sum(1 for line in answer.rpartition("####")[0].splitlines() if line.strip())


def easiest(ds, n: int):
    """The ``n`` easiest rows of a GSM8K split, reproducibly: fewest solution steps (lines), then shortest
    question, then file order."""
    order = sorted(range(len(ds)), key=lambda i: (solution_steps(ds[i]["answer"]), len(ds[i]["question"]), i))
    return ds.select(order[:n])
