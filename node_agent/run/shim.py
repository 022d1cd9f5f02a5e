"""The shim between the agent and a job's entry point: ``shim.py EXIT_FILE PID_FILE ARGV...``.

The agent starts it in a session of its own, with the job's environment, as the job's user, and
its stdout and stderr appended to the job's log file. The shim writes its pid to ``PID_FILE``,
runs the entry point (which inherits the log file, so no byte of its output depends on the
agent), and once the entry point has ended writes its return code (``-N`` when signal N ended
it) to ``EXIT_FILE``. So an agent that restarted meanwhile finds the job, or how it ended.

The shim outlives the SIGTERM that a stop sends the job's process group, to record how the
entry point took it. It runs with ``python -I -S`` and imports what is built into the
interpreter only (``os``, and ``_signal``, the C half of ``signal``: ``signal`` itself imports
``enum``, which would double the shim's start-up time): the agent hands it a copy of this file,
wherever the package is installed. The entry point is started with ``posix_spawn``, its signals
back to their defaults and its stdin ``/dev/null``.
"""

from __future__ import annotations

import os
import sys

try:
    import _signal as signals
except ImportError:  # an interpreter without it
    import signal as signals  # type: ignore[no-redef]

CANNOT_RUN = 126
_HANDLED = (signals.SIGTERM, signals.SIGINT, signals.SIGHUP)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: shim.py EXIT_FILE PID_FILE ARGV...", file=sys.stderr)
        return 2
    exit_file, pid_file, command = argv[0], argv[1], argv[2:]
    for signum in _HANDLED:
        # A handler, not SIG_IGN: the entry point must not inherit the shim's deafness.
        signals.signal(signum, _outlive)
    _write(pid_file, os.getpid())
    try:
        pid = os.posix_spawnp(
            command[0],
            command,
            os.environ,
            file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)],
            setsigdef=_HANDLED,
        )
    except OSError as error:
        print(f"[agent] cannot start the entry point: {error}", file=sys.stderr, flush=True)
        code = CANNOT_RUN
    else:
        _, status = os.waitpid(pid, 0)  # resumed after each signal the shim outlives
        code = os.waitstatus_to_exitcode(status)
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
