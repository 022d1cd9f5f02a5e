"""A job's history read back from the ledger: the job as it was at one version or moment
(time travel: ``flexai training inspect --at``), and the errors of a version it never had."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from eventsourcing.domain import DomainEvent

from domain.errors import DomainError
from domain.job import TrainingJob


class BeforeJobCreated(DomainError):
    """A moment before the job's first event."""

    def __init__(self, job_id: UUID, at: datetime, created_at: datetime) -> None:
        self.created_at = created_at
        super().__init__(
            f"job {job_id} did not exist yet at {at.isoformat()}: it was created at "
            f"{created_at.isoformat()}; ask for that moment or a later one"
        )


class VersionOutOfRange(DomainError):
    """A version the job's history does not hold."""

    def __init__(self, job_id: UUID, version: int, latest: int) -> None:
        self.latest = latest
        super().__init__(
            f"job {job_id} has no version {version}: its versions run from 1 to {latest}"
        )


@dataclass(frozen=True)
class PastJob:
    """A job as the ledger held it at one version: the aggregate folded up to that event."""

    job: TrainingJob
    event: DomainEvent
    """The event that made this version."""
    latest: int
    created_at: datetime


def version_at(
    job_id: UUID, events: list[DomainEvent], version: int | None, at: datetime | None
) -> int:
    """The version of the job whose history is ``events``: ``version``, or that of its last
    event recorded at or before ``at`` (timezone-aware); the latest when neither is given."""
    created_at, latest = events[0].timestamp, events[-1].originator_version
    if at is not None:
        reached = [event for event in events if event.timestamp <= at]
        if not reached:
            raise BeforeJobCreated(job_id, at, created_at)
        version = reached[-1].originator_version
    version = latest if version is None else version
    if not 1 <= version <= latest:
        raise VersionOutOfRange(job_id, version, latest)
    return version
