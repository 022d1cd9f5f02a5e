"""A job's folders on this node: ``<work-dir>/jobs/<job_id>/`` (each attempt's log, output and
checkpoint folders beside the build they share) and the agent's scratch folder for it; made
fresh for a build or an attempt, and removed, but for the logs, once the job is over.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, replace
from pathlib import Path

from common.attempts import FIRST, IN_FILES, attempt_key
from node_agent.models import marker_prefix


@dataclass(frozen=True)
class JobDirs:
    """``<work-dir>/jobs/<job_id>/`` and the directories the design names inside it, and the
    agent's own scratch directory for the job, ``<work-dir>/scratch/<job_id>/``."""

    root: Path
    scratch: Path
    """Zips waiting for upload or unpacking: outside the job's directory, where the job (which
    owns its directory and could plant a link there) never reaches."""
    marker: str = ""
    """The value of :data:`node_agent.models.MARKER_VARIABLE` for this job's processes on this
    node."""
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
