"""The jobs page (``/``) and the nodes page (``/nodes``), read from the views only.

The jobs page is one keyset page of ``job_list`` (the cursor of ``GET /v1/jobs``), newest
first, filtered by status and name prefix; a user sees their own jobs, an admin everyone's
(with an owner column and filter).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from api.console.auth import Signed, services_of, signed_in, to_sign_in
from api.console.present import WAITING, cell, moment, summary_row
from api.console.render import page
from api.http.cursors import InvalidCursor, decode_cursor, encode_cursor
from api.services import Services
from domain.statuses import Status

router = APIRouter(include_in_schema=False)
PAGE_SIZE = 50
HOLDING = frozenset({Status.IN_PROGRESS.value, Status.STOP_IN_PROGRESS.value})


def _statuses(values: list[str]) -> list[Status]:
    known = {status.value: status for status in Status}
    return [known[value] for value in values if value in known]


def jobs_context(
    services: Services, signed: Signed, status: list[str], name: str, owner: str,
    cursor: str, limit: int,
) -> dict[str, Any]:  # fmt: skip
    """What the jobs page shows: one page of rows, the filters, the next page's link."""
    wanted = _statuses(status)
    whose: str | None = signed.user
    if signed.admin:
        whose = owner or None  # an admin sees every owner's unless filtering on one
    error = None
    try:
        after = decode_cursor(cursor) if cursor else None
    except InvalidCursor:
        after, error = None, "That page link is out of date: here is the first page."
    name = name[:63]
    rows = services.queries.page_jobs(whose, limit + 1, after=after, statuses=wanted,
                                      name_prefix=name)  # fmt: skip
    shown, more = rows[:limit], len(rows) > limit
    reasons = services.waits.reasons(row["id"] for row in shown if row["status"] in WAITING)
    next_cursor = encode_cursor(shown[-1]["created_at"], shown[-1]["id"]) if more else None
    return {
        "signed": signed,
        "rows": [summary_row(row, reasons.get(row["id"])) for row in shown],
        "statuses": [status.value for status in Status],
        "wanted": {status.value for status in wanted},
        "name": name,
        "owner": owner if signed.admin else "",
        "next_cursor": next_cursor,
        "paged": bool(after),
        "error": error,
        "limit": limit,
    }


@router.get("/")
async def jobs_page(
    request: Request,
    status: Annotated[list[str] | None, Query()] = None,
    name: Annotated[str, Query(max_length=200)] = "",
    owner: Annotated[str, Query(max_length=63)] = "",
    cursor: Annotated[str, Query(max_length=1024)] = "",
    limit: Annotated[int, Query(ge=1, le=500)] = PAGE_SIZE,
) -> Response:
    def build() -> dict[str, Any] | None:
        signed = signed_in(request)
        if signed is None:
            return None
        return jobs_context(services_of(request), signed, status or [], name, owner, cursor,
                            limit)  # fmt: skip

    context = await run_in_threadpool(build)
    if context is None:
        return to_sign_in(request)
    return page("jobs.html", **context)


def node_rows(services: Services, signed: Signed) -> list[dict[str, Any]]:
    """Each node: its accelerators, which jobs hold them (another user's unnamed), its last
    heartbeat, and whether it is live or lost."""
    timeout = services.settings.node_timeout_s
    live = services.state.live_nodes(timeout)
    seen = services.state.last_seen()
    rows = []
    for node in sorted(services.queries.nodes(), key=lambda row: row["name"]):
        holders = services.queries.holders(node["id"])
        held = [_holder(holder, signed) for holder in holders if holder["status"] in HOLDING]
        waiting = [_holder(holder, signed) for holder in holders
                   if holder["status"] not in HOLDING]  # fmt: skip
        in_use = sum(len(holder["accelerators"]) for holder in held)
        rows.append({
            "name": node["name"], "accel_type": node["accel_type"], "accels": node["accels"],
            "free": max(int(node["accels"]) - in_use, 0), "held": held, "waiting": waiting,
            "alive": node["id"] in live, "last_seen": moment(seen.get(node["id"])),
            "registered": moment(node["registered_at"]), **_isolation(node.get("isolation")),
        })  # fmt: skip
    return rows


def _isolation(stored: str | None) -> dict[str, str]:
    """How the node's agent keeps jobs apart, as `flexai admin node list` shows it."""
    said = json.loads(stored) if stored else {}
    return {"isolation": str(said.get("level") or "unknown"),
            "isolation_detail": str(said.get("detail") or "an agent from before isolation "
                                                          "levels")}  # fmt: skip


def _holder(holder: dict[str, Any], signed: Signed) -> dict[str, Any]:
    visible = signed.admin or holder["owner"] == signed.user
    return {
        "name": holder["name"] if visible else None,
        "owner": holder["owner"] if signed.admin else None,
        "status": holder["status"],
        "accelerators": list(holder["allocated"] or []),
        "indices": cell(list(holder["allocated"] or [])),
        "asks": holder["accels"],
    }


@router.get("/nodes")
async def nodes_page(request: Request) -> Response:
    def build() -> dict[str, Any] | None:
        signed = signed_in(request)
        if signed is None:
            return None
        return {"signed": signed, "nodes": node_rows(services_of(request), signed)}

    context = await run_in_threadpool(build)
    if context is None:
        return to_sign_in(request)
    return page("nodes.html", **context)
