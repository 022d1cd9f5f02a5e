"""Administration of the control plane, admins' alone: the views and the ledger's integrity
(users and tokens: :mod:`api.http.routes.identity`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from api.http.deps import CurrentAdmin, ServicesDep
from api.http.problems import Problem
from api.ledger.verify import verify_ledger
from projections.rebuild import RebuildRunning

router = APIRouter(prefix="/v1/admin", tags=["admin"])


class VerifyRequest(BaseModel):
    expect_digest: str | None = Field(default=None, max_length=128, pattern=r"^[0-9a-f]*$")
    """The head digest an earlier verify printed: a ledger whose chain was rewritten since
    no longer ends in it."""


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
    expect = body.expect_digest if body else None
    return VerifyAnswer(**verify_ledger(services, expect_digest=expect or None))
