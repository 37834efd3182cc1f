"""Where rlkit keeps what it builds once and reuses: built-in models, retrieval indexes, locks."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$RLKIT_CACHE``, else ``~/.cache/rlkit``."""
    return Path(os.environ.get("RLKIT_CACHE") or Path.home() / ".cache" / "rlkit")
