"""The one JSONL reader: every ``.jsonl`` file rlkit reads (datasets, corpora, trajectories, metrics,
journals, index chunks) goes through :func:`numbered_records` with one error rule.

A missing or unreadable file, a line that is not UTF-8 or not JSON, and a line that is JSON but not an
object are each a one-line :class:`UserError` naming the file and the line. Blank lines are skipped.

The one allowed difference is the last line of a file rlkit appends to while it runs (metrics, records
written as they finish): a kill or a full disk can leave it torn, without its newline. ``torn_tail``
says what to do with such a line: ``"error"`` (the default, for inputs), ``"drop"`` it with a warning,
or ``"cut"`` it off the file too, so that appending continues on a clean line. :func:`append_whole` is how rlkit
appends: a line the disk refuses is cut back off, so the file keeps whole lines only.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from rlkit.errors import UserError

log = logging.getLogger("rlkit")

TornTail = Literal["error", "drop", "cut"]


def read_records(path: str | Path, *, torn_tail: TornTail = "error", missing_ok: bool = False) -> list[dict[str, Any]]:
    """The objects of a JSONL file, in order; ``missing_ok``: a missing file holds none."""
    path = Path(path)
    if missing_ok and not path.exists():
        return []
    return [record for _, record in numbered_records(path, torn_tail=torn_tail)]


def numbered_records(path: str | Path, *, torn_tail: TornTail = "error") -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line of a JSONL file (see the module docstring)."""
    path = Path(path)
    try:
        f = path.open("rb")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a JSONL file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read it: {e.strerror or e}") from None
    whole, unterminated = 0, False  # bytes of complete lines; a last record missing only its newline
    with f:
        for number, line in enumerate(f, 1):
            complete = line.endswith(b"\n")
            try:
                record = _parse(path, number, line) if line.strip() else None
            except UserError:
                if complete or torn_tail == "error":
                    raise
                log.warning("%s: dropping a half-written last line", path)
                break
            whole += len(line)
            unterminated = not complete
            if record is not None:
                yield number, record
    if torn_tail == "cut":
        _cut(path, whole, unterminated)


def _cut(path: Path, whole: int, unterminated: bool) -> None:
    """Leave ``path`` holding its ``whole`` bytes of complete lines, ending on a newline."""
    if whole < path.stat().st_size:
        with path.open("r+b") as f:
            f.truncate(whole)
    elif unterminated:
        with path.open("ab") as f:
            f.write(b"\n")


def _parse(path: Path, number: int, line: bytes) -> dict[str, Any]:
    try:
        value = json.loads(line.decode("utf-8").rstrip())
    except UnicodeDecodeError:
        raise UserError(f"{path}: line {number} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: line {number} is not valid JSON ({e.msg}, column {e.colno})") from None
    except ValueError as e:  # an integer longer than Python converts (4300 digits by default)
        raise UserError(f"{path}: line {number}: {str(e).split(';')[0]}") from None
    except RecursionError:
        raise UserError(f"{path}: line {number} is nested too deeply to read") from None
    if not isinstance(value, dict):
        raise UserError(f"{path}: line {number} is a JSON {type(value).__name__}, not an object")
    return value


def append_whole(fd: int, data: bytes) -> None:
    """Append ``data`` to the open file ``fd`` whole or not at all: a write the disk refuses (full) is cut back off,
    so the file keeps whole lines only; the OSError is raised again."""
    view, start = memoryview(data), os.lseek(fd, 0, os.SEEK_END)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        os.ftruncate(fd, start)
        raise
