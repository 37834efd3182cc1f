"""Anthropic HH-RLHF: ``chosen``/``rejected`` transcripts ("\\n\\nHuman: ...\\n\\nAssistant: ...").

The transcripts become chat messages (Human -> user, Assistant -> assistant), so a chat model sees
them through its own template; the shared beginning is the prompt and the last assistant turns are
the answers. Rows that do not parse as alternating turns are dropped and counted in the log.
``generate`` writes pairs in the raw transcript form for smoke runs, so the parser is exercised too.
"""

from __future__ import annotations

import logging
import random
import re
from typing import Any

from rlkit.errors import BadValue, UserError

log = logging.getLogger("rlkit")
_TURN = re.compile(r"\n\n(Human|Assistant):[ ]?")
_ROLES = {"Human": "user", "Assistant": "assistant"}


def transcript(text: str) -> list[dict[str, str]] | None:
    """Messages of one transcript, or None when it is not Human/Assistant turns ending with Assistant.

    >>> transcript("\\n\\nHuman: Hi?\\n\\nAssistant: Hello.")
    [{'role': 'user', 'content': 'Hi?'}, {'role': 'assistant', 'content': 'Hello.'}]
    """
    if not isinstance(text, str):
        return None
    parts = _TURN.split("\n\n" + text.lstrip("\n") if not text.startswith("\n\n") else text)
    if parts[0].strip():
        return None
    turns = zip(parts[1::2], parts[2::2], strict=True)
    messages = [{"role": _ROLES[who], "content": said.strip()} for who, said in turns]
    roles = [m["role"] for m in messages]
    alternating = all(a != b for a, b in zip(roles, roles[1:], strict=False))
    if not messages or roles[0] != "user" or roles[-1] != "assistant" or not alternating:
        return None
    return messages


def load(source: Any):
    from rlkit.data.sources import load_source

    return load_source(source, required=("chosen", "rejected"))


def preference_rows(ds):
    """Conversational ``prompt``/``chosen``/``rejected`` from the transcripts."""
    from rlkit.data.preference import normalize

    def parse(batch: dict[str, list]) -> dict[str, list]:
        out: dict[str, list] = {"chosen": [], "rejected": []}
        for chosen, rejected in zip(batch["chosen"], batch["rejected"], strict=True):
            c, r = transcript(chosen), transcript(rejected)
            if c and r and c[:-1] == r[:-1] and c[-1] != r[-1]:
                out["chosen"].append(c)
                out["rejected"].append(r)
        return out

    n = len(ds)
    ds = ds.map(parse, batched=True, remove_columns=ds.column_names)
    if len(ds) == 0:
        raise UserError("hh_rlhf: no row parsed as Human/Assistant transcripts sharing all but the last turn")
    if len(ds) < n:
        log.info("hh_rlhf: kept %d of %d pairs (the rest are not well-formed transcripts)", len(ds), n)
    return normalize(ds, "hh_rlhf")


def prompt_rows(ds):
    """The conversation before the last assistant turn (PPO samples its own answer)."""
    return preference_rows(ds).select_columns(["prompt"])


def generate(n: int, seed: int = 0, max_value: int = 9):
    """``n`` pairs in HH's raw transcript form: a sum answered right (chosen) and wrong (rejected)."""
    import datasets

    if max_value < 1:
        raise BadValue(f"max_value must be at least 1, not {max_value}")
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, max_value), rng.randint(1, max_value)
        head = f"\n\nHuman: What is {a} plus {b}?\n\nAssistant:"
        rows.append({"chosen": f"{head} It is {a + b}.", "rejected": f"{head} It is {a + b + rng.choice([-1, 1])}."})
    return datasets.Dataset.from_list(rows)
