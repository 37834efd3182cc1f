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
from rlkit.errors import BadValue

# The tool call is shown by example (``SHOTS``): SmolLM2-135M copies a format from worked turns far more
# reliably than from an instruction.
_CALCULATOR = "Use the `calculate` tool for the arithmetic, then answer `#### <number>`."
PROMPTS = {
    "calculator": _CALCULATOR,
    # Other prompt forms (the `calc` eval suite): the system line alone, and another line with other worked turns.
    "calculator-zero": _CALCULATOR,
    "calculator-alt": "You have a calculator. Call `calculate` with the expression, then give the result as "
                      "`#### <number>`.",
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
    "calculator-alt": [
        *worked_turns("A library had 6021 books and lent out 2875 of them. How many books are still on the "
                      "shelves?", "6021 - 2875", "3146"),
        *worked_turns("Each of the 48 buses carries 153 passengers. How many passengers ride the buses?",
                      "153 * 48", "7344"),
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


# Two operations in one problem (``steps=2``): a product or a sum, then a second number added or taken away; the
# whole expression fits one tool call.
_CLASSIC2 = {
    "* -": "A shop has {a} boxes with {b} {item} in each box and sells {c} {item}. How many {item} are left?",
    "* +": "{name} packs {a} bags with {b} {item} in each bag and has {c} loose {item}. How many {item} does {name} "
           "have in all?",
    "+ -": "{name} has {a} {item}. Then {name} buys {b} more and gives away {c}. How many {item} does {name} have "
           "now?",
}
_OTHER2 = {
    "* -": "The truck brings {a} crates of {b} {item} each, and {c} {item} arrive broken. How many unbroken {item} "
           "were delivered?",
    "* +": "{name} plants {a} rows of {item} with {b} in every row, then {c} more by the gate. How many {item} did "
           "{name} plant altogether?",
    "+ -": "The farm grew {a} {item} last year and {b} this year, and {c} of them spoiled. How many {item} from "
           "both years were good?",
}
# Operand ranges (inclusive) by ``size``: (product: count, per-group), (sum/difference: both numbers).
SIZES = {
    "small": (((13, 99), (3, 9)), (101, 999)),           # two-digit times one-digit, three-digit sums
    "standard": (((101, 999), (12, 99)), (1001, 9999)),  # the recipes' box
    "large": (((1001, 9999), (101, 999)), (10001, 99999)),
}


def generate(n: int, seed: int = 0, wording: str = "classic", size: str = "standard", steps: int = 1):
    """``n`` seeded problems, GSM8K-formatted (``"347 * 28 = 9716\\n#### 9716"``). By default (the recipes' box) a
    three-digit count times a two-digit one, or two four-digit numbers added or subtracted. Knobs that move a
    problem out of that box one axis at a time: ``wording`` (``classic`` or ``other``), ``size`` (``small``,
    ``standard``, ``large``: the operands' digits) and ``steps`` (1, or 2: a product or sum, then a third number
    added or taken away). With the defaults the rows are those of earlier rlkit versions, seed for seed.

    >>> generate(1, seed=3)[0]["answer"].splitlines()[-1].startswith("####")
    True
    """
    import datasets

    if wording not in ("classic", "other"):
        raise BadValue(f"wording must be 'classic' or 'other', not {wording!r}")
    if size not in SIZES:
        raise BadValue(f"size must be one of {', '.join(SIZES)}, not {size!r}")
    if steps not in (1, 2):
        raise BadValue(f"steps must be 1 or 2, not {steps!r}")
    rng = random.Random(seed)
    make = _problem if steps == 1 else _two_step
    return datasets.Dataset.from_list([make(rng, wording, size) for _ in range(n)])


def _words(wording: str) -> tuple[list[str], list[str]]:
    return (_NAMES, _ITEMS) if wording == "classic" else (_OTHER_NAMES, _OTHER_THINGS)


def _operands(rng: random.Random, op: str, size: str) -> tuple[int, int]:
    (count, group), summand = SIZES[size]
    if op == "*":
        return rng.randint(*count), rng.randint(*group)
    a, b = rng.randint(*summand), rng.randint(*summand)
    return (b, a) if op == "-" and a < b else (a, b)


def _row(question: str, expression: str) -> dict[str, str]:
    from rlkit.envs.calculator import evaluate

    total = evaluate(expression)
    return {"question": question, "answer": f"{expression} = {total}\n#### {total}"}


def _problem(rng: random.Random, wording: str, size: str) -> dict[str, str]:
    names, items = _words(wording)
    op = rng.choice(["*", "+", "-"])
    a, b = _operands(rng, op, size)
    shape = rng.choice((_CLASSIC if wording == "classic" else _OTHER)[op])
    return _row(shape.format(a=a, b=b, name=rng.choice(names), item=rng.choice(items)), f"{a} {op} {b}")


def _two_step(rng: random.Random, wording: str, size: str) -> dict[str, str]:
    names, items = _words(wording)
    ops = rng.choice(sorted(_CLASSIC2))
    first, second = ops.split()
    a, b = _operands(rng, first, size)
    subtotal = a * b if first == "*" else a + b
    c = rng.randint(1, subtotal - 1) if second == "-" else _operands(rng, "+", size)[0]
    shape = (_CLASSIC2 if wording == "classic" else _OTHER2)[ops]
    return _row(shape.format(a=a, b=b, c=c, name=rng.choice(names), item=rng.choice(items)),
                f"{a} {first} {b} {second} {c}")
