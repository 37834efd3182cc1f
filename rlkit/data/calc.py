"""Calculator word problems: multi-digit arithmetic a small model cannot do in its head.

Each problem needs one expression such as ``347 * 28`` or ``4182 + 2769`` (three- and four-digit
numbers), so a model that answers from memory is nearly always wrong, and one that calls the
calculator tool (``env: calculator``) and copies its result is right. Rows are GSM8K-formatted
(``question``, ``answer`` ending in ``#### N``), so the GSM8K rewards and answer extraction apply.

``wording="other"`` draws from a second family that shares no name, thing or sentence shape with the
classic one: a check that a gain is not tied to the training wording.
"""

from __future__ import annotations

import json
import random
from typing import Any

from rlkit.data.gsm8k import episode_metrics, gold, load, score, success  # noqa: F401 (the task contract)

# The tool call is shown by example (``SHOTS``): SmolLM2-135M copies a format from worked turns far more
# reliably than from an instruction.
PROMPTS = {
    "calculator": "Use the `calculate` tool for the arithmetic, then answer `#### <number>`.",
}


def _call(expression: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "calculate", "arguments": {"expression": expression}}}


def worked_turns(question: str, expression: str, result: str) -> list[dict[str, Any]]:
    """One solved problem as chat turns: the question, the tool call, the tool's result, the answer."""
    return [{"role": "user", "content": question},
            {"role": "assistant", "content": "", "tool_calls": [_call(expression)]},
            {"role": "tool", "name": "calculate", "content": result},
            {"role": "assistant", "content": f"#### {result}"}]


SHOTS = {
    "calculator": [
        *worked_turns("A school orders 215 boxes of chalk with 36 sticks in each box. How many sticks of chalk "
                      "does the school order?", "215 * 36", "7740"),
        *worked_turns("Nina has 1348 stamps. Then Nina buys 2596 more. How many stamps does Nina have now?",
                      "1348 + 2596", "3944"),
    ],
}


def chat_prompt(question: str, variant: str = "calculator") -> list[dict[str, Any]]:
    return [{"role": "system", "content": PROMPTS[variant]}, *SHOTS.get(variant, []),
            {"role": "user", "content": question.strip()}]


def grpo_rows(ds, prompt: str = "calculator"):
    """Conversational prompts plus the gold number in ``answer`` (passed to the rewards by TRL)."""
    return ds.map(lambda row: {"prompt": chat_prompt(row["question"], prompt), "answer": gold(row["answer"])},
                  remove_columns=ds.column_names)


eval_rows = grpo_rows
prompt_rows = grpo_rows


def sft_rows(ds, prompt: str = "calculator"):
    """Oracle trajectories (``messages`` + ``tools``): call the calculator with the problem's expression,
    read its result, answer ``#### N``. With ``assistant_only_loss`` only the call and the answer are learned."""
    from rlkit.envs import class_tool_schemas
    from rlkit.envs.calculator import CalculatorEnv, evaluate, format_number

    tools = json.dumps(class_tool_schemas(CalculatorEnv))

    def oracle(row: dict[str, Any]) -> dict[str, Any]:
        expression = row["answer"].splitlines()[0].partition(" = ")[0]
        turns = worked_turns(row["question"], expression, format_number(evaluate(expression)))
        return {"messages": [*chat_prompt(row["question"], prompt)[:-1], *turns], "tools": tools}

    return ds.map(oracle, remove_columns=ds.column_names)


# ---------------------------------------------------------------------------------------------
# Generated problems

_NAMES = ["Tom", "Mia", "Ravi", "Ana", "Leo", "Sara", "Ken", "Ines", "Omar", "Lucy", "Ben", "Zoe"]
_ITEMS = ["apples", "books", "marbles", "stickers", "pencils", "cookies", "cards", "shells", "coins", "eggs"]
_CLASSIC = {
    "*": ["A shop has {a} boxes with {b} {item} in each box. How many {item} does the shop have?",
          "{name} packs {a} bags of {item}. Each bag holds {b} {item}. How many {item} does {name} pack?"],
    "+": ["{name} has {a} {item}. Then {name} buys {b} more. How many {item} does {name} have now?",
          "A shop sells {a} {item} in May and {b} {item} in June. How many {item} does the shop sell in all?"],
    "-": ["{name} has {a} {item}. Then {name} gives away {b}. How many {item} does {name} have now?",
          "A shop has {a} {item} and sells {b} of them. How many {item} are left?"],
}
_OTHER_NAMES = ["Priya", "Jonas", "Amara", "Diego", "Hana", "Felix", "Noor", "Tariq", "Elena", "Kofi"]
_OTHER_THINGS = ["muffins", "tulips", "buttons", "crayons", "oranges", "bottles", "candles", "ribbons"]
_OTHER = {
    "*": ["Every crate on the truck carries {b} {item}, and the truck brings {a} crates. What is the total number "
          "of {item} delivered?",
          "{name} plants {a} rows of {item} with {b} in every row. How many {item} did {name} plant altogether?"],
    "+": ["Last year the farm grew {a} {item}; this year it grew {b}. Over both years, how many {item} were grown?",
          "{name} counted {a} {item} in the first hall and {b} in the second. What total did {name} count?"],
    "-": ["The factory made {a} {item}, but {b} were faulty and thrown out. How many good {item} remained?",
          "Of the {a} {item} in stock, {name} shipped {b} today. How many {item} are still in stock?"],
}


def generate(n: int, seed: int = 0, wording: str = "classic"):
    """``n`` seeded problems: a three-digit count times a two-digit one, or two four-digit numbers added
    or subtracted, GSM8K-formatted (``"347 * 28 = 9716\\n#### 9716"``).

    >>> generate(1, seed=3)[0]["answer"].splitlines()[-1].startswith("####")
    True
    """
    import datasets

    if wording not in ("classic", "other"):
        raise ValueError(f"wording must be 'classic' or 'other', not {wording!r}")
    rng = random.Random(seed)
    return datasets.Dataset.from_list([_problem(rng, wording) for _ in range(n)])


def _problem(rng: random.Random, wording: str) -> dict[str, str]:
    shapes, names, items = (_CLASSIC, _NAMES, _ITEMS) if wording == "classic" else (_OTHER, _OTHER_NAMES,
                                                                                     _OTHER_THINGS)
    op = rng.choice(["*", "+", "-"])
    if op == "*":
        a, b = rng.randint(101, 999), rng.randint(12, 99)
    else:
        a, b = rng.randint(1001, 9999), rng.randint(1001, 9999)
        if op == "-" and a < b:
            a, b = b, a
    total = {"*": a * b, "+": a + b, "-": a - b}[op]
    question = rng.choice(shapes[op]).format(a=a, b=b, name=rng.choice(names), item=rng.choice(items))
    return {"question": question, "answer": f"{a} {op} {b} = {total}\n#### {total}"}
