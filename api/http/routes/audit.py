"""Audit: a job's whole history read from the ledger, deleted jobs included."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query, Response

from api.http.attempts import UserAttempt
from api.http.audit_schemas import AuditFailure, AuditJobState, AuditPlacement
from api.http.deps import CurrentCaller, CurrentUser, JobOwner, ServicesDep
from api.http.downloads import ANSWERS, OutputIndex, output_answer
from api.http.problems import Problem
from api.http.schemas import AuditEvent, AuditHistory, AuditJob, AuditJobs
from domain.events import event_facts, event_name
from domain.history import BeforeJobCreated, PastJob, VersionOutOfRange
from domain.outcomes import JobNotFound
from domain.values import BIGINT_MAX

router = APIRouter(prefix="/v1/audit", tags=["audit"])


@router.get("/jobs")
def jobs_named(name: str, services: ServicesDep, owner: JobOwner) -> AuditJobs:
    """Every job of yours (an admin: of ``owner``) that ever had this name, deleted ones
    included."""
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
def job_history(
    job_id: UUID, services: ServicesDep, caller: CurrentCaller, me: CurrentUser
) -> AuditHistory:
    """The job's events, oldest first, straight from the ledger (yours; an admin: any's)."""
    events = services.jobs.history(job_id)
    if getattr(events[0], "owner", None) != me and not caller.admin:
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


@router.get("/jobs/{job_id}/outputs/{node_index}", response_class=Response, responses=ANSWERS)
def job_outputs_by_id(
    job_id: UUID, node_index: OutputIndex, services: ServicesDep, caller: CurrentCaller,
    me: CurrentUser, attempt: UserAttempt = None,
) -> Response:  # fmt: skip
    """A job's output archive by the job's id, deleted or not (yours; an admin: any's), for
    audit: as ``GET /v1/jobs/{name}/outputs/{node_index}`` (``attempt`` too); 410 once its
    artifacts were purged."""
    document = services.queries.job(str(job_id))
    if document is None or (document["owner"] != me and not caller.admin):
        raise JobNotFound(f"with id {job_id}")
    return output_answer(services, document, node_index, attempt)


@router.get("/jobs/{job_id}/state")
def job_state(
    job_id: UUID, services: ServicesDep, caller: CurrentCaller, me: CurrentUser,
    version: Annotated[int | None, Query(ge=-BIGINT_MAX - 1, le=BIGINT_MAX)] = None,
    at: datetime | None = None,
) -> AuditJobState:  # fmt: skip
    """The job as it was at a version or a moment (naive: UTC), folded from the ledger."""
    if version is not None and at is not None:
        raise Problem(422, "invalid-request", "Invalid request",
                      "give either version or at, not both")  # fmt: skip
    moment = None if at is None else _in_utc(at)
    try:
        past = services.jobs.job_as_of(job_id, version=version, at=moment,
                                       owner=None if caller.admin else me)  # fmt: skip
    except BeforeJobCreated as error:
        raise Problem(404, "job-not-yet-created", "Job not created yet", str(error),
                      created_at=error.created_at.isoformat()) from None  # fmt: skip
    except VersionOutOfRange as error:
        raise Problem(422, "version-out-of-range", "Version out of range", str(error),
                      first_version=1, latest_version=error.latest) from None  # fmt: skip
    return _state(job_id, past, moment)


def _in_utc(at: datetime) -> datetime:
    """The moment in UTC (naive: UTC already); 422 for one that UTC cannot hold."""
    try:
        return at.astimezone(UTC) if at.tzinfo else at.replace(tzinfo=UTC)
    except OverflowError:
        raise Problem(
            422, "invalid-request", "Invalid moment",
            f"at: {at.isoformat()} is outside the years 1 to 9999 once in UTC; give a moment "
            "within them", field="at",
        ) from None  # fmt: skip


def _state(job_id: UUID, past: PastJob, moment: datetime | None) -> AuditJobState:
    job = past.job
    event_at = past.event.timestamp
    return AuditJobState(
        id=str(job_id), name=job.name, owner=job.owner,
        version=job.version, latest_version=past.latest,
        as_of=(moment or event_at).astimezone(UTC).isoformat(),
        event=event_name(past.event), event_at=event_at.isoformat(),
        event_by=getattr(past.event, "by", None),
        created_at=past.created_at.isoformat(),
        status=str(job.status), deleted=job.deleted, spec=job.spec, commit=job.commit,
        node=job.node_name,
        placements=[
            AuditPlacement(
                index=index, node_id=placement.get("node_id"),
                node=placement.get("node_name"), address=placement.get("address"),
                built=bool(placement.get("built")),
                accelerators=list(placement.get("accelerators") or []),
                exit_code=placement.get("exit_code"),
                stopped=bool(placement.get("stopped")),
            )
            for index, placement in enumerate(job.placements)
        ],
        accelerators=list(job.accelerators),
        failure=AuditFailure(**job.failure) if job.failure else None,
        checkpoint_ids=sorted(job.checkpoint_ids),
    )  # fmt: skip
