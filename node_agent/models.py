"""The shapes the agent works with: assignments from the control plane as the wire has them,
and the marker each job's processes carry.

The wire format is the one in ``docs/design.md`` (Assignment, JobCreate without its name); these
classes parse it once, so the rest of the agent never touches raw dictionaries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.attempts import FIRST, current_attempt
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

