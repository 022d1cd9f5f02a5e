"""Agents' uploads of checkpoints and outputs: a session per archive, its parts sent straight
to the store (or, for the local store, through ``PUT .../parts/{n}``), then completed
(:class:`api.artifacts.recording.ArtifactRecords`: the store makes the object, its size and
archive are checked, the ledger records it). A partial object is never read, listed or
recorded."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.concurrency import run_in_threadpool

from api.artifacts.store import Part, checkpoint_key, output_key
from api.artifacts.uploads import UploadSession, new_upload_id, now
from api.http.attempts import AgentAttempt
from api.http.deps import CurrentNode, LedgerWritable, ServicesDep
from api.http.problems import Problem, upload_not_found
from api.http.routes.agent import AgentId, JobId, job_of_holder, require_own_node
from api.http.schemas import BYTES_BODY, CheckpointPublic
from api.http.upload_schemas import (
    OutputPublic,
    PartDone,
    PartNumber,
    PartNumbers,
    PartTarget,
    PartTargets,
    UploadAborted,
    UploadComplete,
    UploadCreate,
    UploadStarted,
)
from api.services import Services
from domain.ids import checkpoint_id as derive_checkpoint_id
from domain.values import InvalidValue, check_checkpoint_name

router = APIRouter(prefix="/v1/agent", tags=["agents"])
UploadId = Annotated[str, Path(max_length=64, description="the upload session's id")]


@router.post("/jobs/{job_id}/uploads", status_code=201,
             dependencies=[Depends(LedgerWritable)])  # fmt: skip
def begin_upload(job_id: JobId, body: UploadCreate, agent_id: AgentId, services: ServicesDep,
                 node: CurrentNode, response: Response, attempt: AgentAttempt = 1,
                 ) -> UploadStarted:  # fmt: skip
    """Begin uploading a checkpoint or an output archive of a job of this node's (an unfinished
    upload of the same artifact is replaced); 200 with ``recorded``: the ledger has it already.
    ``attempt``: the job's attempt an output is of (each keeps its own; checkpoints have names
    of their own)."""
    require_own_node(node, body.node_id)
    document = job_of_holder(services, job_id, agent_id, node, body.node_index)
    name = _checked_name(body)
    recorded = services.records.recorded(document, body.kind, name, body.node_index, attempt)
    if recorded is not None:
        response.status_code = 200
        return UploadStarted(id=None, part_size=None, recorded=_public(body.kind, recorded))
    services.records.refuse_unless_recordable(document, body.kind)
    key = (checkpoint_key(str(job_id), derive_checkpoint_id(job_id, name, body.node_index))
           if name is not None else output_key(str(job_id), body.node_index, attempt))  # fmt: skip
    started = services.artifacts.begin_upload(key, body.size_hint)
    session = UploadSession(
        id=new_upload_id(), job_id=str(job_id), kind=body.kind, name=name,
        node_id=body.node_id, node_index=body.node_index, key=key,
        store_upload_id=started.store_upload_id, part_size=started.part_size, created_at=now(),
    )  # fmt: skip
    services.uploads.open(session)
    return UploadStarted(id=session.id, part_size=session.part_size)


@router.post("/uploads/{upload_id}/parts")
def part_targets(upload_id: UploadId, body: PartNumbers, agent_id: AgentId,
                 services: ServicesDep, node: CurrentNode) -> PartTargets:  # fmt: skip
    """Where each of these parts goes: presigned URLs of the store (send no token), or this
    API's ``PUT .../parts/{n}`` (send the agent's token). Ask again for a URL that expired."""
    session = _unfinished(_session(services, upload_id, agent_id, node)[0])
    targets = services.artifacts.part_targets(session.key, session.started, body.numbers,
                                              session.id)  # fmt: skip
    return PartTargets(parts=[PartTarget(number=t.number, url=t.url, headers=dict(t.headers))
                              for t in targets])  # fmt: skip


@router.put("/uploads/{upload_id}/parts/{number}", openapi_extra=BYTES_BODY)
async def put_part(upload_id: UploadId, number: Annotated[PartNumber, Path()], agent_id: AgentId,
                   request: Request, services: ServicesDep, node: CurrentNode,
                   ) -> PartDone:  # fmt: skip
    """One part's bytes (the local store only: the S3 store's parts go straight to it)."""
    found, _ = await run_in_threadpool(_session, services, upload_id, agent_id, node)
    session = _unfinished(found)
    if services.artifacts.kind != "local":
        raise Problem(
            409, "parts-go-to-the-store", "Parts go to the store",
            "this control plane's store takes the parts itself: send each to the URL that "
            f"POST /v1/agent/uploads/{upload_id}/parts answers",
        )  # fmt: skip
    part = await services.artifacts.receive_part(session.key, session.started, number,
                                                 request.stream())  # fmt: skip
    return PartDone(number=part.number, etag=part.etag)


@router.post("/uploads/{upload_id}/complete", dependencies=[Depends(LedgerWritable)])
def complete_upload(upload_id: UploadId, body: UploadComplete, agent_id: AgentId,
                    services: ServicesDep, node: CurrentNode) -> CheckpointPublic | OutputPublic:
    """Make the archive from its parts, check it and record it in the ledger with its size and
    SHA-256; completing it again answers the same. 422: a refused archive (then deleted)."""
    session, document = _session(services, upload_id, agent_id, node)
    parts = [Part(part.number, part.etag) for part in body.parts]
    session = services.records.complete(session, document, parts, body.size, body.sha256)
    assert session.answer is not None
    return _public_model(session.kind, session.answer)


@router.delete("/uploads/{upload_id}")
def abort_upload(upload_id: UploadId, agent_id: AgentId, services: ServicesDep,
                 node: CurrentNode) -> UploadAborted:  # fmt: skip
    """Give an upload up: its parts go (a completed upload stays as it is)."""
    session, _ = _session(services, upload_id, agent_id, node)
    if session.completed_at is not None:
        return UploadAborted(id=session.id, aborted=False)
    services.artifacts.abort_upload(session.key, session.started)
    services.uploads.drop(session.id)
    return UploadAborted(id=session.id, aborted=True)


# -- helpers ---------------------------------------------------------------------------------


def _session(services: Services, upload_id: str, agent_id: str,
             node: str) -> tuple[UploadSession, dict[str, Any]]:  # fmt: skip
    """The session and its job, when it is a job whose node this agent holds."""
    session = services.uploads.get(upload_id)
    if session is None:
        raise upload_not_found(upload_id)
    try:
        require_own_node(node, session.node_id)
        document = job_of_holder(services, UUID(session.job_id), agent_id, node,
                                 session.node_index)  # fmt: skip
    except Problem as problem:
        if problem.status in (403, 404):  # another node's: not even its existence is told
            raise upload_not_found(upload_id) from None
        raise
    return session, document


def _unfinished(session: UploadSession) -> UploadSession:
    if session.completed_at is not None:
        raise Problem(409, "upload-completed", "Upload completed",
                      f"upload {session.id} is completed: it takes no more parts")  # fmt: skip
    return session


def _checked_name(body: UploadCreate) -> str | None:
    if body.kind == "output":
        if body.name is not None:
            raise Problem(422, "invalid-request", "An output has no name",
                          "an output's upload names its node_index, not a name", field="name")
        return None
    try:
        return check_checkpoint_name(body.name)
    except InvalidValue as error:
        raise Problem(422, "invalid-request", "Invalid checkpoint name", str(error),
                      field="name") from None  # fmt: skip


def _public_model(kind: str, recorded: dict[str, Any]) -> CheckpointPublic | OutputPublic:
    if kind == "checkpoint":
        return CheckpointPublic.model_validate(recorded)
    return OutputPublic.model_validate(recorded)


def _public(kind: str, recorded: dict[str, Any]) -> dict[str, object]:
    """A recorded artifact as the API shows it."""
    return _public_model(kind, recorded).model_dump()
