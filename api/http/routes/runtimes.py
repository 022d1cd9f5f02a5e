"""Runtimes' routes: admins name the images jobs run in (``--runtime NAME``), every user lists
them, and the agent building a job that names one gets its registry's credentials.

A runtime's registry secret is one of the admin's own secrets (``USER:PASSWORD``): the runtime
keeps its name and owner, the job's spec pins them, and only the agent holding the job's node,
while the job builds, reads its value (:func:`registry_credentials`)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Path

from api.http.deps import CurrentAdmin, CurrentNode, CurrentUser, ServicesDep
from api.http.names import check_named, named_not_found
from api.http.problems import Problem
from api.http.routes.agent import AgentId, JobId, NodeIndex, job_of_holder
from api.http.runtime_schemas import (
    RegistryCredentials,
    RuntimeCreate,
    RuntimeDeleted,
    RuntimePublic,
    RuntimesPublic,
)
from api.identity.secrets import SecretUnreadable
from api.runtimes import Runtime, RuntimeExists
from api.services import Services
from common.contract import RUNTIME_RULE, image_key
from common.job_spec import JobSpec
from domain.statuses import Status
from domain.values import check_runtime_name

router = APIRouter(prefix="/v1", tags=["runtimes"])
RuntimeNamePath = Annotated[str, Path(description=RUNTIME_RULE)]
MAKE_ONE = "an admin makes one with `flexai admin runtime create NAME --image REF`"


def _public(runtime: Runtime, held: dict[str, tuple[str, list[str]]] | None = None
            ) -> RuntimePublic:  # fmt: skip
    digest, nodes = (held or {}).get(image_key(runtime.image) or runtime.image, (None, []))
    return RuntimePublic(**asdict(runtime), digest=digest, nodes=nodes)


def held_images(services: Services) -> dict[str, tuple[str, list[str]]]:
    """Per image reference the nodes said they hold: its digest (as the node that said so
    last holds it) and the names of the live nodes holding it, sorted."""
    live = services.state.live_nodes(services.settings.node_timeout_s)
    names = {str(row["id"]): str(row["name"]) for row in services.queries.nodes()}
    held: dict[str, tuple[str, list[str]]] = {}
    for node_id, reference, digest, _ in services.state.image_rows():  # the latest first
        _, nodes = held.setdefault(reference, (digest, []))
        if node_id in live and node_id in names:
            nodes.append(names[node_id])
    return {reference: (digest, sorted(nodes)) for reference, (digest, nodes) in held.items()}


@router.get("/runtimes")
def list_runtimes(services: ServicesDep, _: CurrentUser) -> RuntimesPublic:
    """The runtimes jobs may name with ``--runtime``, by name: each one's image, the digest
    the nodes hold of it (the latest said, where they differ) and the live nodes holding it."""
    held = held_images(services)
    listed = [_public(runtime, held) for runtime in services.runtimes.listed()]
    return RuntimesPublic(runtimes=listed, count=len(listed))


@router.post("/admin/runtimes", status_code=201)
def create_runtime(body: RuntimeCreate, services: ServicesDep, admin: CurrentAdmin
                   ) -> RuntimePublic:  # fmt: skip
    """Name an image for jobs to run in; its registry secret must be one of yours, holding
    ``USER:PASSWORD``. A name in use is refused (409)."""
    assert admin.user is not None
    secret = None
    if body.registry_secret is not None:
        _login_of(services, admin.user, body.registry_secret, mine=True)
        secret = (admin.user, body.registry_secret)
    try:
        made = services.runtimes.create(body.name, body.image, secret, by=admin.user)
    except RuntimeExists:
        raise Problem(
            409, "runtime-exists", "Runtime already exists",
            f"a runtime named '{body.name}' exists already: delete it first with `flexai admin "
            f"runtime delete {body.name}` (jobs submitted before keep the image they were given)",
        ) from None  # fmt: skip
    return _public(made)


@router.delete("/admin/runtimes/{name}")
def delete_runtime(name: RuntimeNamePath, services: ServicesDep, _: CurrentAdmin
                   ) -> RuntimeDeleted:  # fmt: skip
    """Delete a runtime: jobs submitted before keep the image they were given; new jobs that
    name it are refused."""
    check_named("runtime", check_runtime_name, name)
    if not services.runtimes.delete(name):
        raise named_not_found("runtime", name, "`flexai runtime list` shows them; " + MAKE_ONE)
    return RuntimeDeleted(name=name, deleted_at=datetime.now(UTC).isoformat())


@router.get("/agent/jobs/{job_id}/registry-credentials")
def registry_credentials(job_id: JobId, agent_id: AgentId, services: ServicesDep,
                         node: CurrentNode, node_index: NodeIndex = 0
                         ) -> RegistryCredentials:  # fmt: skip
    """The login to the registry of the job's runtime image (the runtime's registry secret,
    an admin's), for the agent holding that node of the job, while the job builds."""
    document = job_of_holder(services, job_id, agent_id, node, node_index)
    if document["status"] != Status.BUILDING.value:
        raise Problem(
            409, "job-not-building", "Job not building",
            f"job '{document['name']}' is '{document['status']}': its registry credentials are "
            "given only while it builds",
        )  # fmt: skip
    spec = JobSpec.from_dict(document.get("spec") or {})
    if spec.runtime_image is None or spec.registry_secret is None:
        raise Problem(
            404, "no-registry-secret", "No registry secret",
            f"job '{document['name']}' runs in "
            + (f"the image {spec.runtime_image}, pulled without credentials"
               if spec.runtime_image else "no image (runtime host)"),
        )  # fmt: skip
    owner = spec.registry_secret_owner or str(document["owner"])
    username, password = _login_of(services, owner, spec.registry_secret, mine=False)
    return RegistryCredentials(image=spec.runtime_image, username=username, password=password)


def _login_of(services: Services, owner: str, name: str, *, mine: bool) -> tuple[str, str]:
    """The ``USER:PASSWORD`` secret ``name`` of ``owner`` as its two halves; a problem saying
    what to do where it is missing or of another form (never quoting its value)."""
    try:
        found, _ = services.secrets.values(owner, [name])
    except SecretUnreadable as error:
        raise Problem(500, "secret-unreadable", "Secret unreadable", str(error)) from None
    whose = "you have" if mine else f"the runtime's admin {owner} has"
    theirs = "your" if mine else f"{owner}'s"
    if name not in found:
        raise Problem(
            422 if mine else 404, "registry-secret-not-found", "Registry secret not found",
            f"{whose} no secret named '{name}': create it with `flexai secret create {name}` "
            "(its value USER:PASSWORD), then make the runtime"
            + ("" if mine else " again and run the job again"),
            field="registry_secret",
        )  # fmt: skip
    username, colon, password = found[name].partition(":")
    if not (username and colon and password):
        raise Problem(
            422 if mine else 409, "registry-secret-not-a-login", "Registry secret not a login",
            f"the value of {theirs} secret '{name}' is not "
            f"of the form USER:PASSWORD: set it with `flexai secret create {name} --update`",
            field="registry_secret",
        )  # fmt: skip
    return username, password
