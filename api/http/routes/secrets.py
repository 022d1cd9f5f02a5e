"""Secrets' routes: a user creates, lists and deletes their secrets (names and dates only come
back); the agent running a job gets the values of the secrets the job names, while it builds or
runs, and never at any other time.

A value never reaches the ledger, a log line or an error message: it is sealed in the
operational database (:mod:`api.identity.secrets`) and only the agent's route opens it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Response

from api.http.deps import CurrentNode, CurrentUser, ServicesDep
from api.http.names import check_named, named_not_found
from api.http.problems import Problem
from api.http.routes.agent import AgentId, JobId, NodeIndex, job_of_holder
from api.http.secret_schemas import (
    JobSecretValues,
    SecretCreate,
    SecretDeleted,
    SecretPublic,
    SecretsPublic,
    SecretValue,
)
from api.identity.secrets import SecretExists, SecretUnreadable, StoredSecret
from common.contract import SECRET_RULE
from common.job_spec import JobSpec
from domain.statuses import Status
from domain.values import check_secret_name

router = APIRouter(prefix="/v1", tags=["secrets"])
SecretNamePath = Annotated[str, Path(description=SECRET_RULE)]
_WHILE = (Status.BUILDING.value, Status.IN_PROGRESS.value, Status.STOP_IN_PROGRESS.value)
"""The statuses in which a job's agent may read its secrets: it builds, or its processes run
(a stopping job's too: an agent that restarted under it masks the rest of its log with them)."""


def secret_not_found(name: str) -> Problem:
    return named_not_found("secret", name, "create it with `flexai secret create NAME`")


def _check_name(name: str) -> None:
    check_named("secret", check_secret_name, name)


def _public(stored: StoredSecret) -> SecretPublic:
    return SecretPublic(name=stored.name, created_at=stored.created_at,
                        updated_at=stored.updated_at)  # fmt: skip


@router.post("/secrets", status_code=201)
def create_secret(body: SecretCreate, services: ServicesDep, owner: CurrentUser) -> SecretPublic:
    """Create a secret; a name you already use is refused (409), never overwritten."""
    try:
        stored = services.secrets.create(owner, body.name, body.value)
    except SecretExists:
        raise Problem(
            409, "secret-exists", "Secret already exists",
            f"you already have a secret named '{body.name}'; replace its value with "
            f"`flexai secret create {body.name} --update`, or delete it first with "
            f"`flexai secret delete {body.name}`",
        ) from None  # fmt: skip
    return _public(stored)


@router.put("/secrets/{name}", responses={201: {"model": SecretPublic, "description": "Created"}})
def put_secret(
    name: SecretNamePath, body: SecretValue, services: ServicesDep, owner: CurrentUser,
    response: Response,
) -> SecretPublic:  # fmt: skip
    """Create a secret, or replace its value (jobs that start building later get the new one)."""
    _check_name(name)
    stored, created = services.secrets.put(owner, name, body.value)
    response.status_code = 201 if created else 200
    return _public(stored)


@router.get("/secrets")
def list_secrets(services: ServicesDep, owner: CurrentUser) -> SecretsPublic:
    """Your secrets by name, with when each was created and last set; never their values."""
    listed = [_public(stored) for stored in services.secrets.listed(owner)]
    return SecretsPublic(secrets=listed, count=len(listed))


@router.delete("/secrets/{name}")
def delete_secret(name: SecretNamePath, services: ServicesDep, owner: CurrentUser) -> SecretDeleted:
    """Delete a secret; jobs that name it and build later fail ``secret_not_found``."""
    _check_name(name)
    if not services.secrets.delete(owner, name):
        raise secret_not_found(name)
    return SecretDeleted(name=name, deleted_at=datetime.now(UTC).isoformat())


@router.get("/agent/jobs/{job_id}/secrets")
def job_secrets(job_id: JobId, agent_id: AgentId, services: ServicesDep, node: CurrentNode,
                node_index: NodeIndex = 0) -> JobSecretValues:  # fmt: skip
    """The values of the job's ``--secret`` variables (its owner's secrets), for the agent
    holding that node of the job, while the job builds or runs."""
    document = job_of_holder(services, job_id, agent_id, node, node_index)
    if document["status"] not in _WHILE:
        raise Problem(
            409, "job-not-running", "Job neither building nor running",
            f"job '{document['name']}' is '{document['status']}': its secrets are given only "
            "while it builds or runs",
        )  # fmt: skip
    wanted = _secrets_of(document)
    try:
        found, missing = services.secrets.values(str(document["owner"]), wanted.values())
    except SecretUnreadable as error:
        raise Problem(500, "secret-unreadable", "Secret unreadable", str(error)) from None
    if missing:
        shown = ", ".join(f"'{name}'" for name in missing)
        raise Problem(
            404, "secret-not-found", "Secret not found",
            f"the job's owner has no secret named {shown}: create it with "
            f"`flexai secret create {missing[0]}` and run the job again",
            missing=missing,
        )  # fmt: skip
    return JobSecretValues(secrets={variable: found[name] for variable, name in wanted.items()})


def _secrets_of(document: dict[str, Any]) -> dict[str, str]:
    return dict(JobSpec.from_dict(document.get("spec") or {}).secrets)
