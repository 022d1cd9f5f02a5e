"""The shapes the agent works with: assignments from the control plane and a job's directories.

The wire format is the one in ``docs/design.md`` (Assignment, JobCreate without its name); these
classes parse it once, so the rest of the agent never touches raw dictionaries.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from common.attempts import FIRST, IN_FILES, attempt_key, current_attempt
from common.contract import Status
from common.job_spec import JobSpec as JobSpec  # the server's own: one type, one set of defaults

BUILDING = Status.BUILDING
ENQUEUED = Status.ENQUEUED
IN_PROGRESS = Status.IN_PROGRESS
STOP_IN_PROGRESS = Status.STOP_IN_PROGRESS

MARKER_VARIABLE = "FLEXAI_JOB_MARKER"
"""Reserved: the agent sets it in the environment of every process of a job (a user's value is
replaced), so the job's processes are found, and ended, even once they have left its process
group, and by an agent that restarted meanwhile."""


@dataclass(frozen=True)
class Rendezvous:
    """Where the nodes of a multi-node job meet: node 0's address and the port it picked."""

    master_addr: str
    master_port: int

    @classmethod
    def from_json(cls, data: Any) -> Rendezvous | None:
        if not isinstance(data, Mapping) or not data.get("master_addr"):
            return None
        return cls(str(data["master_addr"]), int(data["master_port"]))


@dataclass(frozen=True)
class Assignment:
    """One of this node's jobs, as the control plane lists it."""

    job_id: str
    name: str
    status: str
    spec: JobSpec
    input_checkpoint_id: str | None = None
    node_index: int = 0
    """This node's place in the job: 0 for a single-node job."""
    nnodes: int = 1
    accelerators: tuple[int, ...] | None = None
    """The indices the control plane allocated on this node, once the job is in progress."""
    rendezvous: Rendezvous | None = None
    """A multi-node job's meeting point, once it is in progress."""
    attempt: int = 1
    """The job's current attempt, from 1: one more each time it is preempted or retried."""
    preempt: bool = False
    """The job is in progress and this node is asked to stop it for a higher-priority job: it
    goes back to enqueued, keeps its build here, and runs again from its last checkpoint."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Assignment:
        return cls(
            job_id=str(data["job_id"]),
            name=str(data.get("name") or data["job_id"]),
            status=str(data["status"]),
            spec=JobSpec.from_dict(data.get("spec") or {}),
            input_checkpoint_id=data.get("input_checkpoint_id") or None,
            node_index=int(data.get("node_index") or 0),
            nnodes=int(data.get("nnodes") or 1),
            accelerators=indices(data.get("accelerators")),
            rendezvous=Rendezvous.from_json(data.get("rendezvous")),
            attempt=max(FIRST, current_attempt(data)),
            preempt=bool(data.get("preempt")),
        )


@dataclass(frozen=True)
class JobDirs:
    """``<work-dir>/jobs/<job_id>/`` and the directories the design names inside it, and the
    agent's own scratch directory for the job, ``<work-dir>/scratch/<job_id>/``."""

    root: Path
    scratch: Path
    """Zips waiting for upload or unpacking: outside the job's directory, where the job (which
    owns its directory and could plant a link there) never reaches."""
    marker: str = ""
    """The value of :data:`MARKER_VARIABLE` for this job's processes on this node."""
    attempt: int = 1
    """The job's attempt these directories are for: each attempt after the first has its own
    log, output and checkpoint folders (``job.attempt-2.log``, ``output.attempt-2``...), and
    shares the build (repository, venv) and the inputs."""

    @classmethod
    def for_job(cls, work_dir: Path, job_id: str, node_index: int = 0,
                attempt: int = 1) -> JobDirs:  # fmt: skip
        marker = f"{marker_prefix(work_dir)}{job_id}:{node_index}"
        return cls(work_dir / "jobs" / job_id, work_dir / "scratch" / job_id, marker, attempt)

    def for_attempt(self, attempt: int) -> JobDirs:
        """The same job's directories for another attempt."""
        return replace(self, attempt=attempt)

    def _of_attempt(self, name: str) -> Path:
        return self.root / attempt_key(name, self.attempt, IN_FILES)

    @property
    def repo(self) -> Path:
        return self.root / "repo"

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def venv_bin(self) -> Path:
        return self.venv / "bin"

    @property
    def venv_python(self) -> Path:
        return self.venv_bin / "python"

    @property
    def output(self) -> Path:
        return self._of_attempt("output")

    @property
    def output_checkpoint(self) -> Path:
        return self._of_attempt("output-checkpoint")

    @property
    def input_checkpoint(self) -> Path:
        return self._of_attempt("input-checkpoint")

    @property
    def attempt_folders(self) -> tuple[Path, ...]:
        """The folders each attempt has of its own."""
        return (self.output, self.output_checkpoint, self.input_checkpoint)

    @property
    def input(self) -> Path:
        return self.root / "input"

    @property
    def home(self) -> Path:
        """The job's ``HOME``: its own, not the agent's (where the agent's client config is)."""
        return self.root / "home"

    @property
    def log_file(self) -> Path:
        """Everything this attempt of the job printed (build and run), the shipper's source of
        truth: ``job.log`` for the first attempt, ``job.attempt-K.log`` for attempt K."""
        return self.root / f"{attempt_key('job', self.attempt, IN_FILES)}.log"

    def is_log(self, path: Path) -> bool:
        """Whether ``path`` is the log of one of the job's attempts."""
        return path.parent == self.root and _is_log_name(path.name)

    def earlier_logs(self) -> list[Path]:
        """The logs of this job's earlier attempts on this node, kept for its operator."""
        return [self.for_attempt(earlier).log_file for earlier in range(FIRST, self.attempt)]

    @property
    def checkpoint_record(self) -> Path:
        """The checkpoints this attempt uploaded and what each looked like then, kept by the
        agent (:class:`node_agent.artifacts.checkpoints.CheckpointWatcher`) across its
        restarts, in its own scratch folder: the job cannot write it."""
        return self.scratch / f"{attempt_key('checkpoints', self.attempt, IN_FILES)}.json"

    @property
    def exit_code_file(self) -> Path:
        """Written by the shim once the entry point has ended: its return code."""
        return self.root / "exit-code"

    @property
    def shim_pid_file(self) -> Path:
        """The pid of the shim that runs the entry point, written by the shim at its start (in
        a sandbox, its pid there: it says the entry point was started)."""
        return self.root / "shim.pid"

    @property
    def sandbox_pid_file(self) -> Path:
        """A sandboxed shim's pid on this host, as the agent learnt it from bubblewrap."""
        return self.scratch / "shim.pid"

    def create_fresh(self) -> None:
        """Start from empty directories (a rebuild after an agent restart included), each the
        agent's alone until the job's directory is handed to the job's user. The logs of
        earlier attempts of the job on this node (a retry) are kept, and this attempt's own:
        the control plane may hold its start already, so a rebuild appends to it."""
        kept = self.scratch.with_name(f"{self.scratch.name}.logs")
        if kept.exists():
            shutil.rmtree(kept)
        logs = (*self.earlier_logs(), self.log_file)
        earlier = [log_file for log_file in logs if _is_agents_file(log_file)]
        if earlier:  # a first attempt makes no folder for none (each costs: see gitmirror)
            kept.mkdir(parents=True, mode=0o700)
            for log_file in earlier:
                os.rename(log_file, kept / log_file.name)
        for directory in (self.root, self.scratch):
            if directory.exists():
                shutil.rmtree(directory)
            directory.mkdir(parents=True)
            directory.chmod(0o700)
        if earlier:
            for log_file in kept.iterdir():
                os.rename(log_file, self.root / log_file.name)
            kept.rmdir()
        for directory in (*self.attempt_folders, self.input, self.home / ".config"):
            directory.mkdir(parents=True)

    def create_attempt(self) -> None:
        """Fresh folders for a later attempt of a job built here (after a preemption); its
        log, exit code and shim's pid start anew too."""
        for directory in self.attempt_folders:
            if directory.is_symlink() or directory.is_file():
                directory.unlink()
            elif directory.exists():
                shutil.rmtree(directory)
            directory.mkdir(mode=0o700)
        for stale in (self.log_file, self.exit_code_file, self.shim_pid_file,
                      self.sandbox_pid_file):  # fmt: skip
            stale.unlink(missing_ok=True)

    def remove_all_but_log(self) -> None:
        """Free the disk once the job is over; the log stays for the node's operator."""
        shutil.rmtree(self.scratch, ignore_errors=True)
        if not self.root.exists():
            return
        for child in self.root.iterdir():
            if _is_log_name(child.name) and _is_agents_file(child):
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)


def _is_log_name(name: str) -> bool:
    return name == "job.log" or (name.startswith(f"job{IN_FILES}") and name.endswith(".log"))


def _is_agents_file(path: Path) -> bool:
    """A plain file of the agent's own (not one the job planted)."""
    try:
        status = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(status.st_mode) and status.st_uid == os.geteuid()


def marker_prefix(work_dir: Path) -> str:
    """What the markers of the jobs of the agent using ``work_dir`` start with: another agent
    on the host (its own work directory) never takes them for its own."""
    digest = hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:12]
    return f"{digest}:"


def marked_job(marker: str, work_dir: Path) -> str | None:
    """The id of the job a marker of this agent's names; None for another agent's marker."""
    prefix = marker_prefix(work_dir)
    if not marker.startswith(prefix):
        return None
    return marker[len(prefix) :].rsplit(":", 1)[0] or None


def indices(value: Any) -> tuple[int, ...] | None:
    """A list of accelerator indices from the wire; None when there is none (not yet)."""
    if not isinstance(value, list | tuple):
        return None
    return tuple(int(index) for index in value)

