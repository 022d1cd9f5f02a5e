"""Answers of the audit routes that fold the ledger: ``AuditJobState``, a job as it was."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from api.http.schemas import Actor


class AuditPlacement(BaseModel):
    """One node of the job as the aggregate held it."""

    index: int
    node_id: str | None
    node: str | None
    address: str | None = None
    built: bool = False
    accelerators: list[int] = Field(default_factory=list)
    exit_code: int | None = None
    stopped: bool = False


class AuditFailure(BaseModel):
    code: str
    message: str


class AuditJobState(BaseModel):
    """A job folded from the ledger up to one version, never read from the views."""

    id: str
    name: str
    owner: str
    version: int
    """The version shown: the number of events folded."""
    latest_version: int
    as_of: str
    """The moment asked for (UTC), or the time of this version's event when a version was."""
    event: str
    """The event that made this version."""
    event_at: str
    event_by: Actor | None
    created_at: str
    status: str
    deleted: bool
    spec: dict[str, Any]
    commit: str | None
    node: str | None
    placements: list[AuditPlacement]
    accelerators: list[int]
    failure: AuditFailure | None
    checkpoint_ids: list[str]
