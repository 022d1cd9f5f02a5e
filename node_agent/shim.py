"""The shim between the agent and a job's entry point: ``shim.py EXIT_FILE PID_FILE ARGV...``.

The agent starts it in a session of its own, with the job's environment, as the job's user, and
its stdout and stderr appended to the job's log file. The shim writes its pid to ``PID_FILE``,
runs the entry point (which inherits the log file, so no byte of its output depends on the
agent), and once the entry point has ended writes its return code (``-N`` when signal N ended
it) to ``EXIT_FILE``. So an agent that restarted meanwhile finds the job, or how it ended.

The shim outlives the SIGTERM that a stop sends the job's process group, to record how the
entry point took it. It runs with ``python -I -S`` and imports the standard library only: the
agent hands it a copy of this file, wherever the package is installed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

CANNOT_RUN = 126


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: shim.py EXIT_FILE PID_FILE ARGV...", file=sys.stderr)
        return 2
    exit_file, pid_file, command = argv[0], argv[1], argv[2:]
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # A handler, not SIG_IGN: the entry point must not inherit the shim's deafness.
        signal.signal(signum, _outlive)
    _write(pid_file, os.getpid())
    try:
        entry_point = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    except OSError as error:
        print(f"[agent] cannot start the entry point: {error}", file=sys.stderr, flush=True)
        code = CANNOT_RUN
    else:
        code = entry_point.wait()
    _write(exit_file, code)
    return 0


def _outlive(signum: int, frame: object) -> None:
    """The entry point, in the same process group, receives the signal and decides."""


def _write(path: str, value: int) -> None:
    """Replace ``path`` at once with ``value``: a reader never sees half of it."""
    partial = f"{path}.partial"
    with open(partial, "w") as sink:
        sink.write(f"{value}\n")
    os.replace(partial, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
