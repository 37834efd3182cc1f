"""Start an MCP server so that it cannot outlive rlkit, even when rlkit is killed with SIGKILL (Linux).

``python -I mcp_guard.py RLKIT_PID COMMAND [ARGS...]``: rlkit's MCP client starts this in place of the server
command (standard library only, run by file in isolated mode, so it never depends on the server's
environment). It asks the kernel for SIGTERM when the thread that started it dies (``PR_SET_PDEATHSIG``),
runs the server as its child in its own process group (the SDK gave it a new session), passes stdin and
stdout through untouched, and exits with the server's exit code. On SIGTERM (rlkit died, or the SDK's own
shutdown escalated) it kills the whole process group, so a server's own children go too.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def _kill_group(signum: int, frame: object) -> None:
    os.killpg(0, signal.SIGKILL)  # this guard is in the group too: nothing of the server is left


def main(argv: list[str]) -> int:
    parent, command = int(argv[0]), argv[1:]
    signal.signal(signal.SIGTERM, _kill_group)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        print(f"rlkit mcp guard: prctl failed (errno {ctypes.get_errno()}); the server may outlive a killed rlkit",
              file=sys.stderr)
    if os.getppid() != parent:  # rlkit died before the request above took effect
        return 1
    try:
        server = subprocess.Popen(command)
    except OSError as e:
        print(f"rlkit mcp guard: cannot start {command[0]!r}: {e.strerror}", file=sys.stderr)
        return 127
    while True:
        try:
            return server.wait()
        except KeyboardInterrupt:  # a stray SIGINT: the server decides; rlkit stops it through stdin
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
