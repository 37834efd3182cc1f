"""``rlkit serve-search``: a recipe's search index as an MCP server (body in :mod:`rlkit.mcp_serve`)."""

from __future__ import annotations

from pathlib import Path

import typer

from rlkit.cli.options import SetOpt, SmokeOpt


def serve_search(
    recipe: Path = typer.Argument(..., help="A recipe with a `retrieval:` section."),
    set_: list[str] = SetOpt,
    smoke: bool = SmokeOpt,
    http: str = typer.Option(None, "--http", help="Serve streamable HTTP on HOST:PORT (at /mcp) instead of stdio."),
) -> None:
    """Serve the recipe's `search` tool over MCP: the schema and result text the training env shows the model.

    stdio by default (an MCP client starts this command); --http 127.0.0.1:8765 serves
    http://127.0.0.1:8765/mcp until Ctrl-C.
    """
    from rlkit.mcp_serve import serve

    serve(recipe, set_ or [], smoke=smoke, http=http)
