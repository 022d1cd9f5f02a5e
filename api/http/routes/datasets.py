"""Datasets' routes: push a version, list and inspect them; agents download the versions their
jobs were given."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.concurrency import run_in_threadpool

from api.artifacts.datasets import StoredDataset, keep_dataset
from api.artifacts.store import dataset_key
from api.http.deps import CurrentNode, CurrentUser, LedgerWritable, ServicesDep
from api.http.downloads import ANSWERS, artifact_answer
from api.http.names import check_named, named_not_found
from api.http.problems import Problem
from api.http.routes.agent import AgentId, JobId, require_job
from api.http.schemas import DatasetDetail, DatasetPublic, DatasetPushed, DatasetsPublic
from api.services import Services
from common.contract import DATASET_RULE
from common.job_spec import JobSpec
from domain.actors import user
from domain.node import Node
from domain.values import check_dataset_name

router = APIRouter(prefix="/v1", tags=["datasets"])
DatasetName = Annotated[str, Path(description=DATASET_RULE)]
ContentHash = Annotated[
    str, Path(pattern=r"^[0-9a-f]{64}$", description="a version's SHA-256 (of its archive)")
]


def dataset_not_found(name: str) -> Problem:
    return named_not_found("dataset", name, "push it with `flexai dataset push NAME PATH`")


def _check_name(name: str) -> None:
    check_named("dataset", check_dataset_name, name)


ZIP_BODY = {"requestBody": {"required": True, "content": {
    "application/zip": {"schema": {"type": "string", "format": "binary"}}}}}  # fmt: skip


@router.put("/datasets/{name}", dependencies=[Depends(LedgerWritable)], openapi_extra=ZIP_BODY)
async def push_dataset(
    name: DatasetName, request: Request, services: ServicesDep, owner: CurrentUser
) -> DatasetPushed:
    """Push a new version of a dataset: the body is a zip of its files, streamed."""
    _check_name(name)
    store = services.artifacts
    scratch, size, content_hash = await store.receive_hashed(request.stream())
    stored = await run_in_threadpool(keep_dataset, store, scratch, size, content_hash)
    return await run_in_threadpool(_record, services, owner, name, stored)


def _record(services: Services, owner: str, name: str, stored: StoredDataset) -> DatasetPushed:
    position = services.jobs.push_dataset(
        owner, name, stored.content_hash, stored.size, stored.files, by=user(owner),
        archive_size=stored.archive_size,
    )  # fmt: skip
    services.projector.wait(position)
    row = services.queries.dataset(owner, name)
    if row is None:
        raise dataset_not_found(name)
    return DatasetPushed.model_validate({**row, "changed": position is not None})


@router.get("/datasets")
def list_datasets(services: ServicesDep, owner: CurrentUser) -> DatasetsPublic:
    """List your datasets by name, each with its latest version."""
    rows = services.queries.datasets(owner)
    datasets = [DatasetPublic.model_validate(row) for row in rows]
    return DatasetsPublic(datasets=datasets, count=len(datasets))


@router.get("/datasets/{name}")
def inspect_dataset(name: DatasetName, services: ServicesDep, owner: CurrentUser) -> DatasetDetail:
    """A dataset's latest version and every version before it."""
    row = services.queries.dataset(owner, name)
    if row is None:
        raise dataset_not_found(name)
    versions = services.queries.dataset_versions(owner, name)
    return DatasetDetail.model_validate({**row, "versions": versions})


@router.get("/agent/jobs/{job_id}/datasets/{content_hash}", response_class=Response,
            responses=ANSWERS)  # fmt: skip
def download_dataset(job_id: JobId, content_hash: ContentHash, agent_id: AgentId,
                     services: ServicesDep, node: CurrentNode) -> Response:  # fmt: skip
    """The archive of a dataset version a job of this agent's node was given: 307 to the
    store, or the bytes; ``X-Flexai-Sha256`` is its hash."""
    document = _job_on_a_node_of(services, job_id, agent_id, node)
    names = [name for name, pinned in _pinned(document).items() if pinned == content_hash]
    if not names:
        raise Problem(
            404, "dataset-not-found", "Dataset not found",
            f"job '{document['name']}' was given no dataset version {content_hash}",
        )  # fmt: skip
    try:
        return artifact_answer(services.artifacts, dataset_key(content_hash),
                               f"{names[0]}.zip", sha256=content_hash)  # fmt: skip
    except FileNotFoundError:
        raise Problem(
            404, "dataset-not-found", "Dataset not found",
            f"the archive of dataset '{names[0]}' version {content_hash[:12]} is gone from the "
            f"control plane's storage; push it again with `flexai dataset push {names[0]} PATH` "
            "and run the job again",
        ) from None  # fmt: skip


def _job_on_a_node_of(
    services: Services, job_id: UUID, agent_id: str, node: str
) -> dict[str, Any]:
    """The job, when it runs on the token's node and this agent holds it."""
    document = require_job(services, job_id, node)
    node_id = str(Node.create_id(node))
    holder = services.state.holder(node_id)
    if holder is not None and holder.agent_id == agent_id:
        return document
    raise Problem(
        409, "wrong-node", "Job belongs to another node",
        f"job '{document['name']}' does not run on a node this agent holds; drop it and take "
        "the node's current assignments",
    )  # fmt: skip


def _pinned(document: dict[str, Any]) -> dict[str, str]:
    return dict(JobSpec.from_dict(document.get("spec") or {}).dataset_hashes)
