"""Request and response bodies: ``JobCreate``, ``JobPublic``, ``JobsPublic``, ..."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi.responses import Response
from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

import domain.specs as specs
import domain.values as values
from api.http.sharing_schemas import (
    JobAttemptsPublic,
    MaxRetries,
    Preemptible,
    Priority,
    RetryExitCodes,
)
from api.http.upload_schemas import RecordedOutput
from common.contract import JOB_NAME_RULE
from common.contract import Report as ReportKind
from common.job_spec import DEFAULT_PRIORITY, DEFAULT_REQUIREMENTS_PATH
from domain.values import InvalidValue


def bounded(check: Callable[..., Any], **kwargs: Any) -> AfterValidator:
    """A pydantic validator running one check of :mod:`domain.values` (the ledger's bounds)."""

    def validate(value: Any) -> Any:
        if value is None:
            return value
        try:
            check(value, "value", **kwargs)
        except InvalidValue as error:
            where = error.field.removeprefix("value").lstrip(".")
            raise ValueError(f"{where} {error.problem}" if where else error.problem) from None
        return value

    return AfterValidator(validate)


def _text(max_length: int, *, multiline: bool = False) -> AfterValidator:
    return bounded(values.check_text, max_length=max_length, multiline=multiline)


JobName = Annotated[str, bounded(values.check_job_name)]
Text = Annotated[str, _text(values.MAX_LABEL)]
Message = Annotated[str, bounded(values.check_message)]
FailureCode = Annotated[str, bounded(values.check_failure_code)]
Commit = Annotated[str, bounded(values.check_commit)]
Accelerators = Annotated[list[int], bounded(values.check_accelerators)]
ExitCode = Annotated[int, Field(ge=0, le=values.MAX_EXIT_CODE)]
BigCount = Annotated[int, Field(ge=0, le=values.BIGINT_MAX)]
BYTES_BODY = {"requestBody": {"required": True, "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}  # fmt: skip
"""OpenAPI's word for a route that reads raw bytes from its body (log bytes, a part)."""
AGENT_ID_PATTERN = r"^[A-Za-z0-9_-]{16,64}$"


class JobCreate(BaseModel):
    """A new job; every bound is the ledger's own (``domain/values.py``). No value is taken for
    another type: ``true`` is no count of accelerators, ``"2"`` no number, ``"yes"`` no
    ``true``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # Read into a JobSpec (api/http/job_specs.py), whose defaults these are.

    name: JobName = Field(description=JOB_NAME_RULE)
    repository_url: Annotated[str, bounded(specs.check_repository_url)] = Field(
        min_length=1,
        description="https://, ssh://, user@host:path, or an absolute path or file:// URL on "
        "the node (the server's --allowed-repo-schemes say which)",
    )
    repository_revision: Annotated[str, _text(values.MAX_REVISION)] | None = None
    requirements_path: Annotated[str, _text(values.MAX_PATH)] = DEFAULT_REQUIREMENTS_PATH
    accels: int = Field(default=1, ge=1, le=values.MAX_ACCELS)
    nodes: int = Field(default=1, ge=1, le=values.MAX_NODES)
    env: Annotated[dict[str, str], bounded(specs.check_env)] = Field(default_factory=dict)
    secrets: Annotated[dict[str, str], bounded(specs.check_secrets)] = Field(
        default_factory=dict
    )
    datasets: Annotated[list[str], bounded(specs.check_datasets)] = Field(default_factory=list)
    checkpoint: Text | None = None
    entry_point: Annotated[list[str], bounded(specs.check_entry_point)] = Field(min_length=1)
    time_limit_s: int | None = Field(
        default=None, ge=1, le=values.MAX_TIME_LIMIT_S,
        description="end the job (failed, time_limit_exceeded) past this many seconds of "
        "running; default: the server's --default-time-limit",
    )
    stop_grace_s: int | None = Field(
        default=None, ge=0, le=values.MAX_STOP_GRACE_S,
        description="seconds between SIGTERM and SIGKILL when the job is stopped or ended "
        "(default: the agent's --stop-grace)",
    )
    priority: Priority = DEFAULT_PRIORITY
    preemptible: Preemptible = None
    max_retries: MaxRetries = 0
    retry_on_exit_codes: RetryExitCodes = Field(default_factory=list)
    runtime: Annotated[str, bounded(values.check_runtime_name)] | None = Field(
        default=None, description="the runtime (an image an admin named) the job runs in; "
        "`flexai runtime list` shows them; default, or `host`: the node's own system",
    )  # fmt: skip


class Actor(BaseModel):
    kind: str
    id: str


class HistoryEntry(BaseModel):
    event: str
    status: str
    at: str
    by: Actor
    facts: dict[str, Any]


class Failure(BaseModel):
    code: str
    message: str
    kind: Literal["infrastructure", "user"] | None = None
    """Whose failure it was (``domain.failures``): the infrastructure's (a lost node, ...) or
    the job's own; None for a stop that failed."""


class LogsUnavailable(BaseModel):
    """The control plane could not store the job's logs past ``offset`` (of ``written``)."""

    message: str
    offset: int
    written: int
    at: str


class JobSummary(BaseModel):
    id: str
    owner: str
    name: str
    status: str
    accels: int
    nodes: int
    node: str | None
    created_at: str
    started_at: str | None
    ended_at: str | None
    duration_seconds: float | None
    reason: str | None = None
    """Why a waiting job (scheduling, enqueued) waits, in one line."""


class JobPublic(JobAttemptsPublic, JobSummary):
    spec: dict[str, Any]
    commit: str | None
    accelerators: list[int]
    updated_at: str
    failure: Failure | None
    stop: dict[str, Any] | None
    logs_unavailable: LogsUnavailable | None = None
    image_digest: str | None = None
    """The digest of the runtime's image the job was built in (its first node's report)."""
    outputs: list[RecordedOutput] = Field(default_factory=list)
    """The output archive recorded for each node that uploaded one (by node index)."""
    placements: list[dict[str, Any]] = Field(default_factory=list)
    """One per node: index, node, address, built, accelerators, exit_code."""
    rendezvous: Rendezvous | None = None
    waiting: dict[str, Any] | None = None
    """Why the job waits: what it asked for, each candidate node's state, its place in line."""
    history: list[HistoryEntry]


class JobsPublic(BaseModel):
    jobs: list[JobSummary]
    count: int
    next_cursor: str | None = None
    """Pass as ``cursor`` for the next page; None on the last page."""


class JobDeleted(BaseModel):
    id: str
    name: str
    deleted_at: str


class CheckpointPublic(BaseModel):
    id: str
    name: str
    node: str | None
    step: int | None
    train_loss: float | None
    eval_loss: float | None
    model: str | None
    version: str | None
    inference_ready: bool
    size: int | None
    """The bytes its files unpack to."""
    archive_size: int | None = None
    """The bytes of its archive (None: recorded before archives' sizes were)."""
    sha256: str | None = None
    """The SHA-256 of its archive (None: recorded before archives' hashes were)."""
    created_at: str


class CheckpointsPublic(BaseModel):
    checkpoints: list[CheckpointPublic]


class AuditJob(BaseModel):
    id: str
    name: str
    status: str
    created_at: str
    deleted: bool


class AuditJobs(BaseModel):
    jobs: list[AuditJob]


class AuditEvent(BaseModel):
    version: int
    type: str
    at: str
    by: Actor | None
    facts: dict[str, Any]


class AuditHistory(BaseModel):
    id: str
    events: list[AuditEvent]


class Gpu(BaseModel):
    """One GPU as NVML (or nvidia-smi) describes it."""

    index: int = Field(ge=0, le=values.MAX_ACCELS)
    model: Annotated[str, _text(values.MAX_ACCEL_TYPE)]
    memory_mb: int | None = Field(default=None, ge=0, le=values.BIGINT_MAX)
    uuid: Annotated[str, _text(values.MAX_LABEL)] | None = None


class NodeIsolation(BaseModel):
    """How a node's agent keeps jobs apart (``node_agent.sandbox.isolation``)."""

    level: Literal["sandbox", "user", "none"]
    detail: Annotated[str, bounded(values.check_message)]
    """What jobs share on the node, or what keeps them apart, in one line."""
    limits: bool
    """Whether each job gets memory and process limits (a cgroup)."""


class NodeRegister(BaseModel):
    name: Annotated[str, bounded(values.check_node_name)]
    accels: int = Field(ge=0, le=values.MAX_ACCELS)
    accel_type: Annotated[str, _text(values.MAX_ACCEL_TYPE)] = "cpu"
    agent_id: str = Field(
        pattern=AGENT_ID_PATTERN,
        description="the agent's lasting identity (kept in its work directory): one live "
        "agent per node name",
    )
    address: Annotated[str, bounded(values.check_address)] | None = Field(
        default=None, description="how the node's peers reach it (a multi-node rendezvous)"
    )
    gpus: list[Gpu] = Field(default_factory=list, max_length=values.MAX_ACCELS)
    isolation: NodeIsolation | None = None
    """None: an agent from before isolation levels."""


class NodeRegistered(BaseModel):
    node_id: str
    name: str


class Rendezvous(BaseModel):
    master_addr: str
    master_port: int


class Assignment(BaseModel):
    job_id: str
    name: str
    status: str
    spec: dict[str, Any]
    input_checkpoint_id: str | None
    node_index: int = 0
    """This node's place among the job's nodes (its NODE_RANK)."""
    nnodes: int = 1
    accelerators: list[int] | None = None
    """The indices the control plane allocated to the job on this node, once it runs."""
    rendezvous: Rendezvous | None = None
    """Where a multi-node job's ranks meet (node 0), once it runs."""
    attempt: int = 1  # the job's current attempt, from 1: one more at each preemption or retry
    preempt: bool = False  # in progress, and this node is to stop it for a higher-priority job


class Assignments(BaseModel):
    assignments: list[Assignment]
    etag: str = ""
    """A digest of ``assignments``: pass it back as ``since`` to wait for a change."""


class Report(BaseModel):
    node_id: str = Field(pattern=r"^[0-9a-fA-F-]{32,36}$")
    type: ReportKind
    node_index: int | None = Field(
        default=None, ge=0, le=values.MAX_NODES,
        description="the reporting node's index in the job (default: its only placement)",
    )
    commit: Commit | None = None
    master_port: int | None = Field(
        default=None, ge=1, le=values.MAX_PORT,
        description="built, node 0 of a multi-node job: the rendezvous port it picked",
    )
    image_digest: Annotated[str, bounded(values.check_image_digest)] | None = Field(
        default=None, description="built, a job with a runtime: the digest (sha256:...) of "
        "the image the node pulled and runs the job in",
    )  # fmt: skip
    exit_code: ExitCode | None = None
    code: FailureCode | None = None
    message: Message | None = None
    offset: BigCount | None = Field(
        default=None, description="logs_unavailable: the log bytes stored so far"
    )
    written: BigCount | None = Field(
        default=None, description="logs_unavailable: the log bytes the job wrote so far"
    )
    ended_at: AwareDatetime | None = Field(
        default=None, description="exited, failed, stopped: when the entry point ended, by the "
        "node's clock (default: when the report comes; one later than that is taken as now)",
    )  # fmt: skip


class ReportAccepted(BaseModel):
    status: str
    accelerators: list[int] | None = None
    """The reporting node's allocated indices when the job runs (a ``built`` report whose job
    could start at once needs no further poll)."""
    rendezvous: Rendezvous | None = None
    """Where a multi-node job's ranks meet, once it runs."""


class Size(BaseModel):
    size: int


class NodePublic(BaseModel):
    id: str
    name: str
    accels: int
    accel_type: str
    busy_accels: int
    alive: bool
    registered_at: str
    isolation: NodeIsolation | None = None


class NodesPublic(BaseModel):
    nodes: list[NodePublic]


# -- datasets -------------------------------------------------------------------------------


class DatasetPublic(BaseModel):
    """A dataset with its latest version: the one jobs submitted from now on get."""

    name: str
    version: int
    content_hash: str = Field(description="the SHA-256 of the version's zip archive")
    size: int = Field(description="the bytes of its files, unpacked")
    files: int
    created_at: str
    pushed_at: str
    pushed_by: str


class DatasetPushed(DatasetPublic):
    changed: bool = Field(description="false when the latest version held this content already")


class DatasetsPublic(BaseModel):
    datasets: list[DatasetPublic]
    count: int


class DatasetVersion(BaseModel):
    version: int
    content_hash: str
    size: int
    files: int
    pushed_at: str
    pushed_by: str


class DatasetDetail(DatasetPublic):
    versions: list[DatasetVersion] = Field(description="every version, newest first")


# -- answers ---------------------------------------------------------------------------------


def answer(model: BaseModel, status_code: int = 200) -> Response:
    """``model`` as FastAPI answers a route's response model (JSON, by alias), made in the
    route's own thread: FastAPI would validate again what the route just built, in another hop
    to the thread pool (a tenth of a list page's time). The route keeps ``response_model`` for
    the schema."""
    return Response(model.model_dump_json(by_alias=True), status_code,
                    media_type="application/json")
