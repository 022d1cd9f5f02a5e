"""The training job ledger's model: statuses, transitions, names, and the aggregates.

Every public command method guards (checks the transition, computes derived facts), then
triggers a private ``@event`` method whose body only mutates: bodies re-run on every replay.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any
from uuid import UUID, uuid5

from eventsourcing.domain import Aggregate, event

import domain.values as values
from domain.values import InvalidValue

NAMESPACE = UUID("6f1d1c3e-2b9a-4f5e-9a51-3c1f0e8d7a42")

Actor = dict[str, str]
"""Who caused an event: ``{"kind": "user" | "scheduler" | "agent", "id": ...}``."""


def user(user_id: str) -> Actor:
    return {"kind": "user", "id": user_id}


def scheduler() -> Actor:
    return {"kind": "scheduler", "id": "scheduler"}


def agent(node_name: str) -> Actor:
    return {"kind": "agent", "id": node_name}


class Status(StrEnum):
    PENDING = "pending"
    SCHEDULING = "scheduling"
    REJECTED = "rejected"
    BUILDING = "building"
    IN_PROGRESS = "in progress"
    ENQUEUED = "enqueued"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOP_IN_PROGRESS = "stop in progress"
    STOPPED = "stopped"
    STOP_FAILED = "stop failed"


TERMINAL = frozenset(
    {Status.REJECTED, Status.SUCCEEDED, Status.FAILED, Status.STOPPED, Status.STOP_FAILED}
)
ON_A_NODE = frozenset(
    {Status.BUILDING, Status.ENQUEUED, Status.IN_PROGRESS, Status.STOP_IN_PROGRESS}
)

TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.PENDING: frozenset({Status.SCHEDULING, Status.STOP_IN_PROGRESS}),
    Status.SCHEDULING: frozenset({Status.BUILDING, Status.REJECTED, Status.STOP_IN_PROGRESS}),
    Status.BUILDING: frozenset(
        {Status.IN_PROGRESS, Status.ENQUEUED, Status.FAILED, Status.STOP_IN_PROGRESS}
    ),
    Status.ENQUEUED: frozenset({Status.IN_PROGRESS, Status.SCHEDULING, Status.STOP_IN_PROGRESS}),
    Status.IN_PROGRESS: frozenset({Status.SUCCEEDED, Status.FAILED, Status.STOP_IN_PROGRESS}),
    Status.STOP_IN_PROGRESS: frozenset({Status.STOPPED, Status.STOP_FAILED}),
}

# The status each event leaves the job in; events absent here leave it unchanged.
EVENT_STATUS: dict[str, Status] = {
    "Submitted": Status.PENDING,
    "SchedulingStarted": Status.SCHEDULING,
    "NodeAssigned": Status.BUILDING,
    "Rejected": Status.REJECTED,
    "Enqueued": Status.ENQUEUED,
    "Started": Status.IN_PROGRESS,
    "BuildFailed": Status.FAILED,
    "Requeued": Status.SCHEDULING,
    "Succeeded": Status.SUCCEEDED,
    "Failed": Status.FAILED,
    "StopRequested": Status.STOP_IN_PROGRESS,
    "Stopped": Status.STOPPED,
    "StopFailed": Status.STOP_FAILED,
}


class DomainError(Exception):
    """A command that the model refuses; the message says what to do."""


class IllegalTransition(DomainError):
    def __init__(self, name: str, current: Status, attempted: Status) -> None:
        self.current = current
        self.attempted = attempted
        super().__init__(
            f"job '{name}' is '{current}' and cannot become '{attempted}'"
        )


class InvalidJobSpec(DomainError):
    """A value out of its bounds; ``field`` names it for the API's problem details."""

    def __init__(self, message: str, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


def _checked(check: Any, *args: Any, **kwargs: Any) -> Any:
    """Run one bounds check of :mod:`domain.values`; its refusal becomes InvalidJobSpec."""
    try:
        return check(*args, **kwargs)
    except InvalidValue as error:
        raise InvalidJobSpec(f"{error}", field=error.field) from None


class NameTaken(DomainError):
    def __init__(self, name: str) -> None:
        super().__init__(
            f"a job named '{name}' already exists; pick another name, or delete that job "
            f"first (`flexai training delete {name}`)"
        )


class JobNotTerminal(DomainError):
    def __init__(self, name: str, status: Status) -> None:
        self.status = status
        super().__init__(
            f"job '{name}' is '{status}' and only a finished job can be deleted; "
            f"stop it first (`flexai training stop {name}`)"
        )


class JobDeleted(DomainError):
    def __init__(self, name: str) -> None:
        super().__init__(f"job '{name}' was deleted; its history stays readable for audit")


NAME_PATTERN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]{1,61})[A-Za-z0-9]")


def check_name(name: str) -> None:
    """Names: 3 to 63 of ``[A-Za-z0-9_-]``, starting and ending with a letter or digit."""
    if NAME_PATTERN.fullmatch(name):
        return
    if not 3 <= len(name) <= 63:
        problem = f"is {len(name)} characters long; use 3 to 63"
    elif re.search(r"[^A-Za-z0-9_-]", name):
        problem = "may hold only letters, digits, '-' and '_'"
    else:
        problem = "must start and end with a letter or a digit"
    raise InvalidJobSpec(f"job name '{name}' {problem}", "name")


def check_spec(spec: dict[str, Any]) -> None:
    if not spec.get("repository_url"):
        raise InvalidJobSpec("a repository URL is required (--repository-url)", "repository_url")
    if not spec.get("entry_point"):
        raise InvalidJobSpec("an entry point is required (after `--`)", "entry_point")
    _checked(values.check_spec, spec)


class TrainingJob(Aggregate):
    """One training job; its events are the job's whole history."""

    @classmethod
    def submit(cls, owner: str, name: str, spec: dict[str, Any], by: Actor) -> TrainingJob:
        check_name(name)
        check_spec(spec)
        return cls(owner=owner, name=name, spec=spec, by=by)

    @event("Submitted")
    def __init__(self, owner: str, name: str, spec: dict[str, Any], by: Actor) -> None:
        self.owner = owner
        self.name = name
        self.spec = spec
        self.status = Status.PENDING
        self.node_id: str | None = None
        self.node_name: str | None = None
        self.commit: str | None = None
        self.accelerators: list[int] = []
        self.failure: dict[str, str] | None = None
        self.checkpoint_ids: set[str] = set()
        self.logs_unavailable_at: set[int] = set()
        self.deleted = False

    # -- guards ---------------------------------------------------------------------------

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    def _require(self, attempted: Status) -> None:
        if self.deleted:
            raise JobDeleted(self.name)
        if attempted not in TRANSITIONS.get(self.status, frozenset()):
            raise IllegalTransition(self.name, self.status, attempted)

    # -- commands -------------------------------------------------------------------------

    def begin_scheduling(self, by: Actor) -> None:
        self._require(Status.SCHEDULING)
        if self.status == Status.ENQUEUED:
            raise IllegalTransition(self.name, self.status, Status.SCHEDULING)
        self._scheduling_started(by=by)

    def assign(self, node_id: str, node_name: str, by: Actor) -> None:
        self._require(Status.BUILDING)
        self._node_assigned(node_id=node_id, node_name=node_name, by=by)

    def reject(self, code: str, message: str, by: Actor) -> None:
        self._require(Status.REJECTED)
        _check_failure(code, message)
        self._rejected(code=code, message=message, by=by)

    def enqueue(self, commit: str | None, by: Actor) -> None:
        self._require(Status.ENQUEUED)
        _checked(values.check_commit, commit)
        self._enqueued(commit=commit, by=by)

    def start(self, commit: str | None, accelerators: list[int], by: Actor) -> None:
        self._require(Status.IN_PROGRESS)
        _checked(values.check_commit, commit)
        _checked(values.check_accelerators, accelerators)
        self._started(commit=commit or self.commit, accelerators=list(accelerators), by=by)

    def fail_build(self, code: str, message: str, commit: str | None, by: Actor) -> None:
        self._require(Status.FAILED)
        if self.status != Status.BUILDING:
            raise IllegalTransition(self.name, self.status, Status.FAILED)
        _check_failure(code, message)
        _checked(values.check_commit, commit)
        self._build_failed(code=code, message=message, commit=commit, by=by)

    def requeue(self, reason: str, by: Actor) -> None:
        self._require(Status.SCHEDULING)
        if self.status != Status.ENQUEUED:
            raise IllegalTransition(self.name, self.status, Status.SCHEDULING)
        self._requeued(reason=reason, by=by)

    def finish(self, exit_code: int, by: Actor) -> None:
        _checked(values.check_exit_code, exit_code)
        if exit_code == 0:
            self._require(Status.SUCCEEDED)
            self._succeeded(exit_code=0, by=by)
            return
        self._require(Status.FAILED)
        if self.status != Status.IN_PROGRESS:  # building -> failed is a build failure only
            raise IllegalTransition(self.name, self.status, Status.FAILED)
        message = f"the entry point exited with code {exit_code}"
        self._failed(code="entry_point_failed", message=message, exit_code=exit_code, by=by)

    def fail(self, code: str, message: str, by: Actor) -> None:
        self._require(Status.FAILED)
        if self.status != Status.IN_PROGRESS:
            raise IllegalTransition(self.name, self.status, Status.FAILED)
        _check_failure(code, message)
        self._failed(code=code, message=message, exit_code=None, by=by)

    def request_stop(self, by: Actor) -> None:
        self._require(Status.STOP_IN_PROGRESS)
        self._stop_requested(stopping_from=self.status.value, by=by)

    def confirm_stopped(self, by: Actor, exit_code: int | None = None) -> None:
        """The processes ended; ``exit_code`` is how the entry point ended, when it ran (an
        exit 0 that raced the stop included)."""
        self._require(Status.STOPPED)
        if exit_code is not None:
            _checked(values.check_exit_code, exit_code)
        self._stopped(accelerators_released=list(self.accelerators), exit_code=exit_code, by=by)

    def fail_stop(self, message: str, by: Actor) -> None:
        self._require(Status.STOP_FAILED)
        _checked(values.check_message, message)
        self._stop_failed(message=message, by=by)

    def note_logs_unavailable(self, message: str, offset: int, written: int, by: Actor) -> bool:
        """Record that the job's logs could not be stored past ``offset``; once per offset."""
        if self.deleted:
            raise JobDeleted(self.name)
        if self.status not in ON_A_NODE:
            raise DomainError(
                f"job '{self.name}' is '{self.status}'; log problems are reported only while "
                "it is on a node"
            )
        _checked(values.check_message, message)
        _checked(values.check_int, offset, "offset", 0, values.BIGINT_MAX)
        _checked(values.check_int, written, "written", offset, values.BIGINT_MAX)
        if offset in self.logs_unavailable_at:
            return False
        self._logs_unavailable(message=message, offset=offset, written=written, by=by)
        return True

    def record_checkpoint(self, checkpoint: dict[str, Any], by: Actor) -> bool:
        """Record a checkpoint once; returns False when it is already recorded."""
        if self.deleted:
            raise JobDeleted(self.name)
        if checkpoint["id"] in self.checkpoint_ids:
            return False
        if self.status not in (Status.IN_PROGRESS, Status.STOP_IN_PROGRESS):
            raise DomainError(
                f"job '{self.name}' is '{self.status}'; checkpoints are taken only while it runs"
            )
        _checked(values.check_checkpoint_name, checkpoint["name"], "checkpoint name")
        _checked(values.check_optional, checkpoint.get("node"), "node", values.MAX_LABEL)
        checkpoint = {**checkpoint, **values.clean_checkpoint_facts(checkpoint)}
        self._checkpoint_recorded(checkpoint=checkpoint, by=by)
        return True

    def delete(self, by: Actor) -> None:
        if self.deleted:
            raise JobDeleted(self.name)
        if not self.is_terminal:
            raise JobNotTerminal(self.name, self.status)
        self._deleted(by=by)

    # -- events: bodies only mutate -------------------------------------------------------

    @event("SchedulingStarted")
    def _scheduling_started(self, by: Actor) -> None:
        self.status = Status.SCHEDULING

    @event("NodeAssigned")
    def _node_assigned(self, node_id: str, node_name: str, by: Actor) -> None:
        self.node_id = node_id
        self.node_name = node_name
        self.status = Status.BUILDING

    @event("Rejected")
    def _rejected(self, code: str, message: str, by: Actor) -> None:
        self.failure = {"code": code, "message": message}
        self.status = Status.REJECTED

    @event("Enqueued")
    def _enqueued(self, commit: str | None, by: Actor) -> None:
        self.commit = commit
        self.status = Status.ENQUEUED

    @event("Started")
    def _started(self, commit: str | None, accelerators: list[int], by: Actor) -> None:
        self.commit = commit
        self.accelerators = list(accelerators)
        self.status = Status.IN_PROGRESS

    @event("BuildFailed")
    def _build_failed(self, code: str, message: str, commit: str | None, by: Actor) -> None:
        self.commit = commit
        self.failure = {"code": code, "message": message}
        self.status = Status.FAILED

    @event("Requeued")
    def _requeued(self, reason: str, by: Actor) -> None:
        self.node_id = None
        self.node_name = None
        self.status = Status.SCHEDULING

    @event("Succeeded")
    def _succeeded(self, exit_code: int, by: Actor) -> None:
        self.status = Status.SUCCEEDED

    @event("Failed")
    def _failed(self, code: str, message: str, exit_code: int | None, by: Actor) -> None:
        self.failure = {"code": code, "message": message}
        self.status = Status.FAILED

    @event("StopRequested")
    def _stop_requested(self, stopping_from: str, by: Actor) -> None:
        self.status = Status.STOP_IN_PROGRESS

    @event("Stopped")
    def _stopped(
        self, accelerators_released: list[int], by: Actor, exit_code: int | None = None
    ) -> None:
        self.accelerators = []
        self.status = Status.STOPPED

    @event("StopFailed")
    def _stop_failed(self, message: str, by: Actor) -> None:
        self.failure = {"code": "stop_failed", "message": message}
        self.status = Status.STOP_FAILED

    @event("LogsUnavailable")
    def _logs_unavailable(self, message: str, offset: int, written: int, by: Actor) -> None:
        self.logs_unavailable_at.add(offset)

    @event("CheckpointRecorded")
    def _checkpoint_recorded(self, checkpoint: dict[str, Any], by: Actor) -> None:
        self.checkpoint_ids.add(checkpoint["id"])

    @event("Deleted")
    def _deleted(self, by: Actor) -> None:
        self.deleted = True


class JobName(Aggregate):
    """Holds one owner's job name in the ledger, so a name is unique among live jobs."""

    @staticmethod
    def create_id(owner: str, name: str) -> UUID:
        return uuid5(NAMESPACE, f"job-name\x00{owner}\x00{name}")

    @event("Created")
    def __init__(self, owner: str, name: str, job_id: UUID) -> None:
        self.owner = owner
        self.name = name
        self.job_id: UUID | None = job_id

    def claim(self, job_id: UUID) -> None:
        if self.job_id is not None:
            raise NameTaken(self.name)
        self._claimed(job_id=job_id)

    def release(self, job_id: UUID) -> None:
        if self.job_id == job_id:
            self._released(job_id=job_id)

    @event("Claimed")
    def _claimed(self, job_id: UUID) -> None:
        self.job_id = job_id

    @event("Released")
    def _released(self, job_id: UUID) -> None:
        self.job_id = None


class Node(Aggregate):
    """A host that runs jobs; registered by its agent."""

    @staticmethod
    def create_id(name: str) -> UUID:
        return uuid5(NAMESPACE, f"node\x00{name}")

    @classmethod
    def register(cls, name: str, accels: int, accel_type: str, by: Actor) -> Node:
        _checked(values.check_node_name, name)
        _check_capacity(accels, accel_type)
        return cls(name=name, accels=accels, accel_type=accel_type, by=by)

    @event("Registered")
    def __init__(self, name: str, accels: int, accel_type: str, by: Actor) -> None:
        self.name = name
        self.accels = accels
        self.accel_type = accel_type

    def update(self, accels: int, accel_type: str, by: Actor) -> None:
        _check_capacity(accels, accel_type)
        if (accels, accel_type) != (self.accels, self.accel_type):
            self._updated(accels=accels, accel_type=accel_type, by=by)

    @event("Updated")
    def _updated(self, accels: int, accel_type: str, by: Actor) -> None:
        self.accels = accels
        self.accel_type = accel_type


def _check_capacity(accels: int, accel_type: str) -> None:
    _checked(values.check_int, accels, "accels", 0, values.MAX_ACCELS)
    _checked(values.check_text, accel_type, "accel_type", max_length=values.MAX_ACCEL_TYPE)


def _check_failure(code: str, message: str) -> None:
    _checked(values.check_failure_code, code)
    _checked(values.check_message, message)


ENVELOPE = frozenset({"originator_id", "originator_version", "timestamp", "by", "originator_topic"})


def event_name(domain_event: object) -> str:
    """``TrainingJob.Started`` -> ``Started``."""
    return type(domain_event).__name__


def event_facts(domain_event: object) -> dict[str, Any]:
    """The facts an event carries, without the envelope (id, version, time, actor)."""
    return {
        key: value
        for key, value in vars(domain_event).items()
        if key not in ENVELOPE and not key.startswith("_")
    }
