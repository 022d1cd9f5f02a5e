"""What the application's commands answer: the outcome of a command, and a job not found."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from domain.errors import DomainError


class JobNotFound(DomainError):
    def __init__(self, what: str) -> None:
        super().__init__(f"no job {what}; `flexai training list` shows your jobs")


@dataclass(frozen=True)
class Outcome:
    """What a command did: the job it touched and the ledger position of its last event
    (None when it recorded nothing, as an idempotent resend does)."""

    job_id: UUID
    position: int | None
