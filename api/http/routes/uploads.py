"""Agents' uploads of checkpoints and outputs: a session per archive, its parts sent straight
to the store (or, for the local store, through ``PUT .../parts/{n}``), then completed: the
store makes the object, its size is checked, the archive is checked through the store's
reader, and the ledger records it (``CheckpointRecorded`` or ``OutputsRecorded``) with its
size and SHA-256. A partial object is never read, listed or recorded."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.concurrency import run_in_threadpool

from api.artifacts.archives import (
    ArchiveTooLarge,
    InvalidArchive,
    check_output,
    describe_checkpoint,
)
from api.artifacts.store import Part, UploadIncomplete, checkpoint_key, output_key
from api.artifacts.uploads import UploadSession, new_upload_id, now
from api.http.attempts import AgentAttempt, output_attempt
from api.http.deps import CurrentNode, LedgerWritable, ServicesDep
from api.http.problems import Problem, upload_incomplete, upload_not_found
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
from domain.errors import DomainError, JobDeleted
from domain.ids import checkpoint_id as derive_checkpoint_id
from domain.lifecycle import ROWS
from domain.statuses import Status
from domain.values import InvalidValue, check_checkpoint_name

router = APIRouter(prefix="/v1/agent", tags=["agents"])
UploadId = Annotated[str, Path(max_length=64, description="the upload session's id")]
EVENT = {"checkpoint": "CheckpointRecorded", "output": "OutputsRecorded"}


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
    recorded = _recorded(services, document, body.kind, name, body.node_index, attempt)
    if recorded is not None:
        response.status_code = 200
        return UploadStarted(id=None, part_size=None, recorded=recorded)
    _refuse_unless_recordable(document, EVENT[body.kind])
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
    if session.answer is None:
        answer = (_recorded(services, document, session.kind, session.name, session.node_index)
                  if session.kind == "checkpoint" else None)  # fmt: skip
        if answer is not None and session.completed_at is None:  # another upload recorded it
            services.artifacts.abort_upload(session.key, session.started)
        elif answer is None:
            answer = _make_and_record(services, session, body, document)
        services.uploads.answered(session.id, answer)
        session = replace(session, answer=answer)
    assert session.answer is not None
    if session.kind == "checkpoint":
        return CheckpointPublic.model_validate(session.answer)
    return OutputPublic.model_validate(session.answer)


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


def _refuse_unless_recordable(document: dict[str, Any], event: str) -> None:
    """Refused as the ledger would refuse the event, before a byte is sent."""
    if document.get("deleted_at"):
        raise JobDeleted(document["name"])
    row = ROWS[event]
    status = Status(document["status"])
    if status not in row.sources:
        raise row.refuse(document["name"], status)


def _recorded(services: Services, document: dict[str, Any], kind: str, name: str | None,
              node_index: int, attempt: int = 1) -> dict[str, Any] | None:  # fmt: skip
    """The checkpoint or output (of ``attempt``) the ledger holds already, as complete
    answers it."""
    if kind == "checkpoint" and name is not None:
        wanted = derive_checkpoint_id(UUID(document["id"]), name, node_index)
        for row in services.queries.checkpoints(document["id"]):
            if row["id"] == wanted:
                return CheckpointPublic.model_validate(row).model_dump()
        return None
    for output in document.get("outputs") or []:
        if output["node_index"] == node_index and output_attempt(document, output) == attempt:
            return OutputPublic.model_validate(output).model_dump()
    return None


def _make_and_record(services: Services, session: UploadSession, body: UploadComplete,
                     document: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    store = services.artifacts
    if session.completed_at is None:
        parts = [Part(part.number, part.etag) for part in sorted(body.parts,
                                                                 key=lambda p: p.number)]
        try:
            size = store.complete_upload(session.key, session.started, parts)
        except UploadIncomplete:
            again = services.uploads.get(session.id)  # completed meanwhile by a request sent twice?
            if again is None or again.completed_at is None:
                raise
            size = store.size(session.key) or 0
        services.uploads.made(session.id)
    else:  # made before, not recorded: a complete sent again after the ledger refused
        size = store.size(session.key) or 0
    if size != body.size:
        _discard(services, session)
        raise upload_incomplete(f"the parts make {size} bytes, not the {body.size} bytes of "
                                "the archive")  # fmt: skip
    try:
        with store.open(session.key) as handle:
            if session.kind == "checkpoint":
                metadata = describe_checkpoint(handle, store.limits)
            else:
                check_output(handle, store.limits)
        return _record(services, session, document, size, body.sha256,
                       metadata if session.kind == "checkpoint" else {})  # fmt: skip
    except (InvalidArchive, ArchiveTooLarge, DomainError):
        _discard(services, session)
        raise


def _record(services: Services, session: UploadSession, document: dict[str, Any], size: int,
            sha256: str, metadata: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    job_id = UUID(session.job_id)
    if session.kind == "output":
        outcome = services.jobs.record_outputs(job_id, session.node_id, session.node_index,
                                               size, sha256)  # fmt: skip
        services.projector.wait(outcome.position)
        return OutputPublic(node_index=session.node_index, size=size, sha256=sha256).model_dump()
    assert session.name is not None
    placements = document.get("placements") or []
    node_name = (placements[session.node_index]["node"] if placements
                 else document.get("node") or session.node_id)  # fmt: skip
    checkpoint = {"id": derive_checkpoint_id(job_id, session.name, session.node_index),
                  "name": session.name, "node": node_name, "node_index": session.node_index,
                  **metadata, "archive_size": size, "sha256": sha256}  # fmt: skip
    outcome = services.jobs.record_checkpoint(job_id, session.node_id, checkpoint)
    services.projector.wait(outcome.position)
    recorded = _recorded(services, document, "checkpoint", session.name, session.node_index)
    if recorded is None:
        raise Problem(500, "internal-error", "Checkpoint not recorded", "complete it again")
    return recorded


def _discard(services: Services, session: UploadSession) -> None:
    """A made object the ledger will not record goes, with its session."""
    services.artifacts.delete(session.key)
    services.uploads.drop(session.id)
