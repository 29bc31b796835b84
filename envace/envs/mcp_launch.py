"""Start an MCP server so that it cannot outlive the process that started it.

``python mcp_launch.py PARENT_PID PID_FILE COMMAND [ARG...]`` asks the kernel to SIGKILL this process when the
thread that spawned it exits (``prctl(PR_SET_PDEATHSIG)``, Linux), writes its process id to ``PID_FILE`` and then
replaces itself with ``COMMAND`` (``exec``: same process, same id, the death signal kept). A server blocked in a tool
call does not read its standard input, so it would not notice that the trainer was killed; this way it dies with it,
also when the trainer gets SIGKILL. Elsewhere than Linux the death signal is skipped (the server then exits when its
standard input closes, the MCP stdio convention).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> bool:
    """Ask for SIGKILL when the parent thread exits; True where the kernel took it (Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0


def main(argv: list[str]) -> None:
    """Arm the death signal, write the process id, become the server (``argv``: as the module docstring)."""
    if len(argv) < 3 or not argv[0].isdigit():
        raise SystemExit("usage: mcp_launch.py PARENT_PID PID_FILE COMMAND [ARG...]")
    parent, pid_file, command = int(argv[0]), argv[1], argv[2:]
    die_with_parent()
    if os.getppid() != parent:  # the parent died before the signal was armed
        raise SystemExit(f"mcp_launch: the process that started {command[0]!r} is gone")
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
    try:
        os.execvp(command[0], command)
    except OSError as exc:  # the one line the client reports as the cause
        raise SystemExit(f"mcp_launch: cannot run {command[0]!r}: {exc.strerror}") from None


if __name__ == "__main__":
    main(sys.argv[1:])
