"""Users' routes: submit, list, inspect, stop, delete, logs, checkpoints, outputs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse

from api.artifacts.followers import AttemptLog, TooManyFollowers, attempt_over, follow_log
from api.http.attempts import UserAttempt, chosen_attempt, chosen_node
from api.http.cursors import InvalidCursor, decode_cursor, encode_cursor
from api.http.deps import (
    ALL_OWNERS,
    CurrentUser,
    JobOwner,
    LedgerWritable,
    ServicesDep,
    tell_position,
)
from api.http.downloads import ANSWERS, OutputIndex, output_answer
from api.http.job_specs import recorded_spec
from api.http.problems import Problem, too_many_followers
from api.http.routes.submissions import submit_jobs
from api.http.schemas import (
    CheckpointPublic,
    CheckpointsPublic,
    JobCreate,
    JobDeleted,
    JobPublic,
    JobsPublic,
    JobSummary,
    answer,
)
from api.http.streaming import FollowingResponse
from api.http.submission_schemas import JobSubmissions, SubmissionResults
from api.job_specs import JobSpecs
from api.services import Services
from common.contract import ATTEMPT_HEADER, MAX_PAGE, NODES_HEADER, image_key
from common.job_spec import JobSpec
from domain.actors import user
from domain.statuses import Status
from domain.values import BIGINT_MAX, MAX_NODES

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
TEXT = "text/plain; charset=utf-8"
WAITING = frozenset({Status.SCHEDULING.value, Status.ENQUEUED.value})
LIST_ANSWER: dict[int | str, dict[str, Any]] = {
    207: {"model": SubmissionResults, "description": "A list of jobs: each one's result"}
}


def duration_seconds(row: dict[str, Any]) -> float | None:
    if not row.get("started_at"):
        return None
    started = datetime.fromisoformat(row["started_at"])
    ended = datetime.fromisoformat(row["ended_at"]) if row.get("ended_at") else datetime.now(UTC)
    return round((ended - started).total_seconds(), 3)


def job_public(document: dict[str, Any]) -> JobPublic:
    return JobPublic.model_validate({**document, "duration_seconds": duration_seconds(document)})


def find_job(services: Services, owner: str, name: str, me: str | None = None) -> dict[str, Any]:
    """The owner's live job of that name; 404 for none, and for another user's (a user's
    jobs are their own: not even their names are revealed to others)."""
    document = services.queries.job_by_name(owner, name) if owner != ALL_OWNERS else None
    if document is None:
        whose = f" of user {owner}" if me is not None and owner != me else ""
        raise Problem(
            404, "job-not-found", "Job not found",
            f"no job named '{name}'{whose}; `flexai training list` shows your jobs",
        )  # fmt: skip
    return document


@router.post("", status_code=201, dependencies=[Depends(LedgerWritable)],
             response_model=JobPublic, responses=LIST_ANSWER)  # fmt: skip
def submit_job(body: JobSubmissions, services: ServicesDep, owner: CurrentUser) -> Response:
    """Start a new training job; or, given a list, many (each answered alone: 207)."""
    if isinstance(body, list):
        return submit_jobs(body, services, owner, job_public)
    return submit_one(body, services, owner)


def submit_one(body: JobCreate, services: Services, owner: str) -> Response:
    """One job: checked, recorded (its scheduling started in the same save where this
    server's scheduler runs, as it would start it at once), answered with its position."""
    spec = recorded_spec(JobSpecs(services, owner), body)
    outcome = services.jobs.submit(owner, body.name, spec, by=user(owner),
                                   schedule=services.scheduler_leader.is_set())  # fmt: skip
    services.projector.wait(outcome.position)
    services.scheduler_wakeup.set()
    document = services.queries.job(str(outcome.job_id))
    assert document is not None
    response = answer(job_public(document), 201)
    tell_position(response, outcome.position)
    return response


def parse_statuses(values: list[str]) -> set[Status]:
    """Statuses from repeated and comma-separated values (``in-progress`` and ``IN_PROGRESS``
    stand for ``in progress`` too); a 422 problem naming the allowed ones otherwise."""
    wanted: set[Status] = set()
    for value in (part.strip() for item in values for part in item.split(",")):
        if not value:
            continue
        try:
            wanted.add(Status(" ".join(value.lower().replace("-", " ").replace("_", " ").split())))
        except ValueError:
            allowed = ", ".join(f"'{status.value}'" for status in Status)
            raise Problem(
                422, "invalid-request", "Unknown status",
                f"unknown status '{value}': use one of {allowed} (repeat `status` or separate "
                "them with commas)", field="status", allowed=[status.value for status in Status],
            ) from None  # fmt: skip
    return wanted


@router.get("", response_model=JobsPublic)
def list_jobs(
    services: ServicesDep,
    owner: JobOwner,
    limit: int = Query(default=50, ge=1, le=MAX_PAGE, description="jobs per page"),
    cursor: str | None = Query(default=None, max_length=1024,
                               description="the previous page's next_cursor"),  # fmt: skip
    status: Annotated[list[str] | None, Query(description="only jobs in these statuses")] = None,
    name_prefix: str = Query(default="", max_length=63,
                             description="only jobs whose name starts with this"),  # fmt: skip
) -> Response:
    """List your jobs (an admin: a user's with ``owner``, everyone's with ``owner=*``), newest
    first, one page at a time (follow next_cursor)."""
    statuses = parse_statuses(status or [])
    try:
        after = decode_cursor(cursor) if cursor else None
    except InvalidCursor as error:
        raise Problem(
            422, "invalid-cursor", "Invalid cursor",
            f"the cursor is malformed or was altered ({error}); list again from the first "
            "page, without `cursor`, and pass each answer's next_cursor as it is",
        ) from None  # fmt: skip
    rows = services.queries.page_jobs(
        None if owner == ALL_OWNERS else owner, limit + 1, after=after, statuses=statuses,
        name_prefix=name_prefix,
    )  # fmt: skip
    page, more = rows[:limit], len(rows) > limit
    waiting = [row["id"] for row in page if row["status"] in WAITING]
    reasons = services.waits.reasons(waiting)
    jobs = [JobSummary.model_validate({**row, "duration_seconds": duration_seconds(row),
                                       "reason": reasons.get(row["id"])})
            for row in page]  # fmt: skip
    next_cursor = encode_cursor(page[-1]["created_at"], page[-1]["id"]) if more else None
    return answer(JobsPublic(jobs=jobs, count=len(jobs), next_cursor=next_cursor))


@router.get("/{name}", response_model=JobPublic)
def inspect_job(name: str, services: ServicesDep, owner: JobOwner, me: CurrentUser) -> Response:
    """A job's spec, status, node, timestamps, lifecycle events, and why it waits."""
    document = find_job(services, owner, name, me)
    if document["status"] in WAITING:
        waiting = services.waits.detail(document["id"])
        if (waiting is not None and document["status"] == Status.SCHEDULING.value
                and "place" not in waiting):  # fmt: skip
            waiting["place"], waiting["of"] = services.queries.place_in_scheduling(
                document["id"]
            )
        document["waiting"] = waiting
    elif document["status"] == Status.BUILDING.value:
        document["waiting"] = pulling(services, document)
    return answer(job_public(document))


def pulling(services: Services, document: dict[str, Any]) -> dict[str, Any] | None:
    """While a job that names an image builds on nodes that do not hold it yet (as their
    heartbeats say), that it waits for the pull there."""
    spec = JobSpec.from_dict(document.get("spec") or {})
    image = spec.runtime_image
    if image is None:
        return None
    held, key = services.state.images(), image_key(image)
    pulling_on = [placement["node"] for placement in document.get("placements") or []
                  if key not in held.get(placement["node_id"], {})]  # fmt: skip
    if not pulling_on:
        return None
    return {"reason": f"pulling the image {image} on node {', '.join(pulling_on)}",
            "asked": {"accels": spec.accels, "nodes": spec.nodes}}


@router.post("/{name}/stop", status_code=202, dependencies=[Depends(LedgerWritable)])
def stop_job(
    name: str, services: ServicesDep, owner: JobOwner, me: CurrentUser, response: Response
) -> JobPublic:
    """Ask for a job to stop."""
    document = find_job(services, owner, name, me)
    outcome = services.jobs.request_stop(UUID(document["id"]), by=user(me))
    services.projector.wait(outcome.position)
    tell_position(response, outcome.position)
    return job_public(services.queries.job(document["id"]) or document)


@router.delete("/{name}", dependencies=[Depends(LedgerWritable)])
def delete_job(
    name: str, services: ServicesDep, owner: JobOwner, me: CurrentUser, response: Response
) -> JobDeleted:
    """Delete a finished job; its history stays readable for audit, and its artifacts stay
    in the store until an admin purges them."""
    document = find_job(services, owner, name, me)
    outcome = services.jobs.delete(UUID(document["id"]), by=user(me))
    services.projector.wait(outcome.position)
    tell_position(response, outcome.position)
    deleted = services.queries.job(document["id"]) or document
    return JobDeleted(id=deleted["id"], name=deleted["name"], deleted_at=deleted["deleted_at"])


@router.get("/{name}/logs", response_class=StreamingResponse)
async def job_logs(
    name: str,
    services: ServicesDep,
    owner: JobOwner,
    me: CurrentUser,
    offset: int = Query(default=0, ge=0, le=BIGINT_MAX, description="the first byte to send"),
    follow: bool = False,
    node_index: int = Query(default=0, ge=0, lt=MAX_NODES,
                            description="which node's output (multi-node jobs)"),  # fmt: skip
    attempt: UserAttempt = None,
) -> StreamingResponse:
    """A job's build and run output (one node's, one attempt's: the current one unless told);
    with follow, streams until the job ends or moves on to its next attempt."""
    document = await run_in_threadpool(find_job, services, owner, name, me)
    job_id = document["id"]
    chosen = chosen_attempt(document, attempt)
    log = AttemptLog(services.artifacts, job_id, chosen_node(document, node_index), chosen)
    headers = {NODES_HEADER: str(max(len(document.get("placements") or []), 1)),
               ATTEMPT_HEADER: str(chosen)}  # fmt: skip
    # Read once before the answer starts: a disk that fails is a 503 problem, not a cut stream.
    log.read(offset)
    if not follow:
        return StreamingResponse(_read_log(log, offset), media_type=TEXT, headers=headers)
    if services.log_followers.count >= services.log_followers.limit:
        raise too_many_followers(TooManyFollowers(services.log_followers.limit))
    return FollowingResponse(_follow_log(services, log, offset), media_type=TEXT,
                             headers=headers)  # fmt: skip


async def _read_log(log: AttemptLog, offset: int) -> AsyncIterator[bytes]:
    while chunk := log.read(offset):
        offset += len(chunk)
        yield chunk


async def _follow_log(services: Services, log: AttemptLog, offset: int) -> AsyncIterator[bytes]:
    """The log from ``offset`` as it grows, until the job is terminal or has moved on past the
    log's attempt, and every byte is sent (the client tells the user of the next attempt)."""

    async def over() -> bool:
        return attempt_over(await run_in_threadpool(services.queries.job, log.job_id), log.attempt)

    followers = services.log_followers
    async with followers.follow(log.job_id) as follower:
        async for chunk in follow_log(followers, follower, log, offset, over):
            if chunk:
                yield chunk


@router.get("/{name}/checkpoints")
def job_checkpoints(
    name: str, services: ServicesDep, owner: JobOwner, me: CurrentUser
) -> CheckpointsPublic:
    """The checkpoints a job wrote, oldest first (a running job's too)."""
    job_id = find_job(services, owner, name, me)["id"]
    rows = services.queries.checkpoints(job_id)
    return CheckpointsPublic(checkpoints=[CheckpointPublic.model_validate(row) for row in rows])


@router.get("/{name}/outputs/{node_index}", response_class=Response, responses=ANSWERS)
def job_outputs(
    name: str, node_index: OutputIndex, services: ServicesDep, owner: JobOwner, me: CurrentUser,
    attempt: UserAttempt = None,
) -> Response:
    """The job's output directory as a zip archive (of ``attempt``; default: the last that
    recorded outputs): 307 to the store, or the bytes; ``X-Flexai-Size`` and
    ``X-Flexai-Sha256`` say what they must be."""
    return output_answer(services, find_job(services, owner, name, me), node_index, attempt)
