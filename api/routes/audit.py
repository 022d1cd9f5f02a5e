"""Audit: a job's whole history read from the ledger, deleted jobs included."""

from __future__ import annotations

from uuid import UUID

from fastapi import APIRouter

from api.deps import CurrentUser, ServicesDep
from api.schemas import AuditEvent, AuditHistory, AuditJob, AuditJobs
from domain.application import JobNotFound
from domain.model import event_facts, event_name

router = APIRouter(prefix="/v1/audit", tags=["audit"])


@router.get("/jobs")
def jobs_named(name: str, services: ServicesDep, owner: CurrentUser) -> AuditJobs:
    """Every job of yours that ever had this name, deleted ones included."""
    rows = services.queries.jobs_ever_named(owner, name)
    return AuditJobs(
        jobs=[
            AuditJob(
                id=row["id"], name=row["name"], status=row["status"],
                created_at=row["created_at"], deleted=row["deleted_at"] is not None,
            )  # fmt: skip
            for row in rows
        ]
    )


@router.get("/jobs/{job_id}")
def job_history(job_id: UUID, services: ServicesDep, owner: CurrentUser) -> AuditHistory:
    """The job's events, oldest first, straight from the ledger."""
    events = services.jobs.history(job_id)
    submitted = events[0]
    if getattr(submitted, "owner", None) != owner and owner != "admin":
        raise JobNotFound(f"with id {job_id}")
    return AuditHistory(
        id=str(job_id),
        events=[
            AuditEvent(
                version=event.originator_version,
                type=event_name(event),
                at=event.timestamp.isoformat(),
                by=getattr(event, "by", None),
                facts=event_facts(event),
            )
            for event in events
        ],
    )


