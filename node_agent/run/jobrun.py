"""A job's entry point as processes: started through the shim, or found again by an agent that
restarted; watched until it ends, and ended with every process of the job on a stop.

The job's processes are those of the shim's process group and those whose environment holds
the job's marker (``FLEXAI_JOB_MARKER``), so one that left the group with ``setsid`` is ended
too. The shim outlives a SIGTERM to record how the entry point took it; it is spared the first
SIGKILLs for the same reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from node_agent.jobdirs import JobDirs
from node_agent.run import shim
from node_agent.run.jobuser import JobUser
from node_agent.run.processes import (
    is_alive,
    job_processes,
    outside_group,
    signal_group,
    signal_pids,
    sleep_until_exit,
    started_at,
)

_POLL = 0.1
SANDBOX_START_S = 30.0
"""How long bubblewrap may take to set a sandbox up (mounts, namespaces) before it counts as
failed."""
_READ_NO_LINK = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class JobRun:
    """The running entry point of one job on this node."""

    def __init__(
        self,
        dirs: JobDirs,
        *,
        shim_pid: int | None,
        started: float,
        popen: subprocess.Popen[bytes] | None = None,
        monitor: int | None = None,
    ) -> None:
        self.dirs = dirs
        self.shim_pid = shim_pid
        """The shim's pid, also its process group's; None when it is gone."""
        self.started = started
        """When the entry point started, in seconds since the epoch."""
        self._popen = popen
        self._monitor = monitor
        """A sandboxed job's bubblewrap outer process (the shim's parent; ``popen``'s, when
        this agent started it): only the shim's own life says whether the entry point runs,
        and the outer process is never signalled (it ends once the shim did; a signal would
        orphan the sandbox)."""

    @classmethod
    def launch(
        cls,
        argv: Sequence[str],
        *,
        dirs: JobDirs,
        env: Mapping[str, str],
        python: str,
        as_user: JobUser | None,
        work_dir: Path,
    ) -> JobRun:
        """Start the entry point through the shim, its output appended to the job's log; in
        the job's sandbox where it has one (the shim is then the sandbox's first process, and
        bubblewrap says its pid on this host)."""
        shim_file = install_shim(work_dir)
        command = [python, "-I", "-S", str(shim_file), str(dirs.exit_code_file),
                   str(dirs.shim_pid_file), *argv]  # fmt: skip
        if as_user is not None and as_user.sandbox is not None:
            return cls._launch_sandboxed(command, dirs, env, as_user)
        log_fd = os.open(dirs.log_file, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            popen = subprocess.Popen(
                command,
                cwd=dirs.repo,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                start_new_session=True,
                **(as_user.popen_options() if as_user else {}),
            )  # fmt: skip
        finally:
            os.close(log_fd)
        return cls(dirs, shim_pid=popen.pid, started=time.time(), popen=popen)

    @classmethod
    def _launch_sandboxed(cls, command: list[str], dirs: JobDirs, env: Mapping[str, str],
                          as_user: JobUser) -> JobRun:  # fmt: skip
        sandbox = as_user.sandbox
        assert sandbox is not None
        info_read, info_write = os.pipe()
        log_fd = os.open(dirs.log_file, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            argv = sandbox.command(command, cwd=dirs.repo, entry=True, info_fd=info_write)
            popen = subprocess.Popen(argv, cwd="/", env=sandbox.env(env),
                                     stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
                                     start_new_session=True, pass_fds=(info_write,))  # fmt: skip
        finally:
            os.close(log_fd)
            os.close(info_write)
        try:
            shim_pid = read_child_pid(info_read, SANDBOX_START_S)
        finally:
            os.close(info_read)
        if shim_pid is None:
            with contextlib.suppress(OSError):
                popen.kill()
            popen.wait()
            raise OSError(f"the job's sandbox did not start (bubblewrap exited "
                          f"{popen.returncode}; its reason is in the job's log)")  # fmt: skip
        write_number(dirs.sandbox_pid_file, shim_pid)
        return cls(dirs, shim_pid=shim_pid, started=time.time(), popen=popen, monitor=popen.pid)

    @classmethod
    def find(cls, dirs: JobDirs) -> JobRun | None:
        """The job's processes that an agent now gone left running; None when none runs."""
        shim_pid = shim_pid_of(dirs)
        if shim_pid is not None and not is_alive(shim_pid, dirs.marker):
            shim_pid = None  # gone, or the pid of another process by now
        others = job_processes(dirs.marker)
        if shim_pid is None and not others:
            return None
        starts = [started_at(pid) for pid in ([shim_pid] if shim_pid else others)]
        known = [moment for moment in starts if moment is not None]
        sandboxed = shim_pid is not None and dirs.sandbox_pid_file.exists()
        return cls(dirs, shim_pid=shim_pid, started=min(known, default=time.time()),
                   monitor=parent_of(shim_pid) if sandboxed and shim_pid else None)  # fmt: skip

    # -- watching ------------------------------------------------------------------------

    def running(self) -> bool:
        """Whether the entry point still runs (its shim waits for it)."""
        if self._popen is not None and self._monitor is None:
            return self._popen.poll() is None
        self._reap()
        if self.shim_pid is not None:
            return is_alive(self.shim_pid, self.dirs.marker)
        return bool(job_processes(self.dirs.marker))

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the entry point to end; True once it has."""
        deadline = time.monotonic() + timeout
        while self.running():
            if time.monotonic() >= deadline:
                return False
            pause = min(_POLL, max(0.0, deadline - time.monotonic()))
            if self.shim_pid is None or not sleep_until_exit(self.shim_pid, pause):
                time.sleep(pause)  # woken at once by the shim's end where a pidfd tells it
        return True

    def returncode(self) -> int | None:
        """How the entry point ended (``-N``: killed by signal N), as the shim wrote it; for a
        shim that was itself killed first, how the shim ended; None when not known."""
        code = recorded_exit(self.dirs)
        shim_code = None
        if self._popen is not None and self._monitor is None:
            shim_code = self._popen.poll()
        if code is None and shim_code is not None and shim_code < 0:
            return shim_code
        return code

    def processes(self) -> list[int]:
        """Every live process of the job, the shim included (not bubblewrap's outer process:
        it ends once the shim did, and a signal would orphan the sandbox)."""
        self._reap()
        found = job_processes(self.dirs.marker, self._group())
        return [pid for pid in found if pid != self._monitor]

    def _group(self) -> int | None:
        """The shim's process group, while it is the job's: a sandboxed shim is no child of
        the agent's, and its pid, once it ended, may soon be another process's (or group's)."""
        if self.shim_pid is None or (self._monitor is not None
                                     and not is_alive(self.shim_pid, self.dirs.marker)):
            return None  # fmt: skip
        return self.shim_pid

    # -- ending --------------------------------------------------------------------------

    def end(self, grace: float, kill_wait: float = 10.0) -> list[int]:
        """SIGTERM every process of the job once, SIGKILL them after ``grace`` s; return the
        pids still alive after that (stuck in the kernel).

        One SIGTERM each: training code may take a second one for "abort the checkpoint save"."""
        group = self._group()
        if group is not None:
            signal_group(group, signal.SIGTERM)
        left = self.processes()
        if not left:
            return []  # the usual end: the entry point left nothing behind (one scan)
        if group is not None:
            left = outside_group(left, group)  # the group's got theirs just now
        signal_pids(left, signal.SIGTERM)
        if self._all_gone(grace):
            return []
        deadline = time.monotonic() + kill_wait
        while (others := self._but_shim()) and time.monotonic() < deadline:
            signal_pids(others, signal.SIGKILL)  # again and again: a child forked meanwhile
            time.sleep(0.05)
        # The shim records how the entry point ended, then ends too.
        if not self._all_gone(min(2.0, max(0.5, deadline - time.monotonic()))):
            signal_pids(self.processes(), signal.SIGKILL)
            self._all_gone(1.0)
        return self.processes()

    def _but_shim(self) -> list[int]:
        return [pid for pid in self.processes() if pid != self.shim_pid]

    def _all_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.processes():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def _reap(self) -> None:
        if self._popen is not None:
            self._popen.poll()  # the shim must not linger as a zombie


def install_shim(work_dir: Path) -> Path:
    """The shim's copy in the work directory (mode 0644 in a directory the job user may pass
    through), wherever the agent's own package lies."""
    target = work_dir / "shim.py"
    source = Path(shim.__file__).read_bytes()
    with contextlib.suppress(OSError):
        if target.read_bytes() == source:
            return target
    partial = work_dir / f".shim-{os.getpid()}-{threading.get_ident()}"
    partial.write_bytes(source)
    partial.chmod(0o644)
    os.replace(partial, target)
    return target


def shim_pid_of(dirs: JobDirs) -> int | None:
    """The shim's pid on this host, as it wrote it, or (sandboxed: it wrote its pid in its
    sandbox) as bubblewrap told the agent."""
    if dirs.sandbox_pid_file.exists():
        return read_number(dirs.sandbox_pid_file)
    return read_number(dirs.shim_pid_file)


def parent_of(pid: int) -> int | None:
    """A process's parent (a sandboxed shim's: bubblewrap's outer process)."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return int(stat_file.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def read_child_pid(fd: int, timeout: float) -> int | None:
    """The sandboxed process's pid on this host, as bubblewrap's ``--info-fd`` says it once
    the sandbox is set up; None when bubblewrap ended first or said nothing in time."""
    said = b""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        said += chunk
        with contextlib.suppress(ValueError):
            pid = json.loads(said).get("child-pid")
            return int(pid) if isinstance(pid, int) and pid > 0 else None
    return None


def write_number(path: Path, value: int) -> None:
    """The agent's own small file (in the job's scratch folder), replaced at once."""
    partial = path.with_name(f"{path.name}.partial")
    partial.write_text(f"{value}\n")
    os.replace(partial, path)


def recorded_exit(dirs: JobDirs) -> int | None:
    """The entry point's return code as its shim wrote it once it ended; None before."""
    return read_number(dirs.exit_code_file, minimum=-64, maximum=255)


def read_number(path: Path, minimum: int = 1, maximum: int = 2**22) -> int | None:
    """The number a small file of the job's directory holds; None when there is none. The job
    owns that directory: a link or a FIFO it planted there is not followed nor waited on."""
    try:
        fd = os.open(path, _READ_NO_LINK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, 64).decode(errors="replace").strip()
    finally:
        os.close(fd)
    try:
        value = int(text)
    except ValueError:
        return None
    return value if minimum <= value <= maximum else None
