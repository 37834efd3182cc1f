"""A small MCP server for the tests, written with the SDK's high-level ``MCPServer`` as a user would write one.

``python tests/mcp_calculator.py [--http PORT]``. Tools: ``calculate`` (rlkit's calculator, so GRPO's scripted
calculator episodes run unchanged through MCP), ``sleep`` (answers after ``seconds``: timeouts) and ``children``
(starts a child process and reports its pid: no process of the server's may outlive rlkit). Writes its own pid
to $MCP_PID_FILE when set.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from rlkit.envs.calculator import CalculatorError, evaluate, format_number

server = MCPServer("test-calculator")


@server.tool()
def calculate(
    expression: Annotated[str, Field(description='The arithmetic expression, e.g. "(1,250 + 37.5) * 12 / 100".')],
) -> str:
    """Evaluate an arithmetic expression: numbers, + - * / // % ** (or ^) and parentheses.

    No variables or functions; write a square root as ** 0.5.
    """
    try:
        return format_number(evaluate(expression))
    except CalculatorError as e:  # the message goes back to the model, as from rlkit's CalculatorEnv
        raise ToolError(str(e)) from None


@server.tool()
def sleep(seconds: Annotated[float, Field(description="How long to wait.")]) -> str:
    """Wait, then say so."""
    time.sleep(seconds)
    return f"slept {seconds:g}s"


@server.tool()
def children() -> str:
    """Start a long-running child process and give its pid."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    return str(child.pid)


if __name__ == "__main__":
    if os.environ.get("MCP_PID_FILE"):
        with open(os.environ["MCP_PID_FILE"], "w") as f:
            f.write(str(os.getpid()))
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        server.run("streamable-http", port=int(sys.argv[2]))
    else:
        server.run("stdio")
