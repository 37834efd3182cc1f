"""The CLI as a click command, for the docs site's generated reference (``docs/reference/cli.md``, mkdocs-click).

Generated from the typer app at build time, so the reference cannot drift from the commands.
"""

from __future__ import annotations

import typer

from rlkit.cli import app

cli = typer.main.get_command(app)
