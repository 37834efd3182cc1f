"""Dates the way questions write them, for bylines and generated questions alike."""

from __future__ import annotations

from datetime import datetime


def readable_date(value: str | None) -> str | None:
    """An ISO 8601 timestamp written the way questions write dates ("October 5, 2023"); other text as given."""
    if not value:
        return value
    try:
        date = datetime.fromisoformat(value)
    except ValueError:
        return value
    return f"{date:%B} {date.day}, {date.year}"
