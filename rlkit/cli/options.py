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


def _print_version(value: bool) -> None:
    if value:
        from rlkit import __version__

        typer.echo(f"rlkit {__version__}")
        raise typer.Exit()


def main_options(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print rlkit's version and exit."),
) -> None:
    """Post-train language models with SFT, DPO, reward models, PPO and GRPO from one YAML recipe."""
