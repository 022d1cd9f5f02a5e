"""Users' routes: submit, list, inspect, stop, delete, logs, checkpoints, outputs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse, StreamingResponse

from api.deps import CurrentUser, ServicesDep
from api.problems import Problem
from api.schemas import (
    CheckpointPublic,
    CheckpointsPublic,
    JobCreate,
    JobDeleted,
    JobPublic,
    JobsPublic,
    JobSummary,
)
from api.services import Services
from domain.model import TERMINAL, Status, user

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
FOLLOW_POLL_S = 0.1


def duration_seconds(row: dict[str, Any]) -> float | None:
    if not row.get("started_at"):
        return None
    started = datetime.fromisoformat(row["started_at"])
    ended = datetime.fromisoformat(row["ended_at"]) if row.get("ended_at") else datetime.now(UTC)
    return round((ended - started).total_seconds(), 3)


def job_public(document: dict[str, Any]) -> JobPublic:
    return JobPublic.model_validate({**document, "duration_seconds": duration_seconds(document)})


def find_job(services: Services, owner: str, name: str) -> dict[str, Any]:
    document = services.queries.job_by_name(owner, name)
    if document is None:
        raise Problem(
            404, "job-not-found", "Job not found",
            f"no job named '{name}'; `flexai training list` shows your jobs",
        )  # fmt: skip
    return document


@router.post("", status_code=201)
def submit_job(body: JobCreate, services: ServicesDep, owner: CurrentUser) -> JobPublic:
    """Start a new training job."""
    spec = body.model_dump(exclude={"name"})
    if body.secrets:
        raise Problem(
            422, "invalid-request", "Secrets unavailable",
            "secrets are not available on this control plane yet; pass the value with --env",
        )  # fmt: skip
    spec["input_checkpoint_id"] = None
    if body.checkpoint:
        found = services.queries.checkpoint(owner, body.checkpoint)
        if found is None:
            raise Problem(
                404, "checkpoint-not-found", "Checkpoint not found",
                f"no checkpoint with id or name '{body.checkpoint}'; "
                "`flexai training checkpoints <job>` lists them",
            )  # fmt: skip
        spec["input_checkpoint_id"] = found["id"]
    outcome = services.jobs.submit(owner, body.name, spec, by=user(owner))
    services.projector.wait(outcome.position)
    services.scheduler_wakeup.set()
    document = services.queries.job(str(outcome.job_id))
    assert document is not None
    return job_public(document)


@router.get("")
def list_jobs(services: ServicesDep, owner: CurrentUser) -> JobsPublic:
    """List your jobs, newest first."""
    rows = services.queries.list_jobs(owner)
    jobs = [JobSummary.model_validate({**row, "duration_seconds": duration_seconds(row)})
            for row in rows]  # fmt: skip
    return JobsPublic(jobs=jobs, count=len(jobs))


@router.get("/{name}")
def inspect_job(name: str, services: ServicesDep, owner: CurrentUser) -> JobPublic:
    """A job's spec, status, node, timestamps and lifecycle events."""
    return job_public(find_job(services, owner, name))


@router.post("/{name}/stop", status_code=202)
def stop_job(name: str, services: ServicesDep, owner: CurrentUser) -> JobPublic:
    """Ask for a job to stop."""
    document = find_job(services, owner, name)
    outcome = services.jobs.request_stop(UUID(document["id"]), by=user(owner))
    services.projector.wait(outcome.position)
    return job_public(services.queries.job(document["id"]) or document)


@router.delete("/{name}")
def delete_job(name: str, services: ServicesDep, owner: CurrentUser) -> JobDeleted:
    """Delete a finished job; its history stays readable for audit."""
    document = find_job(services, owner, name)
    outcome = services.jobs.delete(UUID(document["id"]), by=user(owner))
    services.projector.wait(outcome.position)
    deleted = services.queries.job(document["id"]) or document
    return JobDeleted(id=deleted["id"], name=deleted["name"], deleted_at=deleted["deleted_at"])


@router.get("/{name}/logs", response_class=StreamingResponse)
def job_logs(
    name: str,
    services: ServicesDep,
    owner: CurrentUser,
    offset: int = Query(default=0, ge=0),
    follow: bool = False,
) -> StreamingResponse:
    """A job's build and run output; with follow, streams until the job ends."""
    job_id = find_job(services, owner, name)["id"]
    return StreamingResponse(
        _stream_log(services, job_id, offset, follow), media_type="text/plain; charset=utf-8"
    )


def _stream_log(services: Services, job_id: str, offset: int, follow: bool) -> Iterator[bytes]:
    draining = False
    while True:
        chunk = services.artifacts.read_log(job_id, offset)
        if chunk:
            offset += len(chunk)
            yield chunk
            continue
        if not follow or draining:
            return
        document = services.queries.job(job_id)
        # Agents ship every line before the terminal report: one more pass drains it all.
        draining = document is None or Status(document["status"]) in TERMINAL
        if not draining:
            time.sleep(FOLLOW_POLL_S)


@router.get("/{name}/checkpoints")
def job_checkpoints(name: str, services: ServicesDep, owner: CurrentUser) -> CheckpointsPublic:
    """The checkpoints a job wrote, oldest first (a running job's too)."""
    job_id = find_job(services, owner, name)["id"]
    rows = services.queries.checkpoints(job_id)
    return CheckpointsPublic(checkpoints=[CheckpointPublic.model_validate(row) for row in rows])


@router.get("/{name}/outputs/{node_index}", response_class=FileResponse)
def job_outputs(
    name: str, node_index: int, services: ServicesDep, owner: CurrentUser
) -> FileResponse:
    """The job's output directory as a zip archive."""
    document = find_job(services, owner, name)
    path = services.artifacts.output_path(document["id"], node_index)
    if not path.exists():
        raise Problem(
            404, "not-found", "No output yet",
            f"job '{name}' ({document['status']}) has no output for node {node_index} yet; "
            "outputs are uploaded when the entry point ends",
        )  # fmt: skip
    return FileResponse(path, media_type="application/zip", filename=f"output_{node_index}.zip")
