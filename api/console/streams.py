"""The live streams of open pages (server-sent events), none holding a thread.

- ``/live/jobs?ids=...``: the jobs page's rows. Woken by their jobs' events (and every few
  seconds while one waits, as the scheduler rewrites why), it reads those rows from the views
  and sends the ones that changed (``jobs``).
- ``/jobs/{name}/live?node=K&attempt=A&offset=N&since=V``: a job page. It follows one node's
  log of attempt ``A`` (default: the job's current one) from byte ``N`` with the loop of
  ``logs --follow`` (:func:`api.artifacts.followers.follow_log`; ``log`` events, their id the
  byte reached, so a reconnecting page resumes there), sends the status and the history past
  version ``V`` when the job changes (``job``), and ends with ``end`` once that attempt is over
  (the job ended, or moved on to its next attempt: ``end`` says which is current) and its last
  line is out.
"""

from __future__ import annotations

import asyncio
import codecs
import time
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import PlainTextResponse, Response

from api.artifacts.followers import AttemptLog, TooManyFollowers, attempt_over, follow_log
from api.console.auth import Signed, services_of, signed_in
from api.console.job_page import find_document, shown_attempt
from api.console.live import KEEPALIVE, EventStream, JobWatch, server_event
from api.console.present import WAITING, history, job_state, summary_row
from api.console.render import secured
from api.services import Services
from common.attempts import MAX_ATTEMPT, current_attempt
from domain.values import BIGINT_MAX, MAX_NODES

router = APIRouter(include_in_schema=False)
RECHECK_S = 1.0
"""A quiet stream looks up this often whether the server is stopping (no query)."""
REASONS_S = 5.0
"""How often the jobs page's waiting rows are read again when another replica schedules (this
server's own scheduler says when it changed a reason: they are read again at once)."""
KEEPALIVE_S = 15.0
MAX_IDS = 500


def _refused(status: int, text: str) -> Response:
    return secured(PlainTextResponse(text, status_code=status))


# -- the jobs page ----------------------------------------------------------------------------


def _rows(services: Services, signed: Signed, ids: list[str]) -> dict[str, dict[str, Any]]:
    rows = [row for row in services.queries.jobs_by_ids(ids)
            if signed.admin or row["owner"] == signed.user]  # fmt: skip
    reasons = services.waits.reasons(row["id"] for row in rows if row["status"] in WAITING)
    shown = {}
    for row in rows:
        summary = summary_row(row, reasons.get(row["id"]))
        shown[row["id"]] = {key: summary[key] for key in ("id", "status", "duration", "reason")}
        shown[row["id"]]["deleted"] = row.get("deleted_at") is not None
    return shown


async def _jobs_stream(services: Services, watch: JobWatch, signed: Signed, ids: list[str]
                       ) -> AsyncIterator[bytes]:  # fmt: skip
    wake = asyncio.Event()
    sent: dict[str, dict[str, Any]] = {}
    with watch.watching(ids, wake) as watching:
        while True:
            watching.changed = False
            reasons = services.waits.version  # before the read: a change during it reads again
            rows = await run_in_threadpool(_rows, services, signed, ids)
            changed = [row for job_id, row in rows.items() if sent.get(job_id) != row]
            if changed:
                yield server_event("jobs", changed)
            sent.update(rows)
            waiting = any(row["status"] in WAITING for row in rows.values())
            read_at = quiet_since = time.monotonic()
            while True:
                with suppress(TimeoutError):
                    async with asyncio.timeout(RECHECK_S):
                        await wake.wait()
                wake.clear()
                if services.log_followers.closing:
                    return
                now = time.monotonic()
                if watching.changed or waiting and (services.waits.version != reasons
                                                    or now - read_at >= REASONS_S):
                    break
                if now - quiet_since >= KEEPALIVE_S:
                    quiet_since = now
                    yield KEEPALIVE


@router.get("/live/jobs")
async def jobs_live(request: Request, ids: Annotated[str, Query(max_length=40_000)] = ""
                    ) -> Response:  # fmt: skip
    signed = await run_in_threadpool(signed_in, request)
    if signed is None:
        return _refused(401, "sign in first")
    wanted = [part for part in ids.split(",") if part][:MAX_IDS]
    watch: JobWatch = request.app.state.console.watch
    return EventStream(_jobs_stream(services_of(request), watch, signed, wanted))


# -- a job page -------------------------------------------------------------------------------


class _Text:
    """Log bytes as text events (a character cut between two reads waits for its other
    bytes), each one's id the byte it reached."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def event(self, chunk: bytes) -> bytes | None:
        self.offset += len(chunk)
        text = self.decoder.decode(chunk)
        held = len(self.decoder.getstate()[0])
        return server_event("log", text, str(self.offset - held)) if text else None


async def _job_stream(services: Services, watch: JobWatch, log: AttemptLog, offset: int,
                      since: int) -> AsyncIterator[bytes]:  # fmt: skip
    followers = services.log_followers
    text = _Text(offset)
    read: dict[str, Any] = {}
    """What ``over()`` read last (``job``: None when gone), and whether it was sent."""

    async def over() -> bool:
        read.update(job=await run_in_threadpool(services.queries.job, log.job_id), sent=False)
        return attempt_over(read["job"], log.attempt)

    async with followers.follow(log.job_id) as follower:
        with watch.watching([log.job_id], follower.woken) as watching:

            def again() -> bool:
                changed, watching.changed = watching.changed or follower.job_ended, False
                return changed

            quiet_since = time.monotonic()
            async for chunk in follow_log(followers, follower, log, offset, over, again):
                if chunk is None:
                    if not read["sent"] and (document := read["job"]) is not None:
                        read["sent"] = True
                        entries = history(document, since)
                        since = max([since, *(entry["version"] for entry in entries)])
                        yield server_event("job", {**job_state(document), "history": entries})
                    if time.monotonic() - quiet_since >= KEEPALIVE_S:
                        quiet_since = time.monotonic()
                        yield KEEPALIVE
                elif (event := text.event(chunk)) is not None:
                    quiet_since = time.monotonic()
                    yield event
            if follower.job_ended:
                current = current_attempt(read["job"]) if read.get("job") else log.attempt
                yield server_event("end", {"offset": text.offset, "attempt": log.attempt,
                                           "current": current})  # fmt: skip


@router.get("/jobs/{name}/live")
async def job_live(
    request: Request, name: str,
    owner: Annotated[str, Query(max_length=63)] = "",
    node: Annotated[int, Query(ge=0, lt=MAX_NODES)] = 0,
    attempt: Annotated[int | None, Query(ge=1, le=MAX_ATTEMPT)] = None,
    offset: Annotated[int, Query(ge=0, le=BIGINT_MAX)] = 0,
    since: Annotated[int, Query(ge=0, le=BIGINT_MAX)] = 0,
) -> Response:  # fmt: skip
    services = services_of(request)

    def find() -> tuple[Signed | None, dict[str, Any] | None]:
        signed = signed_in(request)
        if signed is None:
            return None, None
        return signed, find_document(services, signed, name, owner)

    signed, document = await run_in_threadpool(find)
    if signed is None:
        return _refused(401, "sign in first")
    if document is None:
        return _refused(404, "no such job of yours")
    resumed = request.headers.get("last-event-id", "")
    if resumed.isdigit() and int(resumed) <= BIGINT_MAX:
        offset = int(resumed)  # a reconnecting page goes on from the last byte it has
    followers = services.log_followers
    if followers.count >= followers.limit:
        return _refused(503, str(TooManyFollowers(followers.limit)))
    watch: JobWatch = request.app.state.console.watch
    log = AttemptLog(services.artifacts, document["id"], node, shown_attempt(document, attempt))
    return EventStream(_job_stream(services, watch, log, offset, since))
