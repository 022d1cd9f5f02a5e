"""A job's page (``/jobs/{name}``), its time travel (``?version=N``), and its actions.

The page reads the views (the job's document, why it waits, its checkpoints) and, for the loss
chart, the newest checkpoint's archive. Its log is one attempt's (``?attempt=K``; default: the
job's current one, followed live as ``logs --follow`` does, and the next one once the job runs
again). A past version is folded from the ledger, as
``GET /v1/audit/jobs/{id}/state?version=`` and ``inspect --at-version`` do. Stop and delete are
forms (POST, same origin, the session's CSRF token) that call the application service exactly
as the API's routes do, for the same caller.
"""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from api.artifacts.followers import AttemptLog
from api.artifacts.store import StorageUnavailable
from api.console.auth import (
    Signed,
    read_form,
    refused_form,
    services_of,
    signed_in,
    signed_in_async,
    to_sign_in,
)
from api.console.chart import LossHistories, chart, curves_of
from api.console.present import (
    ENDED,
    WAITING,
    actor,
    cell,
    failure_text,
    history,
    job_state,
    moment,
    placement_rows,
    spec_of,
    spec_rows,
    waiting_lines,
)
from api.console.render import page, problem_page, query, redirect, secured
from api.services import Services
from common.attempts import FIRST, IN_FILES, MAX_ATTEMPT, attempt_key, current_attempt, last_attempt
from domain.actors import user
from domain.errors import DomainError
from domain.events import event_name
from domain.history import VersionOutOfRange
from domain.outcomes import JobNotFound
from domain.statuses import Status
from domain.values import BIGINT_MAX, MAX_NODES

router = APIRouter(include_in_schema=False)
TAIL_BYTES = 64 * 1024
"""A page opens the log this far from its end; the download has it all."""
NOT_FOUND = "There is no job named '{name}' of yours. The jobs page lists the jobs you can see."


def find_document(
    services: Services, signed: Signed, name: str, owner: str
) -> dict[str, Any] | None:
    """The live job of that name, as the API finds it: the caller's own; an admin may name
    another owner. Another user's job is not found, exactly as one that does not exist."""
    if owner and owner != signed.user and not signed.admin:
        return None
    return services.queries.job_by_name(owner or signed.user, name)


def shown_attempt(document: dict[str, Any], attempt: int | None) -> int:
    """The attempt whose log a page shows: the one asked, within those the job had; else its
    current one."""
    if attempt is None:
        return current_attempt(document)
    return min(max(attempt, FIRST), last_attempt(document))


def owner_param(signed: Signed, document: dict[str, Any]) -> str | None:
    """``owner`` for the links of an admin's view of another user's job."""
    return document["owner"] if document["owner"] != signed.user else None


def _waiting(services: Services, document: dict[str, Any]) -> dict[str, Any] | None:
    if document["status"] not in WAITING:
        return None
    detail = services.waits.detail(document["id"])
    if detail is None:
        return {"reason": "waits for the scheduler's next round", "asked": "", "nodes": [],
                "place": None}  # fmt: skip
    if document["status"] == Status.SCHEDULING.value and "place" not in detail:
        detail["place"], detail["of"] = services.queries.place_in_scheduling(document["id"])
    return waiting_lines(detail)


def _outputs(document: dict[str, Any], nodes: int, ran: bool) -> list[dict[str, Any]]:
    """Each node's output archive: those recorded (with their size) and, once the job ran to
    its end, the others (the API answers an empty archive for a node that left nothing)."""
    recorded = {entry.get("node_index"): entry for entry in document.get("outputs") or []}
    indices = sorted({*recorded, *(range(nodes) if ran else ())} - {None})
    return [{"index": index, "size": cell((recorded.get(index) or {}).get("size"))}
            for index in indices]  # fmt: skip


def as_of(services: Services, signed: Signed, job_id: str, version: int) -> dict[str, Any]:
    """The job as the ledger held it at ``version``."""
    try:
        past = services.jobs.job_as_of(UUID(job_id), version=version,
                                       owner=None if signed.admin else signed.user)  # fmt: skip
    except VersionOutOfRange as error:
        return {"error": str(error)}
    job = past.job
    return {
        "error": None, "version": job.version, "latest": past.latest,
        "status": str(job.status), "event": event_name(past.event),
        "at": moment(past.event.timestamp.isoformat()),
        "by": actor(getattr(past.event, "by", None)),
        "spec": spec_rows(job.job_spec, job.commit),
        "placements": placement_rows(list(job.placements)),
        "failure": failure_text(job.failure, job.job_spec, job.retries_left),
    }  # fmt: skip


def job_context(
    services: Services, histories: LossHistories, signed: Signed, document: dict[str, Any],
    node: int, version: int | None, attempt: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    job_id = document["id"]
    checkpoints = services.queries.checkpoints(job_id)
    logged = histories.history(services.artifacts, job_id, checkpoints[-1]["id"]) \
        if checkpoints else []  # fmt: skip
    nodes = max(int(document.get("nodes") or 1), len(document.get("placements") or []), 1)
    node = min(node, nodes - 1)
    shown = shown_attempt(document, attempt)
    try:
        size = AttemptLog(services.artifacts, job_id, node, shown).size()
    except StorageUnavailable:  # the page still shows; its log stream retries
        size = 0
    owner = owner_param(signed, document)
    ran = document["status"] in ENDED and bool(document.get("started_at"))
    entries = history(document)
    return {
        "signed": signed, "job": document, "owner": owner, "state": job_state(document),
        "spec": spec_rows(spec_of(document), document.get("commit")),
        "placements": placement_rows(document.get("placements") or []),
        "waiting": _waiting(services, document),
        "history": entries, "version": len(entries),
        "past": as_of(services, signed, job_id, version) if version else None,
        "checkpoints": [{**row, "created": moment(row["created_at"]),
                         "name": row["name"] or "(final)",
                         "train": cell(row["train_loss"]), "eval": cell(row["eval_loss"])}
                        for row in checkpoints],  # fmt: skip
        "chart": chart(curves_of(logged, checkpoints)),
        "nodes": list(range(nodes)), "node": node,
        "log_offset": max(0, size - TAIL_BYTES), "log_size": size,
        "attempt": shown, "attempts": list(range(FIRST, last_attempt(document) + 1)),
        "current_attempt": current_attempt(document),
        "pinned": attempt is not None,
        "log_name": f"{attempt_key(document['name'] + f'-node{node}', shown, IN_FILES)}.log",
        "outputs": _outputs(document, nodes, ran),
        "api_query": query(owner=owner),
        "created": moment(document["created_at"]),
    }  # fmt: skip


@router.get("/jobs/{name}")
async def job_page(
    request: Request, name: str,
    owner: Annotated[str, Query(max_length=63)] = "",
    node: Annotated[int, Query(ge=0, lt=MAX_NODES)] = 0,
    version: Annotated[int | None, Query(ge=1, le=BIGINT_MAX)] = None,
    attempt: Annotated[int | None, Query(ge=1, le=MAX_ATTEMPT)] = None,
) -> Response:  # fmt: skip
    histories: LossHistories = request.app.state.console.histories

    def build() -> tuple[Signed | None, dict[str, Any] | None]:
        signed = signed_in(request)
        if signed is None:
            return None, None
        services = services_of(request)
        document = find_document(services, signed, name, owner)
        if document is None:
            return signed, None
        try:
            return signed, job_context(services, histories, signed, document, node, version,
                                       attempt)  # fmt: skip
        except JobNotFound:  # deleted meanwhile
            return signed, None

    signed, context = await run_in_threadpool(build)
    if signed is None:
        return to_sign_in(request)
    if context is None:
        return problem_page(404, "Job not found", NOT_FOUND.format(name=name), signed)
    return page("job.html", **context)


def _answer(request: Request, status: int, title: str, detail: str, signed: Signed | None,
            after: str) -> Response:  # fmt: skip
    """JSON for the page's script (it asked for it), else a page or a redirect."""
    if "application/json" in request.headers.get("accept", ""):
        return secured(JSONResponse({"title": title, "detail": detail}, status_code=status))
    if status >= 400:
        return problem_page(status, title, detail, signed)
    return redirect(after)


async def _act(request: Request, name: str, action: str) -> Response:
    form = await read_form(request)
    signed = await signed_in_async(request)
    refusal = refused_form(request, signed, form)
    if refusal is not None or signed is None:
        return _answer(request, 403, "Refused", refusal or "", signed, "/")
    services = services_of(request)
    owner = form.get("owner", "")[:63]

    def run() -> tuple[int, str, str, str]:
        document = find_document(services, signed, name, owner)
        if document is None:
            return 404, "Job not found", NOT_FOUND.format(name=name), "/"
        if services.projector.halted is not None:
            return 503, "Writes paused", "the server's views are halted (an operator must "\
                "restart it); nothing was recorded: try again later", "/"  # fmt: skip
        job_id = UUID(document["id"])
        try:
            if action == "stop":
                outcome = services.jobs.request_stop(job_id, by=user(signed.user))
            else:
                outcome = services.jobs.delete(job_id, by=user(signed.user))
        except DomainError as error:
            return 409, f"Cannot {action} this job", str(error), "/"
        services.projector.wait(outcome.position)
        after = "/" if action == "delete" else f"/jobs/{name}{query(owner=owner or None)}"
        return 200, f"{action} recorded", "", after

    status, title, detail, after = await run_in_threadpool(run)
    return _answer(request, status, title, detail, signed, after)


@router.post("/jobs/{name}/stop")
async def stop_job(request: Request, name: str) -> Response:
    return await _act(request, name[:63], "stop")


@router.post("/jobs/{name}/delete")
async def delete_job(request: Request, name: str) -> Response:
    return await _act(request, name[:63], "delete")
