"""A cgroup per job: its memory and process limits, how many times the kernel's OOM killer hit
it, and an end that leaves no process of it behind.

Both layouts are served: cgroup v2 (one unified hierarchy: current distributions), where the
agent's own cgroup is delegated to it (systemd's ``Delegate=yes``; the agent moves itself to a
leaf ``flexai-agent`` and enables ``memory`` and ``pids`` below), and cgroup v1 (a hierarchy per
controller, as on these build machines), where the job gets a cgroup in the ``memory`` and the
``pids`` hierarchies, under the agent's own. Jobs' cgroups are ``flexai-jobs/<job>`` there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("flexai.agent")

ROOT = Path("/sys/fs/cgroup")
JOBS = "flexai-jobs"
V1_CONTROLLERS = ("memory", "pids")


class CgroupError(Exception):
    """A job's cgroup could not be made; the message says why."""


@dataclass(frozen=True)
class JobCgroup:
    """One job's cgroup: a directory per hierarchy (one on v2, memory's and pids' on v1)."""

    directories: tuple[Path, ...]
    version: int

    @property
    def memory(self) -> Path:
        return self.directories[0]

    @property
    def procs_files(self) -> tuple[Path, ...]:
        """Where a process writes its pid to join the job's cgroup, in every hierarchy."""
        return tuple(directory / "cgroup.procs" for directory in self.directories)

    def create(self, memory_bytes: int | None, pids: int | None) -> None:
        try:
            for directory in self.directories:
                directory.mkdir(parents=True, exist_ok=True)
            if self.version == 2:
                _write_if(self.memory / "memory.max", memory_bytes)
                _write_if(self.memory / "memory.swap.max", 0 if memory_bytes else None)
                _write_if(self.memory / "pids.max", pids)
            else:
                _write_if(self.memory / "memory.limit_in_bytes", memory_bytes)
                _write_if(self.memory / "memory.memsw.limit_in_bytes", memory_bytes)
                _write_if(self.directories[1] / "pids.max", pids)
        except OSError as error:
            raise CgroupError(f"cannot set up the job's cgroup {self.memory}: {error}") from None

    def memory_limit(self) -> int | None:
        """The limit set on its memory (None: none)."""
        name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        try:
            said = (self.memory / name).read_text().strip()
        except OSError:
            return None
        return int(said) if said.isdigit() and int(said) < 2**62 else None

    def oom_kills(self) -> int:
        """How many of the job's processes the OOM killer ended (its memory limit reached)."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            lines = (self.memory / name).read_text().splitlines()
        except OSError:
            return 0
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def processes(self) -> list[int]:
        found: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(line) for line in procs.read_text().split())
        return sorted(found)

    def kill_all(self, patience: float = 5.0) -> list[int]:
        """SIGKILL every process of the cgroup (``cgroup.kill`` where the kernel has it), again
        until none is left or ``patience`` ran out; the pids still there."""
        kill = self.memory / "cgroup.kill"
        if self.version == 2 and kill.exists():
            with contextlib.suppress(OSError):
                kill.write_text("1")
        deadline = time.monotonic() + patience
        if left := self.processes():
            log.warning("%s: killing what is left in the job's cgroup: %s", self.memory.name,
                        ", ".join(map(str, left)))  # fmt: skip
        while (left := self.processes()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        return self.processes()

    def remove(self) -> None:
        """Once empty: its directories go (a cgroup with a process left stays, said nowhere:
        the next job of that name finds it and reuses it)."""
        for directory in self.directories:
            with contextlib.suppress(OSError):
                directory.rmdir()


@dataclass(frozen=True)
class Cgroups:
    """Where this host lets the agent make jobs' cgroups."""

    version: int
    bases: tuple[Path, ...]
    """The agent's delegated cgroup (v2), or its cgroups in the memory and pids hierarchies."""

    def for_job(self, key: str) -> JobCgroup:
        name = key.replace("/", "_").replace(":", "-")
        return JobCgroup(tuple(base / JOBS / name for base in self.bases), self.version)

    def sweep(self, prefix: str) -> int:
        """Remove the empty cgroups of the jobs named ``prefix...`` (this agent's: its work
        directory's digest) that an agent killed meanwhile left; how many went. One that still
        holds a process (a job that ran on while the agent was down) stays."""
        name = prefix.replace("/", "_").replace(":", "-")
        gone = 0
        for base in self.bases:
            with contextlib.suppress(OSError):
                for folder in (base / JOBS).iterdir():
                    if folder.name.startswith(name) and folder.is_dir():
                        with contextlib.suppress(OSError):
                            folder.rmdir()
                            gone += 1
        return gone

    def describe(self) -> str:
        return f"cgroup v{self.version} ({', '.join(str(base / JOBS) for base in self.bases)})"


def detect(root: Path = ROOT, own: Path = Path("/proc/self/cgroup")) -> Cgroups | str:
    """The cgroups jobs get on this host, or why there are none (said at the agent's start)."""
    try:
        membership = _membership(own.read_text())
    except OSError as error:
        return f"cannot read {own}: {error}"
    if (root / "cgroup.controllers").exists():
        return _v2(root, membership.get("", "/"))
    missing = [name for name in V1_CONTROLLERS if not (root / name / "cgroup.procs").exists()]
    if missing:
        return f"no cgroup v2 at {root}, and no cgroup v1 {' or '.join(missing)} hierarchy"
    bases = tuple(root / name / membership.get(name, "/").lstrip("/") for name in V1_CONTROLLERS)
    for base in bases:
        try:
            (base / JOBS).mkdir(exist_ok=True)
        except OSError as error:
            return f"cannot make {base / JOBS}: {error.strerror}"
    return Cgroups(1, bases)


def _v2(root: Path, own: str) -> Cgroups | str:
    base = root / own.lstrip("/")
    try:
        controllers = set((base / "cgroup.controllers").read_text().split())
        missing = {"memory", "pids"} - controllers
        if missing:
            return f"cgroup v2: {base} is not given the {' and '.join(sorted(missing))} " \
                "controllers (delegate them to the agent, e.g. systemd's Delegate=yes)"  # fmt: skip
        enabled = set((base / "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids"} <= enabled:
            _leave_for_a_leaf(base)
            (base / "cgroup.subtree_control").write_text("+memory +pids")
        jobs = base / JOBS
        jobs.mkdir(exist_ok=True)
        (jobs / "cgroup.subtree_control").write_text("+memory +pids")
    except OSError as error:
        return f"cgroup v2: cannot use {base} ({error.strerror}): delegate it to the agent"
    return Cgroups(2, (base,))


def _leave_for_a_leaf(base: Path) -> None:
    """v2 lets no process sit in a cgroup whose controllers are enabled below it: the agent's
    processes move to a leaf of their own first."""
    leaf = base / "flexai-agent"
    leaf.mkdir(exist_ok=True)
    for pid in (base / "cgroup.procs").read_text().split():
        with contextlib.suppress(OSError):  # gone meanwhile, or a kernel thread
            (leaf / "cgroup.procs").write_text(pid)


def _membership(text: str) -> dict[str, str]:
    """Controller (``""`` for v2's unified hierarchy) -> this process's cgroup path."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


def _write_if(path: Path, value: int | None) -> None:
    if value is None or not path.exists():
        return
    path.write_text(str(value))
