"""Child processes in their own process group, with their output streamed line by line.

Every command the agent starts for a job (git, pip, the entry point) runs in a new session, so
the whole tree it spawns can be signalled at once and none of it outlives the job.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from node_agent.models import MARKER_VARIABLE
from node_agent.run.jobuser import JobUser

_PROC = Path("/proc")
_PROC_DIR = str(_PROC)
_MAX_LINE = 64 * 1024
_MARKER_ENTRY = f"{MARKER_VARIABLE}=".encode()


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
    return [pid for pid, group in live_processes() if group == pgid]


def job_processes(marker: str, pgid: int | None = None) -> list[int]:
    """The live processes of a job: those of its process group ``pgid``, and those whose
    environment holds its marker wherever they went (``setsid``, a daemon's double fork).

    Environments are read from ``/proc/<pid>/environ``: an agent running as root reads every
    process's, any other agent only its own user's (a job run as another user by a non-root
    agent cannot happen).
    """
    now = _uptime_ticks()
    return [
        pid
        for pid, group, started in _live()
        if group == pgid or (marker and _marker_of(pid, started, now) == marker)
    ]


def marked_processes() -> dict[int, str]:
    """Every live process that holds a job marker, with its marker."""
    now = _uptime_ticks()
    found = {pid: _marker_of(pid, started, now) for pid, _, started in _live()}
    return {pid: marker for pid, marker in found.items() if marker}


def live_processes() -> list[tuple[int, int]]:
    """``(pid, process group)`` of every process not yet dead (zombies are left out)."""
    return [(pid, group) for pid, group, _ in _live()]


def _live() -> list[tuple[int, int, int]]:
    """``(pid, process group, start time in clock ticks since boot)`` of every live process."""
    found = []
    for name in os.listdir(_PROC_DIR):
        stat = _stat(name) if name.isdigit() else None
        if stat is not None and stat[0] not in ("Z", "X"):
            found.append((int(name), int(stat[2]), int(stat[19])))
    return found


_UNMARKED: set[tuple[int, int]] = set()
"""``(pid, start time)`` of processes seen without a marker while already a second old: a
process's environment is fixed once it runs its program, so it is not read again (a scan of a
busy host then reads each process's environment once, not on every scan). A younger one may
still be between fork and exec, so it is read again next time."""
_SETTLED_TICKS = os.sysconf("SC_CLK_TCK")


def _marker_of(pid: int, started: int, now: float) -> str | None:
    if (pid, started) in _UNMARKED:
        return None
    marker = marker_of(pid)
    if marker is None and now - started > _SETTLED_TICKS:
        if len(_UNMARKED) > 100_000:
            _UNMARKED.clear()
        _UNMARKED.add((pid, started))
    return marker


def _uptime_ticks() -> float:
    """Clock ticks since boot (0 when unknown: nothing is then taken as settled)."""
    try:
        return float((_PROC / "uptime").read_text().split()[0]) * _SETTLED_TICKS
    except (OSError, ValueError, IndexError):
        return 0.0


def is_alive(pid: int, marker: str) -> bool:
    """Whether ``pid`` runs and is the job's (not a new process that got a reused pid)."""
    return pid_running(pid) and marker_of(pid) == marker


def pid_running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    stat = _stat(str(pid))
    return stat is not None and stat[0] not in ("Z", "X")


def marker_of(pid: int) -> str | None:
    try:
        fd = os.open(f"{_PROC_DIR}/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # gone, or another user's while the agent is not root
        return None
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    environ = b"".join(chunks)
    for entry in environ.split(b"\0"):
        if entry.startswith(_MARKER_ENTRY):
            return entry[len(_MARKER_ENTRY) :].decode(errors="replace")
    return None


def started_at(pid: int) -> float | None:
    """When ``pid`` started, in seconds since the epoch (its ``/proc`` start time)."""
    stat = _stat(str(pid))
    try:
        boot = next(
            float(line.split()[1])
            for line in (_PROC / "stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    if stat is None:
        return None
    return boot + int(stat[19]) / os.sysconf("SC_CLK_TCK")


def end_processes(
    find: Callable[[], list[int]], grace: float, kill_wait: float = 10.0
) -> list[int]:
    """SIGTERM the processes ``find`` lists, SIGKILL those left after ``grace`` s (and any they
    fork meanwhile); return those still alive after ``kill_wait`` s more."""
    signal_pids(find(), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while find() and time.monotonic() < deadline:
        time.sleep(0.05)
    deadline = time.monotonic() + kill_wait
    while (left := find()) and time.monotonic() < deadline:
        signal_pids(left, signal.SIGKILL)
        time.sleep(0.05)
    return find()


def outside_group(pids: Iterable[int], pgid: int) -> list[int]:
    """Those of ``pids`` that are not in process group ``pgid`` (those gone left out)."""
    outside = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) != pgid:
                outside.append(pid)
    return outside


def signal_pids(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _stat(pid: str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), if it runs.

    Read with plain ``os`` calls: a scan reads this file of every process on the host."""
    try:
        fd = os.open(f"{_PROC_DIR}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        stat = os.read(fd, 4096).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    return stat[stat.rfind(")") + 2 :].split()


def sleep_until_exit(pid: int, timeout: float) -> bool:
    """Sleep until ``pid`` ends or ``timeout`` passes; False when this cannot be waited for
    (no pidfd on this system)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return False
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    return True


def _group_exists(pgid: int) -> bool:
    """A quick look before a scan of ``/proc``: False once no process is left in the group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


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
        writable: Sequence[Path] = (),
    ) -> None:
        argv, env = as_user.command(argv, cwd, env, writable=writable) if as_user else \
            (list(argv), dict(env))  # fmt: skip
        self._process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
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
        if timeout and self._process.returncode is None and sleep_until_exit(self.pid, timeout):
            timeout = 0  # woken the moment it ended (Popen's own wait polls with sleeps)
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
            if not _group_exists(self.pid) or not group_members(self.pid):
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
    writable: Sequence[Path] = (),
) -> int | None:
    """Run a command to its end (as ``as_user``, in its sandbox where it has one, writing
    ``writable`` too), one decoded line at a time to ``on_line``.

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
        writable=writable,
    )
    while (returncode := process.wait(0.1)) is None:
        if cancel.is_set():
            process.end(grace)
            process.finish_output()
            return None
    process.end(grace=1.0)  # helpers it left behind (credential daemons...) go too
    process.finish_output()
    return exit_code(returncode)
