"""Read a dataset from a local file or the Hugging Face Hub, with plain errors for the usual mistakes."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rlkit.errors import UserError
from rlkit.jsonl import numbered_records

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_source(source: Any, required: tuple[str, ...] = ()):
    """Load ``source.path`` (local ``.jsonl``/``.json``/``.parquet``/``.csv`` or a Hub id) as a Dataset."""
    import datasets

    path = str(source.path)
    local = Path(path).expanduser()
    if local.suffix in _FORMATS or local.exists() or path.startswith((".", "/", "~")):
        if not local.exists():
            raise UserError(f"{path}: no such data file")
        if local.is_dir():
            raise UserError(f"{path}: is a directory; point `path:` at a .jsonl, .json, .parquet or .csv file")
        if local.suffix not in _FORMATS:
            raise UserError(f"{path}: unsupported file type {local.suffix!r}; use one of {', '.join(_FORMATS)}")
        if local.stat().st_size == 0:
            raise UserError(f"{path}: the dataset is empty")
        if local.suffix == ".jsonl":
            for _ in numbered_records(local):  # names the first bad line, which datasets' own error does not
                pass
        quiet = logging.getLogger("datasets")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)  # its error log would repeat ours, less clearly
        try:
            ds = datasets.load_dataset(_FORMATS[local.suffix], data_files=str(local), split="train")
        except Exception as e:  # the datasets library raises many types for a malformed file
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"{path}: could not read {local.suffix} file: {reason}") from None
        finally:
            quiet.setLevel(level)
    else:
        ds = _load_hub(path, source.name, source.split)
    missing = [c for c in required if c not in ds.column_names]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)}; found {', '.join(ds.column_names)}")
    return ds


def _load_hub(path: str, name: str | None, split: str):
    import datasets
    from huggingface_hub.errors import OfflineModeIsEnabled

    try:
        return datasets.load_dataset(path, name, split=split)
    except (ConnectionError, OfflineModeIsEnabled) as e:
        raise UserError(f"{path}: cannot reach the Hugging Face Hub ({type(e).__name__}); "
                        "download the dataset while online, or point `path:` at a local file") from None
    except datasets.exceptions.DatasetNotFoundError:
        raise UserError(f"{path}: no such dataset on the Hub (or no local file of that name)") from None
    except ValueError as e:
        if "split" in str(e).lower() or "config" in str(e).lower():
            raise UserError(f"{path}: {str(e).splitlines()[0]}") from None
        raise
