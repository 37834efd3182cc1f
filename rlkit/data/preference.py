"""Preference pairs for DPO and reward models: ``prompt``/``chosen``/``rejected``.

Accepted as the Hub ships them: strings or message lists, with an explicit ``prompt`` column or
only ``chosen``/``rejected`` whose shared beginning is the prompt (TRL's ``extract_prompt`` splits
it off). A conversational prompt with plain-string answers gets the answers wrapped as assistant
messages. Every row is checked before training, so a bad file fails with its row number.

As a task (``data.task: preference``) it also generates arithmetic pairs (right vs wrong answer)
for smoke runs.
"""

from __future__ import annotations

import random
from typing import Any

from rlkit.errors import BadValue, UserError

COLUMNS = ("prompt", "chosen", "rejected")


def load(source: Any):
    """Rows of a local file or Hub dataset, normalised to ``prompt``/``chosen``/``rejected``."""
    from rlkit.data.sources import load_source

    return normalize(load_source(source, required=("chosen", "rejected")), str(source.path))


def normalize(ds, where: str = "data"):
    """Explicit prompts, one format per row (all strings or all messages), only the three columns."""
    from trl.data_utils import maybe_extract_prompt

    columns = [c for c in ("prompt", "chosen", "rejected") if c in ds.column_names]
    i = 0
    for batch in ds.select_columns(columns).iter(batch_size=1000):
        for values in zip(*(batch[c] for c in columns), strict=True):
            _check_row(dict(zip(columns, values, strict=True)), f"{where}: row {i}")
            i += 1
    extra = [c for c in ds.column_names if c not in COLUMNS]
    ds = ds.map(maybe_extract_prompt, remove_columns=extra) if "prompt" not in ds.column_names else \
        ds.remove_columns(extra)
    return ds.map(_wrap_answers)


def _check_row(row: dict[str, Any], where: str) -> None:
    for key in ("chosen", "rejected"):
        value = row.get(key)
        if not (isinstance(value, str) or _is_messages(value)):
            raise UserError(f"{where}: `{key}` must be a string or a list of {{role, content}} messages, "
                            f"got {type(value).__name__}")
        if not value:
            raise UserError(f"{where}: `{key}` is empty")
    if "prompt" in row and not (isinstance(row["prompt"], str) or _is_messages(row["prompt"])):
        raise UserError(f"{where}: `prompt` must be a string or a list of messages, got {type(row['prompt']).__name__}")
    if "prompt" in row and isinstance(row["prompt"], str) and not isinstance(row["chosen"], str):
        raise UserError(f"{where}: a plain-text `prompt` needs plain-text `chosen`/`rejected`, not messages")
    if "prompt" not in row and isinstance(row["chosen"], str) != isinstance(row["rejected"], str):
        raise UserError(f"{where}: `chosen` and `rejected` must both be strings or both be message lists")


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)


def _wrap_answers(row: dict[str, Any]) -> dict[str, Any]:
    if isinstance(row["prompt"], list):
        for key in ("chosen", "rejected"):
            if isinstance(row[key], str):
                row[key] = [{"role": "assistant", "content": row[key]}]
    return row


# ---------------------------------------------------------------------------------------------
# As a task: generated pairs for smoke runs


def generate(n: int, seed: int = 0, max_value: int = 9):
    """``n`` conversational pairs: a sum answered right (chosen) and off by a little (rejected)."""
    import datasets

    if max_value < 1:
        raise BadValue(f"max_value must be at least 1, not {max_value}")
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, max_value), rng.randint(1, max_value)
        wrong = a + b + rng.choice([-2, -1, 1, 2])
        rows.append({
            "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
            "chosen": [{"role": "assistant", "content": f"{a} + {b} = {a + b}\n#### {a + b}"}],
            "rejected": [{"role": "assistant", "content": f"{a} + {b} = {wrong}\n#### {wrong}"}],
        })
    return datasets.Dataset.from_list(rows)


def preference_rows(ds):
    return normalize(ds, "generated pairs")


def prompt_rows(ds):
    """Prompts alone (PPO samples its own answers)."""
    return ds.select_columns(["prompt"])
