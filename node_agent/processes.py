"""Child processes in their own process group, with their output streamed line by line.

Every command the agent starts for a job (git, pip, the entry point) runs in a new session, so
the whole tree it spawns can be signalled at once and none of it outlives the job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from node_agent.jobuser import JobUser

_PROC = Path("/proc")
_MAX_LINE = 64 * 1024


def group_members(pgid: int) -> list[int]:
    """The live processes of group ``pgid`` (zombies, already dead, are left out)."""
    if not _PROC.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields start after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def exit_code(returncode: int) -> int:
    """A shell-style exit code: a process killed by signal N exits ``128 + N``."""
    return 128 - returncode if returncode < 0 else returncode


class GroupProcess:
    """A command in its own process group whose merged stdout/stderr goes to ``on_output``."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        on_output: Callable[[bytes], None],
        as_user: JobUser | None = None,
    ) -> None:
        self._process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **(as_user.popen_options() if as_user else {}),
        )
        self.pid = self._process.pid
        self._on_output = on_output
        self._reader = threading.Thread(
            target=self._read_output, name=f"output-{self.pid}", daemon=True
        )
        self._reader.start()

    @property
    def returncode(self) -> int | None:
        return self._process.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """The leader's return code, or None if it is still running after ``timeout``."""
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def end(self, grace: float, kill_wait: float = 10.0) -> list[int]:
        """SIGTERM the group, SIGKILL it after ``grace`` s; return the pids that survived."""
        signal_group(self.pid, signal.SIGTERM)
        if self._wait_group_gone(grace):
            return []
        signal_group(self.pid, signal.SIGKILL)
        self._wait_group_gone(kill_wait)
        return group_members(self.pid)

    def finish_output(self, timeout: float = 10.0) -> None:
        """Wait until every byte the group wrote has been passed to ``on_output``."""
        self._reader.join(timeout)
        if self._reader.is_alive() and self._process.stdout is not None:
            # Someone outside the group still holds the pipe open; what is buffered is lost.
            self._process.stdout.close()
            self._reader.join(1.0)

    def _wait_group_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            self._process.poll()  # reap the leader so it does not linger as a zombie
            if not group_members(self.pid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def _read_output(self) -> None:
        stream = self._process.stdout
        assert stream is not None
        try:
            while chunk := stream.readline(_MAX_LINE):
                self._on_output(chunk)
        except (OSError, ValueError):
            pass  # the pipe was closed under us by finish_output


def run_command(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    on_line: Callable[[str], None],
    cancel: threading.Event,
    grace: float = 5.0,
    as_user: JobUser | None = None,
) -> int | None:
    """Run a command to its end (as ``as_user``), one decoded line at a time to ``on_line``.

    Returns its exit code, or None when ``cancel`` was set (the group is then ended first).
    """
    if cancel.is_set():
        return None
    process = GroupProcess(
        argv,
        cwd=cwd,
        env=env,
        on_output=lambda raw: on_line(raw.decode(errors="replace").rstrip("\r\n")),
        as_user=as_user,
    )
    while (returncode := process.wait(0.1)) is None:
        if cancel.is_set():
            process.end(grace)
            process.finish_output()
            return None
    process.end(grace=1.0)  # helpers it left behind (credential daemons...) go too
    process.finish_output()
    return exit_code(returncode)
