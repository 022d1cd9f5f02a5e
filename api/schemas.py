"""Request and response bodies: ``JobCreate``, ``JobPublic``, ``JobsPublic``, ..."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class JobCreate(BaseModel):
    name: str = Field(description="3-63 of [A-Za-z0-9_-], starting and ending alphanumeric")
    repository_url: str = Field(min_length=1)
    repository_revision: str | None = None
    requirements_path: str = "requirements.txt"
    accels: int = Field(default=1, ge=1)
    nodes: int = Field(default=1, ge=1)
    env: dict[str, str] = Field(default_factory=dict)
    secrets: dict[str, str] = Field(default_factory=dict)
    datasets: list[str] = Field(default_factory=list)
    checkpoint: str | None = None
    entry_point: list[str] = Field(min_length=1)


class Actor(BaseModel):
    kind: str
    id: str


class HistoryEntry(BaseModel):
    event: str
    status: str
    at: str
    by: Actor
    facts: dict[str, Any]


class Failure(BaseModel):
    code: str
    message: str


class JobSummary(BaseModel):
    id: str
    name: str
    status: str
    accels: int
    nodes: int
    node: str | None
    created_at: str
    started_at: str | None
    ended_at: str | None
    duration_seconds: float | None


class JobPublic(JobSummary):
    owner: str
    spec: dict[str, Any]
    commit: str | None
    accelerators: list[int]
    updated_at: str
    failure: Failure | None
    stop: dict[str, Any] | None
    history: list[HistoryEntry]


class JobsPublic(BaseModel):
    jobs: list[JobSummary]
    count: int


class JobDeleted(BaseModel):
    id: str
    name: str
    deleted_at: str


class CheckpointPublic(BaseModel):
    id: str
    name: str
    node: str | None
    step: int | None
    train_loss: float | None
    eval_loss: float | None
    model: str | None
    version: str | None
    inference_ready: bool
    size: int | None
    created_at: str


class CheckpointsPublic(BaseModel):
    checkpoints: list[CheckpointPublic]


class AuditJob(BaseModel):
    id: str
    name: str
    status: str
    created_at: str
    deleted: bool


class AuditJobs(BaseModel):
    jobs: list[AuditJob]


class AuditEvent(BaseModel):
    version: int
    type: str
    at: str
    by: Actor | None
    facts: dict[str, Any]


class AuditHistory(BaseModel):
    id: str
    events: list[AuditEvent]


class NodeRegister(BaseModel):
    name: str = Field(min_length=1, max_length=253)
    accels: int = Field(ge=0)
    accel_type: str = "cpu"


class NodeRegistered(BaseModel):
    node_id: str
    name: str


class Assignment(BaseModel):
    job_id: str
    name: str
    status: str
    spec: dict[str, Any]
    input_checkpoint_id: str | None


class Assignments(BaseModel):
    assignments: list[Assignment]


class Report(BaseModel):
    node_id: str
    type: Literal[
        "enqueued", "started", "build_failed", "exited", "failed", "stopped", "stop_failed"
    ]
    commit: str | None = None
    accelerators: list[int] = Field(default_factory=list)
    exit_code: int | None = None
    code: str | None = None
    message: str | None = None


class ReportAccepted(BaseModel):
    status: str


class Size(BaseModel):
    size: int


class NodePublic(BaseModel):
    id: str
    name: str
    accels: int
    accel_type: str
    busy_accels: int
    alive: bool
    registered_at: str


class NodesPublic(BaseModel):
    nodes: list[NodePublic]
