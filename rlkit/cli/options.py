"""Options and output shared by rlkit's commands."""

from __future__ import annotations

from typing import Any

import typer

SetOpt = typer.Option(None, "--set", help="Override a recipe key, e.g. --set trainer.learning_rate=1e-5.")
SmokeOpt = typer.Option(False, "--smoke", help="Tiny built-in model, generated data, 2 steps, CPU-safe.")


def console() -> Any:
    """A rich console on stdout (imported only when a command prints)."""
    from rich.console import Console

    return Console()
