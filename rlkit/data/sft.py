"""Generic SFT data: rows already in TRL's ``messages`` or ``prompt``/``completion`` form.

Both plain-text and conversational variants are accepted as TRL accepts them; rlkit only checks the
columns so a wrong file fails before the model loads.
"""

from __future__ import annotations

from typing import Any

from rlkit.errors import UserError


def load(source: Any):
    from rlkit.data.sources import load_source

    ds = load_source(source)
    cols = set(ds.column_names)
    if "messages" not in cols and not {"prompt", "completion"} <= cols:
        raise UserError(f"{source.path}: SFT data needs a `messages` column or `prompt` and `completion` "
                        f"columns; found {', '.join(sorted(cols))}")
    return ds


def sft_rows(ds):
    return ds
