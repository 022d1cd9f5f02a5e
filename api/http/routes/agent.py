"""Agents' routes: register, heartbeat, assignments, reports, logs, input checkpoints (their
uploads of checkpoints and outputs: :mod:`api.http.routes.uploads`)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from api.artifacts.store import checkpoint_key
from api.http.attempts import AgentAttempt
from api.http.deps import CurrentNode, LedgerWritable, ServicesDep
from api.http.downloads import ANSWERS, artifact_answer
from api.http.problems import Problem
from api.http.runtime_schemas import NodeHeartbeat
from api.http.schemas import (
    AGENT_ID_PATTERN,
    BYTES_BODY,
    Assignment,
    Assignments,
    NodeRegister,
    NodeRegistered,
    Report,
    ReportAccepted,
    Size,
    answer,
)
from api.scheduling.assignments import MAX_WAIT_S, etag_of
from api.scheduling.deadlines import move_jobs_off
from api.services import Services
from common.attempts import FIRST, attempt_key, current_attempt
from common.contract import AGENT_ID_HEADER, IMAGE_DIGEST, image_key
from common.job_spec import JobSpec
from domain.node import Node
from domain.statuses import Status
from domain.values import BIGINT_MAX, MAX_NODES

router = APIRouter(prefix="/v1/agent", tags=["agents"])
JobId = Annotated[UUID, Path(description="the job's id")]
NodeIndex = Annotated[
    int, Query(ge=0, lt=MAX_NODES, description="the node's index in the job (multi-node jobs)")
]
LogOffset = Annotated[int, Query(ge=0, le=BIGINT_MAX, description="where the bytes start")]
AgentId = Annotated[
    str,
    Header(
        alias=AGENT_ID_HEADER, pattern=AGENT_ID_PATTERN,
        description="the agent's lasting identity: one live agent holds a node",
    ),
]  # fmt: skip


def require_job(services: Services, job_id: UUID, node: str | None = None) -> dict[str, Any]:
    """The job; with ``node``, only when it is (or was last) placed on that node: a node's
    token reaches no other node's jobs, and does not learn that they exist."""
    document = services.queries.job(str(job_id))
    if document is not None and node is not None:
        node_id = str(Node.create_id(node))
        placed = [placement.get("node_id") for placement in document.get("placements") or []]
        if node_id not in (placed or [document.get("node_id")]):
            document = None
    if document is None:
        raise Problem(404, "job-not-found", "Job not found",
                      f"no job with id {job_id} on node {node}" if node else
                      f"no job with id {job_id}")  # fmt: skip
    return document


def require_own_node(node: str, node_id: str | None) -> None:
    """A node token acts for its own node alone."""
    if node_id is not None and node_id != str(Node.create_id(node)):
        raise Problem(
            403, "wrong-node", "Another node's route",
            f"this token is node {node}'s: it acts for that node alone (id "
            f"{Node.create_id(node)}), not for node {node_id[:64]}; give each agent its own "
            "node token (`flexai admin node-token create NODE_NAME`)",
        )  # fmt: skip


def _require_holder(services: Services, node_id: str | None, agent_id: str, node: str) -> None:
    """Only the agent that holds a node acts for it: a second agent under the same name is
    refused, so no job ever runs twice."""
    require_own_node(node, node_id)
    if node_id is None:
        return
    holder = services.state.holder(node_id)
    if holder is None:
        raise Problem(
            404, "node-not-found", "Node not found",
            f"no node with id {node_id}; register it again (restart the agent)",
        )  # fmt: skip
    if holder.agent_id != agent_id:
        raise Problem(
            409, "node-taken", "Node held by another agent",
            f"node {node_id} is held by another agent since {holder.since}; this agent must "
            "stop: its jobs run there",
        )  # fmt: skip


def job_of_holder(
    services: Services, job_id: UUID, agent_id: str, node: str, node_index: int = 0
) -> dict[str, Any]:
    """The job, when the agent holds the node at ``node_index`` of it."""
    document = require_job(services, job_id, node)
    placements = document.get("placements") or []
    node_id = placements[node_index]["node_id"] if node_index < len(placements) else None
    if node_id is None and node_index > 0:
        raise Problem(404, "not-found", "No such node index",
                      f"job {job_id} has no node index {node_index}")  # fmt: skip
    _require_holder(services, node_id or document.get("node_id"), agent_id, node)
    return document


@router.post("/nodes", dependencies=[Depends(LedgerWritable)])
def register_node(body: NodeRegister, services: ServicesDep, node: CurrentNode) -> NodeRegistered:
    """Register a node (again): its name, accelerators, and the agent that holds it."""
    if body.name != node:
        raise Problem(
            403, "wrong-node", "Another node's name",
            f"this token is node {node}'s: it registers that node alone, not "
            f"{body.name!r}; start the agent with --name {node}, or with node {body.name}'s "
            "token (`flexai admin node-token create NODE_NAME`)",
        )  # fmt: skip
    node_id = str(Node.create_id(body.name))
    services.state.claim_node(
        node_id, body.name, body.agent_id, services.settings.node_timeout_s
    )
    node_id, outcome = services.jobs.register_node(
        body.name, body.accels, body.accel_type, address=body.address,
        gpus=[gpu.model_dump() for gpu in body.gpus],
        isolation=body.isolation.model_dump() if body.isolation else None,
    )  # fmt: skip
    services.projector.wait(outcome.position)
    services.scheduler_wakeup.set()
    return NodeRegistered(node_id=node_id, name=body.name)


@router.post("/nodes/{node_id}/heartbeat")
def heartbeat(
    node_id: str, agent_id: AgentId, services: ServicesDep, node: CurrentNode,
    body: NodeHeartbeat | None = None,
) -> dict[str, bool]:  # fmt: skip
    """Tell the control plane the node is alive and, when that changed, which images it
    holds (one the server cannot read is left out, never refused: the node stays alive)."""
    _require_holder(services, node_id, agent_id, node)
    images = None if body is None or body.images is None else [
        (key, held.digest) for held in body.images
        if (key := image_key(held.reference)) and IMAGE_DIGEST.fullmatch(held.digest)
    ]  # fmt: skip
    services.state.heartbeat(node_id, images)
    return {"ok": True}


@router.post("/nodes/{node_id}/leave", dependencies=[Depends(LedgerWritable)])
def leave(
    node_id: str, agent_id: AgentId, services: ServicesDep, node: CurrentNode
) -> dict[str, int]:
    """The node's agent is stopping and has ended its jobs' processes: the node takes no new
    job until an agent registers it again, and its jobs move on now, as from a lost node (a
    stop is confirmed), not once its lease ran out. ``jobs``: how many it had."""
    _require_holder(services, node_id, agent_id, node)
    services.state.leave(node_id, agent_id)
    at = datetime.now(UTC).isoformat(timespec="seconds")
    message = f"the agent of node {node} stopped at {at} and ended the job's processes there"
    job_ids = services.queries.jobs_on_node(node_id)
    move_jobs_off(services.jobs, node_id, job_ids, message, left=node)
    return {"jobs": len(job_ids)}


@router.get("/nodes/{node_id}/assignments")
async def assignments(
    node_id: str, agent_id: AgentId, services: ServicesDep, node: CurrentNode,
    response: Response,
    wait: Annotated[float, Query(ge=0, description="seconds to wait for a change")] = 0,
    since: Annotated[str | None, Query(max_length=64, description="the last etag")] = None,
) -> Assignments:
    """The node's jobs that are building, enqueued, running or stopping; with ``wait``, the
    answer comes once it differs from the etag ``since`` (or after ``wait`` seconds)."""
    await run_in_threadpool(_require_holder, services, node_id, agent_id, node)
    waiters = services.assignment_waiters
    deadline = asyncio.get_running_loop().time() + min(wait, MAX_WAIT_S)
    async with waiters.waiting(node_id) as waiter:
        while True:
            answer = await run_in_threadpool(_assignments_of, services, node_id)
            left = deadline - asyncio.get_running_loop().time()
            if answer.etag != since or left <= 0 or waiters.closing:
                break
            await waiter.sleep(left)
    response.headers["ETag"] = f'"{answer.etag}"'
    return answer


def assignment_of(document: dict[str, Any]) -> Assignment:
    """One job as one of its nodes sees it (``document["node_index"]`` names which)."""
    index = int(document.get("node_index", 0))
    placements = document.get("placements") or []
    placement = placements[index] if index < len(placements) else {}
    running = document["status"] in (Status.IN_PROGRESS.value, Status.STOP_IN_PROGRESS.value)
    attempt = current_attempt(document)
    return Assignment(
        job_id=document["id"], name=document["name"], status=document["status"],
        spec=document["spec"], input_checkpoint_id=input_checkpoint_of(document),
        node_index=index, nnodes=max(len(placements), 1),
        accelerators=placement.get("accelerators") if running else None,
        rendezvous=document.get("rendezvous") if running else None, attempt=attempt,
        preempt=document["status"] == Status.IN_PROGRESS.value
        and document.get("preemption") is not None,
    )  # fmt: skip


def input_checkpoint_of(document: dict[str, Any]) -> str | None:
    """The checkpoint the job's current attempt starts from: after a preemption or a retry,
    the last one the job recorded; else the one it was submitted with (``--checkpoint``)."""
    if current_attempt(document) > FIRST and document.get("last_checkpoint_id"):
        return str(document["last_checkpoint_id"])
    return JobSpec.from_dict(document["spec"]).input_checkpoint_id


def _assignments_of(services: Services, node_id: str) -> Assignments:
    listed = [assignment_of(document) for document in services.queries.assignments(node_id)]
    services.assignment_waiters.seen(node_id, (item.job_id for item in listed))
    return Assignments(assignments=listed, etag=etag_of([a.model_dump() for a in listed]))


@router.post("/jobs/{job_id}/reports", dependencies=[Depends(LedgerWritable)],
             response_model=ReportAccepted)  # fmt: skip
def report(
    job_id: JobId, body: Report, agent_id: AgentId, services: ServicesDep, node: CurrentNode
) -> Response:
    """Record a build/run event of a job; a resend is acknowledged, not recorded twice."""
    _require_holder(services, body.node_id, agent_id, node)
    require_job(services, job_id, node)
    payload = body.model_dump(exclude={"ended_at"})
    if body.ended_at is not None and body.type in ("exited", "failed", "stopped"):
        payload["ended_at"] = body.ended_at.isoformat()
    if body.type == "exited" and body.exit_code is None:
        raise Problem(422, "invalid-request", "Invalid report", "an exited report needs exit_code")
    if body.type in ("build_failed", "failed") and not (body.code and body.message):
        raise Problem(
            422, "invalid-request", "Invalid report", f"a {body.type} report needs code and message"
        )
    if body.type == "stop_failed" and not body.message:
        raise Problem(
            422, "invalid-request", "Invalid report", "a stop_failed report needs message"
        )
    if body.type == "logs_unavailable" and (
        body.message is None or body.offset is None or body.written is None
    ):
        raise Problem(
            422, "invalid-request", "Invalid report",
            "a logs_unavailable report needs message, offset and written",
        )  # fmt: skip
    outcome = services.jobs.report(job_id, body.node_id, payload)
    services.projector.wait(outcome.position)
    services.scheduler_wakeup.set()
    document = require_job(services, job_id)
    for index, placement in enumerate(document.get("placements") or []):
        if placement["node_id"] == body.node_id and body.node_index in (None, index):
            seen = assignment_of({**document, "node_index": index})
            return answer(ReportAccepted(status=seen.status, accelerators=seen.accelerators,
                                         rendezvous=seen.rendezvous))  # fmt: skip
    return answer(ReportAccepted(status=str(document["status"])))


@router.post("/jobs/{job_id}/logs", openapi_extra=BYTES_BODY)
async def ship_logs(job_id: JobId, offset: LogOffset, agent_id: AgentId, request: Request,
                    services: ServicesDep, node: CurrentNode, node_index: NodeIndex = 0,
                    attempt: AgentAttempt = 1) -> Size:  # fmt: skip
    """Append log bytes of node ``node_index`` of the job's ``attempt`` that start at
    ``offset`` (each attempt's log starts at 0; idempotent)."""
    await run_in_threadpool(job_of_holder, services, job_id, agent_id, node, node_index)
    data = await request.body()  # at most the log chunk limit (api/http/limits.py)
    size = await run_in_threadpool(
        services.artifacts.append_log, attempt_key(str(job_id), attempt), offset, data,
        node_index,
    )  # fmt: skip
    services.log_followers.wake(str(job_id))
    return Size(size=size)


@router.get("/checkpoints/{checkpoint_id}", response_class=Response, responses=ANSWERS)
def download_checkpoint(checkpoint_id: str, services: ServicesDep, node: CurrentNode) -> Response:
    """A checkpoint's archive, for a job of this node's that starts from it: 307 to the store,
    or the bytes; ``X-Flexai-Size`` and ``X-Flexai-Sha256`` say what they must be."""
    node_id = str(Node.create_id(node))
    wanted = any(input_checkpoint_of(document) == checkpoint_id
                 for document in services.queries.assignments(node_id))  # fmt: skip
    found = services.queries.checkpoint_archive(checkpoint_id) if wanted else None
    try:
        if found is None:
            raise FileNotFoundError(checkpoint_id)
        key = checkpoint_key(str(found["job_id"]), checkpoint_id)
        return artifact_answer(services.artifacts, key, f"{found['name']}.zip",
                               size=found["archive_size"], sha256=found["sha256"])  # fmt: skip
    except FileNotFoundError:
        raise Problem(
            404, "checkpoint-not-found", "Checkpoint not found",
            f"no checkpoint {checkpoint_id[:64]} that a job of node {node} starts from",
        ) from None  # fmt: skip
