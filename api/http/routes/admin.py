"""Administration of the control plane, admins' alone: the views, the ledger's integrity and
deleted jobs' artifacts (users and tokens: :mod:`api.http.routes.identity`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from api.http.deps import CurrentAdmin, ServicesDep
from api.http.problems import Problem
from api.http.sharing_schemas import STRICT
from api.ledger.purge import purge_deleted
from api.ledger.verify import verify_ledger
from domain.actors import user
from projections.rebuild import RebuildRunning

router = APIRouter(prefix="/v1/admin", tags=["admin"])


class VerifyRequest(BaseModel):
    model_config = STRICT

    expect_digest: str | None = Field(default=None, max_length=128, pattern=r"^[0-9a-f]*$")
    """The head digest an earlier verify printed: a ledger whose chain was rewritten since
    no longer ends in it."""
    artifacts: Literal["none", "shallow", "deep"] = "shallow"
    """Look for every artifact the ledger names in the store: with its size (``shallow``), and
    its SHA-256 too (``deep``: every object read whole), or not at all (``none``)."""


class ArtifactProblem(BaseModel):
    job: str | None
    """The job's id; None for a dataset."""
    name: str | None
    """The job's name, or the dataset's ``owner/name``."""
    kind: str
    """``checkpoint``, ``output`` or ``dataset``."""
    key: str
    problem: str


class VerifyAnswer(BaseModel):
    ok: bool
    events: int
    chained: int
    unchained_before: int | None
    """Events before this position were written before the ledger kept its chain."""
    head_digest: str | None
    jobs: int
    ledger_problems: list[str]
    view_differences: list[str]
    artifacts: str
    artifacts_checked: int
    """How many artifacts the ledger names (those of purged jobs left out)."""
    artifact_problems: list[ArtifactProblem]
    """Each artifact missing from the store, or there with another size or SHA-256."""


class PurgeRequest(BaseModel):
    deleted_before: datetime
    """Purge the artifacts of jobs deleted before this moment (naive: UTC)."""


class PurgedJob(BaseModel):
    id: str
    owner: str
    name: str
    deleted_at: str
    objects: int
    """How many objects of its left the store (logs, checkpoints, outputs)."""


class PurgeAnswer(BaseModel):
    deleted_before: str
    purged: list[PurgedJob]
    """The jobs purged now, oldest deletion first (those purged before are not again)."""


@router.post("/rebuild-projections", status_code=202)
def rebuild_projections(services: ServicesDep, _: CurrentAdmin) -> dict[str, Any]:
    """Rebuild every view from the first event into fresh tables, in the background, then swap
    them in at once (readers never see empty views). ``GET`` the same path for its progress."""
    assert services.rebuilder is not None
    try:
        return services.rebuilder.start().to_json()
    except RebuildRunning:
        raise Problem(
            409, "rebuild-running", "A rebuild is running",
            "the views are being rebuilt already; `GET /v1/admin/rebuild-projections` (or "
            "`flexai admin rebuild-projections --status`) follows it",
        ) from None  # fmt: skip


@router.get("/rebuild-projections")
def rebuild_progress(services: ServicesDep, _: CurrentAdmin) -> dict[str, Any]:
    """The last rebuild of the views on this server: its state, how far it got, rows swapped
    in, how long it took, and its error if it failed."""
    assert services.rebuilder is not None
    return services.rebuilder.progress.to_json()


@router.post("/verify")
def verify(services: ServicesDep, _: CurrentAdmin, body: VerifyRequest | None = None) -> Any:
    """Recompute the ledger's hash chain from the stored rows, naming the first event that was
    altered, deleted, inserted or reordered, and compare every job folded from the ledger with
    the views."""
    body = body or VerifyRequest()
    verified = verify_ledger(services.ledger_parts(), expect_digest=body.expect_digest or None,
                             artifacts=body.artifacts)  # fmt: skip
    return VerifyAnswer(**verified)


@router.post("/purge")
def purge(services: ServicesDep, admin: CurrentAdmin, body: PurgeRequest) -> PurgeAnswer:
    """Remove the artifacts of the jobs deleted before ``deleted_before`` from the store and
    record ``ArtifactsPurged`` on each (a job is purged once; its history stays)."""
    before = _in_utc(body.deleted_before)
    assert admin.user is not None
    purged = purge_deleted(services.ledger_parts(), before, by=user(admin.user))
    return PurgeAnswer(deleted_before=before.isoformat(),
                       purged=[PurgedJob(**job) for job in purged])  # fmt: skip


def _in_utc(moment: datetime) -> datetime:
    try:
        return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
    except OverflowError:
        raise Problem(422, "invalid-request", "Invalid moment",
                      f"deleted_before: {moment.isoformat()} is outside the years 1 to 9999 "
                      "once in UTC", field="deleted_before") from None  # fmt: skip
