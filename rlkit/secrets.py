"""Keep API keys and tokens out of everything rlkit writes: run directories, logs, reports, trajectories.

Secrets come from the environment (the variables below) and from flags such as ``--api-key``,
which register themselves here. :func:`redact` replaces every known secret value in a text;
:class:`RedactingFilter` does it for log records; :func:`scrub` replaces the values of mapping
keys that name a secret (``hub_token``, ``api_key``...) before a config is saved.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

ENV_VARS = ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN", "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY", "VLLM_API_KEY")
MASK = "***"
_SECRET_KEY = re.compile(r"(token|api_?key|secret|password)$", re.IGNORECASE)
_MIN_LENGTH = 4  # a short key is still a key; 3 characters or fewer would redact ordinary words and numbers
_registered: set[str] = set()


def register(value: str | None) -> None:
    """Treat ``value`` (e.g. an ``--api-key``) as a secret for the rest of the process."""
    if value and len(value) >= _MIN_LENGTH:
        _registered.add(value)


def known() -> list[str]:
    """Every secret value known now, longest first (so a key containing another is masked whole)."""
    values = {os.environ.get(name, "") for name in ENV_VARS} | _registered
    return sorted((v for v in values if len(v) >= _MIN_LENGTH), key=len, reverse=True)


def redact(text: str) -> str:
    for value in known():
        text = text.replace(value, MASK)
    return text


def scrub(value: Any) -> Any:
    """A copy of a config (dicts, lists, scalars) with secret-named keys masked and secret values redacted."""
    if isinstance(value, dict):
        return {k: (MASK if v and isinstance(k, str) and _SECRET_KEY.search(k) else scrub(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    if isinstance(value, str):
        return redact(value)
    return value


class RedactingFilter(logging.Filter):
    """Masks secrets in a log record's final message (its arguments included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True
