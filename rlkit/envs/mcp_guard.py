"""Start an MCP server so that it cannot outlive rlkit, even when rlkit is killed with SIGKILL (Linux).

``python -I mcp_guard.py RLKIT_PID COMMAND [ARGS...]``: rlkit's MCP client starts this in place of the server
command (standard library only, run by file in isolated mode, so it never depends on the server's
environment). It asks the kernel for SIGTERM when the thread that started it dies (``PR_SET_PDEATHSIG``),
runs the server as its child in a process group of its own, passes stdin and stdout through untouched, and
exits with the server's exit code. When the server exits (rlkit closed its stdin), and on SIGTERM (rlkit
died, or the SDK's shutdown escalated), it kills the server's process group, so the server's children go too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
_server: list[int] = []  # the server's pid, which is also its process group's id


def _kill_server() -> None:
    for pgid in _server:
        with contextlib.suppress(ProcessLookupError):  # the server and all it started are gone already
            os.killpg(pgid, signal.SIGKILL)


def _on_sigterm(signum: int, frame: object) -> None:
    _kill_server()
    os._exit(128 + signum)


def main(argv: list[str]) -> int:
    parent, command = int(argv[0]), argv[1:]
    signal.signal(signal.SIGTERM, _on_sigterm)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        print(f"rlkit mcp guard: prctl failed (errno {ctypes.get_errno()}); the server may outlive a killed rlkit",
              file=sys.stderr)
    if os.getppid() != parent:  # rlkit died before the request above took effect
        return 1
    try:
        # Its own process group, so that the server's own children can be found and stopped with it.
        server = subprocess.Popen(command, preexec_fn=os.setpgrp)
    except OSError as e:
        print(f"rlkit mcp guard: cannot start {command[0]!r}: {e.strerror}", file=sys.stderr)
        return 127
    _server.append(server.pid)
    code = server.wait()
    _kill_server()  # what the server started and left running would be an orphan
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
