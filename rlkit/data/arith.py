"""Seeded arithmetic word problems in GSM8K's format (``question``; ``answer`` = working lines + ``#### N``).

The generator behind ``data: {synthetic: N, generator: {...}}`` for the gsm8k task, the offline demo and the
``arith`` eval suite. Its knobs move a problem out of a training box one axis at a time:

- ``min_value``/``max_value``: the operands of sums and differences (``min_value=10, max_value=99``: two-digit);
- ``ops``: which operations occur, any of ``+``, ``-``, ``*`` (products of two factors up to ``max_factor``);
- ``max_steps``: one or more operations in a row;
- ``wording``: ``classic`` or ``other`` (a family sharing no name, item, verb or sentence shape with classic).

With the defaults (``ops="+-"``, ``min_value=1``) the rows are exactly those of earlier rlkit versions, seed
for seed: the demo's held-out set did not move.
"""

from __future__ import annotations

import random

from rlkit.errors import BadValue

_NAMES = ["Tom", "Mia", "Ravi", "Ana", "Leo", "Sara", "Ken", "Ines", "Omar", "Lucy", "Ben", "Zoe"]
_ITEMS = ["apples", "books", "marbles", "stickers", "pencils", "cookies", "cards", "shells", "coins", "eggs"]
_GAIN = ["buys {n} more", "finds {n} more", "gets {n} more from a friend", "is given {n} more"]
_LOSS = ["gives away {n}", "loses {n}", "eats {n}", "sells {n}"]
_GROUPS = ["bags", "boxes", "jars", "packs"]
OPS = "+-*"


def generate(n: int, seed: int = 0, max_value: int = 20, max_steps: int = 2, wording: str = "classic",
             min_value: int = 1, ops: str = "+-", max_factor: int = 12):
    """``n`` seeded word problems, GSM8K-formatted (see the module docstring for the knobs).

    >>> generate(1, seed=3)[0]["answer"].splitlines()[-1].startswith("####")
    True
    """
    import datasets

    if wording not in ("classic", "other"):
        raise BadValue(f"wording must be 'classic' or 'other', not {wording!r}")
    if not ops or set(ops) - set(OPS):
        raise BadValue(f"ops must be some of {OPS!r}, not {ops!r}")
    if not 1 <= min_value < max_value:
        raise BadValue(f"need 1 <= min_value < max_value, not {min_value} and {max_value}")
    if max_steps < 1:
        raise BadValue(f"max_steps must be at least 1, not {max_steps}")
    if max_factor < 2:
        raise BadValue(f"max_factor must be at least 2, not {max_factor}")
    rng = random.Random(seed)
    make = _problem if wording == "classic" else _other_problem
    rows = [make(rng, max_value, max_steps, min_value, ops, max_factor) for _ in range(n)]
    return datasets.Dataset.from_list(rows)


def _problem(rng: random.Random, max_value: int, max_steps: int, min_value: int, ops: str,
             max_factor: int) -> dict[str, str]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    lines = []
    if ops != "+-" and rng.choice(ops) == "*":  # a product first: groups of equal size
        a, b = rng.randint(2, max_factor), rng.randint(2, max_factor)
        sentences = [f"{name} has {a} {rng.choice(_GROUPS)} with {b} {item} in each."]
        lines.append(f"{a} * {b} = {a * b}")
        total, steps = a * b, rng.randint(1, max_steps) - 1
    else:
        total = rng.randint(min_value, max_value)
        sentences, steps = [f"{name} has {total} {item}."], rng.randint(1, max_steps)
    rest = ops.replace("*", "") or "+"  # what the steps after the first may do
    for _ in range(steps):
        subtract = total > 1 and (rng.random() < 0.5 if len(rest) == 2 else rest == "-")
        if subtract:
            k = rng.randint(min(min_value, total - 1), total - 1)
            sentences.append(f"Then {name} {rng.choice(_LOSS).format(n=k)}.")
            lines.append(f"{total} - {k} = {total - k}")
            total -= k
        else:
            k = rng.randint(min_value, max_value)
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
_OTHER_MUL = [
    "{who} filled {a} trays, putting {b} {thing} on each tray. How many {thing} are on the trays?",
    "A hall has {a} rows of chairs and every row has {b} chairs. How many chairs are in the hall?",
    "Each of {a} children brought {b} {thing} to school. How many {thing} did the children bring altogether?",
]
_OTHER_THINGS = ["muffins", "tulips", "buttons", "crayons", "oranges", "bottles", "candles", "ribbons"]


def _other_problem(rng: random.Random, max_value: int, max_steps: int, min_value: int, ops: str,
                   max_factor: int) -> dict[str, str]:
    who, thing = rng.choice(_OTHER_NAMES), rng.choice(_OTHER_THINGS)
    if ops == "+-":  # the draws of earlier rlkit versions, in their order
        a = rng.randint(max(2, min_value), max_value)
        op = "+" if rng.random() < 0.5 else "-"
    else:
        op = rng.choice(ops)
        a = rng.randint(2, max_factor) if op == "*" else rng.randint(max(2, min_value), max_value)
    if op == "*":
        b = rng.randint(2, max_factor)
        question, line, total = rng.choice(_OTHER_MUL), f"{a} * {b} = {a * b}", a * b
    else:
        if op == "+":
            b = rng.randint(min_value, max_value)
            question, line, total = rng.choice(_OTHER_ADD), f"{a} + {b} = {a + b}", a + b
        else:
            b = rng.randint(min(min_value, a - 1), a - 1)
            question, line, total = rng.choice(_OTHER_SUB), f"{a} - {b} = {a - b}", a - b
    return {"question": question.format(a=a, b=b, who=who, thing=thing), "answer": f"{line}\n#### {total}"}
