"""The shapes the agent works with: assignments from the control plane and a job's directories.

The wire format is the one in ``docs/design.md`` (Assignment, JobCreate without its name); these
classes parse it once, so the rest of the agent never touches raw dictionaries.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUILDING = "building"
ENQUEUED = "enqueued"
IN_PROGRESS = "in progress"
STOP_IN_PROGRESS = "stop in progress"

DEFAULT_REQUIREMENTS_PATH = "requirements.txt"


@dataclass(frozen=True)
class JobSpec:
    """What the user asked for (JobCreate without the name)."""

    repository_url: str
    entry_point: tuple[str, ...]
    repository_revision: str | None = None
    requirements_path: str = DEFAULT_REQUIREMENTS_PATH
    accels: int = 1
    nodes: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict)
    datasets: tuple[str, ...] = ()
    dataset_hashes: Mapping[str, str] = field(default_factory=dict)
    """The version of each pushed dataset the job was submitted with, by content hash."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        return cls(
            repository_url=str(data.get("repository_url") or ""),
            entry_point=tuple(str(part) for part in data.get("entry_point") or ()),
            repository_revision=data.get("repository_revision") or None,
            requirements_path=data.get("requirements_path") or DEFAULT_REQUIREMENTS_PATH,
            accels=int(_default(data.get("accels"), 1)),
            nodes=int(_default(data.get("nodes"), 1)),
            env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
            secrets={str(k): str(v) for k, v in (data.get("secrets") or {}).items()},
            datasets=tuple(str(name) for name in data.get("datasets") or ()),
            dataset_hashes={
                str(k): str(v) for k, v in (data.get("dataset_hashes") or {}).items()
            },
        )


@dataclass(frozen=True)
class Assignment:
    """One of this node's jobs, as the control plane lists it."""

    job_id: str
    name: str
    status: str
    spec: JobSpec
    input_checkpoint_id: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Assignment:
        return cls(
            job_id=str(data["job_id"]),
            name=str(data.get("name") or data["job_id"]),
            status=str(data["status"]),
            spec=JobSpec.from_json(data.get("spec") or {}),
            input_checkpoint_id=data.get("input_checkpoint_id") or None,
        )


@dataclass(frozen=True)
class JobDirs:
    """``<work-dir>/jobs/<job_id>/`` and the directories the design names inside it, and the
    agent's own scratch directory for the job, ``<work-dir>/scratch/<job_id>/``."""

    root: Path
    scratch: Path
    """Zips waiting for upload or unpacking: outside the job's directory, where the job (which
    owns its directory and could plant a link there) never reaches."""

    @classmethod
    def for_job(cls, work_dir: Path, job_id: str) -> JobDirs:
        return cls(work_dir / "jobs" / job_id, work_dir / "scratch" / job_id)

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
        return self.root / "output"

    @property
    def output_checkpoint(self) -> Path:
        return self.root / "output-checkpoint"

    @property
    def input_checkpoint(self) -> Path:
        return self.root / "input-checkpoint"

    @property
    def input(self) -> Path:
        return self.root / "input"

    @property
    def home(self) -> Path:
        """The job's ``HOME``: its own, not the agent's (where the agent's client config is)."""
        return self.root / "home"

    @property
    def log_file(self) -> Path:
        """Everything the job printed (build and run), the shipper's source of truth."""
        return self.root / "job.log"

    def create_fresh(self) -> None:
        """Start from empty directories (a rebuild after an agent restart included), each the
        agent's alone until the job's directory is handed to the job's user."""
        for directory in (self.root, self.scratch):
            if directory.exists():
                shutil.rmtree(directory)
            directory.mkdir(parents=True)
            directory.chmod(0o700)
        for directory in (
            self.output,
            self.output_checkpoint,
            self.input_checkpoint,
            self.input,
            self.home / ".config",
        ):
            directory.mkdir(parents=True)

    def remove_all_but_log(self) -> None:
        """Free the disk once the job is over; the log stays for the node's operator."""
        shutil.rmtree(self.scratch, ignore_errors=True)
        if not self.root.exists():
            return
        for child in self.root.iterdir():
            if child == self.log_file:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value
