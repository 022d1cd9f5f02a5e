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


class JobNotRunning(DomainError):
    """Something only a job ``in progress`` allows (a debug session into it)."""

    def __init__(self, name: str, status: Status) -> None:
        self.status = status
        if status in TERMINAL:
            what = "it has ended; run it again to debug it (`flexai training run`)"
        else:
            what = (f"wait until it is 'in progress' (`flexai training inspect {name}` shows "
                    "its status)")  # fmt: skip
        super().__init__(
            f"job '{name}' is '{status}': a debug session needs a running job; {what}"
        )


class JobDeleted(DomainError):
    def __init__(self, name: str) -> None:
        super().__init__(f"job '{name}' was deleted; its history stays readable for audit")


SESSION_ID = re.compile(r"[a-z0-9]{16,64}")
SESSION_ID_RULE = "16 to 64 lower-case letters and digits"

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
        self.placements: list[dict[str, Any]] = []
        """One per node of the job: ``node_id``, ``node_name``, ``address``, ``built``,
        ``accelerators``, ``exit_code``, ``stopped``."""
        self.master_port: int | None = None
        self.refused: set[str] = set()
        self.debug_sessions: set[str] = set()
        """The ids of the debug sessions open into the job."""
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

    @property
    def nnodes(self) -> int:
        return int(self.spec.get("nodes", 1))

    @property
    def all_built(self) -> bool:
        return bool(self.placements) and all(p["built"] for p in self.placements)

    def placement_index(self, node_id: str, node_index: int | None) -> int | None:
        """The index of ``node_id`` in the job (``node_index`` when given), or None."""
        for index, placement in enumerate(self.placements):
            if placement["node_id"] == node_id and node_index in (None, index):
                return index
        return None

    def assign(
        self, node_id: str, node_name: str, by: Actor, nodes: list[dict[str, Any]] | None = None
    ) -> None:
        """Place the job on its nodes (``nodes``: one ``{node_id, node_name, address}`` per
        node index; by default the one node given)."""
        self._require(Status.BUILDING)
        nodes = nodes or [{"node_id": node_id, "node_name": node_name, "address": None}]
        if len(nodes) != self.nnodes or len({n["node_id"] for n in nodes}) != len(nodes):
            raise InvalidJobSpec(
                f"job '{self.name}' runs on {self.nnodes} distinct node(s), not {len(nodes)}",
                "nodes",
            )
        for node in nodes:
            _checked(values.check_node_name, node["node_name"], "node_name")
            if node.get("address") is not None:
                _checked(values.check_address, node["address"])
        placed = [{key: node.get(key) for key in ("node_id", "node_name", "address")}
                  for node in nodes]  # fmt: skip
        self._node_assigned(node_id=str(placed[0]["node_id"]),
                            node_name=str(placed[0]["node_name"]), nodes=placed, by=by)  # fmt: skip

    def reject(self, code: str, message: str, by: Actor) -> None:
        self._require(Status.REJECTED)
        _check_failure(code, message)
        self._rejected(code=code, message=message, by=by)

    def record_built(
        self, node_index: int, commit: str | None, master_port: int | None, by: Actor
    ) -> bool:
        """One node's build succeeded; False when that node's build is already recorded."""
        self._require_on_node()
        _checked(values.check_commit, commit)
        if master_port is not None:
            _checked(values.check_port, master_port)
        placement = self._placement(node_index)
        if placement["built"]:
            return False
        if self.status != Status.BUILDING:
            raise IllegalTransition(self.name, self.status, Status.IN_PROGRESS)
        self._built(node_index=node_index, commit=commit, master_port=master_port, by=by)
        return True

    def enqueue(self, commit: str | None, by: Actor, waiting_on: list[str] | None = None) -> None:
        """Built, but the accelerators are busy (``waiting_on``: the nodes that are busy)."""
        self._require(Status.ENQUEUED)
        _checked(values.check_commit, commit)
        self._enqueued(commit=commit, waiting_on=list(waiting_on or []), by=by)

    def start(
        self, commit: str | None, accelerators: list[int], by: Actor,
        allocations: list[list[int]] | None = None,
    ) -> None:  # fmt: skip
        """Every node is built and its accelerators allocated (``allocations``: the indices
        per node index; by default ``accelerators`` on the one node)."""
        self._require(Status.IN_PROGRESS)
        _checked(values.check_commit, commit)
        allocations = allocations if allocations is not None else [list(accelerators)]
        for indices in allocations:
            _checked(values.check_accelerators, indices)
        if self.placements and len(allocations) != len(self.placements):
            raise InvalidJobSpec("an allocation is needed for every node", "accelerators")
        if self.placements and not self.all_built:
            raise DomainError(f"job '{self.name}' cannot start before every node is built")
        self._started(commit=commit or self.commit, accelerators=list(allocations[0]),
                      allocations=[list(a) for a in allocations], by=by)  # fmt: skip

    def fail_build(
        self, code: str, message: str, commit: str | None, by: Actor, node_index: int = 0
    ) -> None:
        self._require(Status.FAILED)
        if self.status != Status.BUILDING:
            raise IllegalTransition(self.name, self.status, Status.FAILED)
        _check_failure(code, message)
        _checked(values.check_commit, commit)
        self._build_failed(code=code, message=self._on_node(message, node_index),
                           commit=commit, node_index=node_index, by=by)  # fmt: skip

    def requeue(self, reason: str, by: Actor) -> None:
        self._require(Status.SCHEDULING)
        if self.status != Status.ENQUEUED:
            raise IllegalTransition(self.name, self.status, Status.SCHEDULING)
        _checked(values.check_message, reason, "reason")
        self._requeued(reason=reason, by=by)

    def finish(self, exit_code: int, by: Actor, node_index: int = 0) -> None:
        """One node's entry point exited: a non-zero code fails the job at once; the job
        succeeds once every node exited with 0."""
        _checked(values.check_exit_code, exit_code)
        if exit_code == 0:
            self._require(Status.SUCCEEDED)
            others = [p for i, p in enumerate(self.placements) if i != node_index]
            if all(p["exit_code"] == 0 for p in others):
                self._succeeded(exit_code=0, node_index=node_index, by=by)
            else:
                self._node_exited(node_index=node_index, exit_code=0, by=by)
            return
        self._require(Status.FAILED)
        if self.status != Status.IN_PROGRESS:  # building -> failed is a build failure only
            raise IllegalTransition(self.name, self.status, Status.FAILED)
        message = self._on_node(f"the entry point exited with code {exit_code}", node_index)
        self._failed(code="entry_point_failed", message=message, exit_code=exit_code,
                     node_index=node_index, by=by)  # fmt: skip

    def fail(self, code: str, message: str, by: Actor, node_index: int | None = None) -> None:
        self._require(Status.FAILED)
        if self.status != Status.IN_PROGRESS:
            raise IllegalTransition(self.name, self.status, Status.FAILED)
        _check_failure(code, message)
        if node_index is not None:
            message = self._on_node(message, node_index)
        self._failed(code=code, message=message, exit_code=None, node_index=node_index, by=by)

    def _on_node(self, message: str, node_index: int) -> str:
        """A multi-node job's failure names the node it happened on."""
        if self.nnodes <= 1 or not self.placements:
            return message
        node = self._placement(node_index)["node_name"]
        return f"{message} (node {node}, index {node_index})"

    def _placement(self, node_index: int) -> dict[str, Any]:
        if not 0 <= node_index < len(self.placements):
            raise InvalidJobSpec(
                f"job '{self.name}' has no node index {node_index}", "node_index"
            )
        return self.placements[node_index]

    def _require_on_node(self) -> None:
        if self.deleted:
            raise JobDeleted(self.name)
        if not self.placements:
            raise IllegalTransition(self.name, self.status, Status.IN_PROGRESS)

    def request_stop(self, by: Actor) -> None:
        self._require(Status.STOP_IN_PROGRESS)
        self._stop_requested(stopping_from=str(self.status), by=by)  # a str after a snapshot

    def confirm_stopped(
        self, by: Actor, exit_code: int | None = None, node_index: int | None = None
    ) -> None:
        """A node's processes ended (``exit_code``: how its entry point ended, when it ran, an
        exit 0 that raced the stop included); the job is stopped once every node said so."""
        self._require(Status.STOPPED)
        if exit_code is not None:
            _checked(values.check_exit_code, exit_code)
        pending = [i for i, p in enumerate(self.placements) if not p.get("stopped")]
        if node_index is not None and len(pending) > 1 and node_index in pending:
            self._node_stopped(node_index=node_index, exit_code=exit_code, by=by)
            return
        released = [list(p.get("accelerators") or []) for p in self.placements]
        self._stopped(accelerators_released=list(self.accelerators), exit_code=exit_code,
                      allocations_released=released, by=by)  # fmt: skip

    def fail_stop(self, message: str, by: Actor) -> None:
        self._require(Status.STOP_FAILED)
        _checked(values.check_message, message)
        self._stop_failed(message=message, by=by)

    def note_refused_report(
        self, kind: str, node_index: int, reason: str, facts: dict[str, Any], by: Actor
    ) -> bool:
        """Keep a report the job's status refused, for audit (once per kind and node): a late
        report never changes a status, but the ledger says it came."""
        if self.deleted:
            return False
        key = f"{kind}/{node_index}"
        if key in self.refused:
            return False
        _checked(values.check_message, reason, "reason")
        self._report_refused(report=kind, node_index=node_index, reason=reason,
                             facts=dict(facts), by=by)  # fmt: skip
        return True

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

    # -- debug sessions (`flexai training debug-ssh`): recorded, never a status change ------

    @property
    def open_debug_sessions(self) -> set[str]:
        return set(getattr(self, "debug_sessions", ()))  # jobs folded before they existed

    def open_debug_session(
        self, session_id: str, node_index: int, key_fingerprint: str, by: Actor,
        relay: str | None = None,
    ) -> None:  # fmt: skip
        """A user opens an SSH session into the running job on its node ``node_index``,
        its bytes relayed by the server process whose instance id is ``relay``."""
        if self.deleted:
            raise JobDeleted(self.name)
        if self.status != Status.IN_PROGRESS:
            raise JobNotRunning(self.name, self.status)
        _checked(values.check_pattern, session_id, "session_id", SESSION_ID, SESSION_ID_RULE)
        _checked(values.check_text, key_fingerprint, "key_fingerprint",
                 max_length=values.MAX_LABEL)  # fmt: skip
        _checked(values.check_optional, relay, "relay", values.MAX_LABEL)
        if session_id in self.open_debug_sessions:
            raise DomainError(f"debug session {session_id} of job '{self.name}' is open already")
        node = self._placement(node_index)["node_name"]
        self._debug_session_opened(session_id=session_id, node=node, node_index=node_index,
                                   key_fingerprint=key_fingerprint, by=by,
                                   relay=relay)  # fmt: skip

    def close_debug_session(self, session_id: str, reason: str, seconds: float, by: Actor) -> bool:
        """The session ended (``seconds`` after it opened); False when it is closed already."""
        if session_id not in self.open_debug_sessions:
            return False
        _checked(values.check_message, reason, "reason")
        seconds = round(max(0.0, float(seconds)), 3)
        self._debug_session_closed(session_id=session_id, reason=reason, seconds=seconds, by=by)
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
    def _node_assigned(
        self, node_id: str, node_name: str, by: Actor, nodes: list[dict[str, Any]] | None = None
    ) -> None:
        self.node_id = node_id
        self.node_name = node_name
        placed = nodes or [{"node_id": node_id, "node_name": node_name, "address": None}]
        self.placements = [
            {**node, "built": False, "accelerators": [], "exit_code": None, "stopped": False}
            for node in placed
        ]
        self.status = Status.BUILDING

    @event("Built")
    def _built(self, node_index: int, commit: str | None, master_port: int | None,
               by: Actor) -> None:  # fmt: skip
        self.placements[node_index]["built"] = True
        self.commit = commit or self.commit
        if master_port is not None:
            self.master_port = master_port

    @event("Rejected")
    def _rejected(self, code: str, message: str, by: Actor) -> None:
        self.failure = {"code": code, "message": message}
        self.status = Status.REJECTED

    @event("Enqueued")
    def _enqueued(
        self, commit: str | None, by: Actor, waiting_on: list[str] | None = None
    ) -> None:
        self.commit = commit or self.commit
        self.status = Status.ENQUEUED

    class Started(Aggregate.Event):
        """Every node built and its accelerators allocated: the job runs. Version 2 always
        holds ``allocations`` (each node's indices); version 1, from before multi-node jobs,
        held node 0's ``accelerators`` only, and is upcast when read."""

        class_version = 2
        commit: str | None
        accelerators: list[int]
        allocations: list[list[int]]
        by: Actor

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            if state.get("allocations") is None:
                state["allocations"] = [list(state["accelerators"])]

    @event(Started)
    def _started(
        self, commit: str | None, accelerators: list[int], allocations: list[list[int]],
        by: Actor,
    ) -> None:  # fmt: skip
        self.commit = commit
        self.accelerators = list(accelerators)
        for placement, indices in zip(self.placements, allocations, strict=False):
            placement["accelerators"] = list(indices)
        self.status = Status.IN_PROGRESS

    @event("BuildFailed")
    def _build_failed(
        self, code: str, message: str, commit: str | None, by: Actor, node_index: int = 0
    ) -> None:
        self.commit = commit
        self.failure = {"code": code, "message": message}
        self.status = Status.FAILED

    @event("Requeued")
    def _requeued(self, reason: str, by: Actor) -> None:
        self.node_id = None
        self.node_name = None
        self.placements = []
        self.master_port = None
        self.status = Status.SCHEDULING

    @event("NodeExited")
    def _node_exited(self, node_index: int, exit_code: int, by: Actor) -> None:
        self.placements[node_index]["exit_code"] = exit_code

    @event("Succeeded")
    def _succeeded(self, exit_code: int, by: Actor, node_index: int = 0) -> None:
        if self.placements:
            self.placements[node_index]["exit_code"] = exit_code
        self.status = Status.SUCCEEDED

    @event("Failed")
    def _failed(
        self, code: str, message: str, exit_code: int | None, by: Actor,
        node_index: int | None = None,
    ) -> None:  # fmt: skip
        self.failure = {"code": code, "message": message}
        if exit_code is not None and node_index is not None and self.placements:
            self.placements[node_index]["exit_code"] = exit_code
        self.status = Status.FAILED

    @event("StopRequested")
    def _stop_requested(self, stopping_from: str, by: Actor) -> None:
        self.status = Status.STOP_IN_PROGRESS

    @event("NodeStopped")
    def _node_stopped(self, node_index: int, exit_code: int | None, by: Actor) -> None:
        self.placements[node_index]["stopped"] = True

    @event("Stopped")
    def _stopped(
        self, accelerators_released: list[int], by: Actor, exit_code: int | None = None,
        allocations_released: list[list[int]] | None = None,
    ) -> None:  # fmt: skip
        self.accelerators = []
        for placement in self.placements:
            placement["stopped"] = True
        self.status = Status.STOPPED

    @event("ReportRefused")
    def _report_refused(self, report: str, node_index: int, reason: str,
                        facts: dict[str, Any], by: Actor) -> None:  # fmt: skip
        self.refused.add(f"{report}/{node_index}")

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

    # ``relay``: the events stored before it existed have none, and load with None.
    @event("DebugSessionOpened")
    def _debug_session_opened(self, session_id: str, node: str, node_index: int,
                              key_fingerprint: str, by: Actor,
                              relay: str | None = None) -> None:  # fmt: skip
        self.debug_sessions = {*getattr(self, "debug_sessions", ()), session_id}

    @event("DebugSessionClosed")
    def _debug_session_closed(self, session_id: str, reason: str, seconds: float,
                              by: Actor) -> None:  # fmt: skip
        self.debug_sessions = set(getattr(self, "debug_sessions", ())) - {session_id}

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
    """A host that runs jobs, registered by its agent; it holds the ledger of its accelerator
    indices, so that two jobs never share one: each index is allocated to one job at a time,
    and jobs waiting for this node's accelerators line up first come, first served."""

    @staticmethod
    def create_id(name: str) -> UUID:
        return uuid5(NAMESPACE, f"node\x00{name}")

    @classmethod
    def register(
        cls, name: str, accels: int, accel_type: str, by: Actor, address: str | None = None,
        gpus: list[dict[str, Any]] | None = None,
    ) -> Node:  # fmt: skip
        _checked(values.check_node_name, name)
        _check_capacity(accels, accel_type, address)
        return cls(name=name, accels=accels, accel_type=accel_type, address=address,
                   gpus=list(gpus or []), by=by)  # fmt: skip

    @event("Registered")
    def __init__(
        self, name: str, accels: int, accel_type: str, by: Actor, address: str | None = None,
        gpus: list[dict[str, Any]] | None = None,
    ) -> None:  # fmt: skip
        self.name = name
        self.accels = accels
        self.accel_type = accel_type
        self.address = address
        self.gpus = list(gpus or [])
        self.allocations: dict[str, list[int]] = {}
        """job id -> the indices it holds."""
        self.queue: dict[str, str] = {}
        """job id -> its place key (its submission time): who waits for this node's
        accelerators, oldest first."""

    def update(
        self, accels: int, accel_type: str, by: Actor, address: str | None = None,
        gpus: list[dict[str, Any]] | None = None,
    ) -> None:  # fmt: skip
        _check_capacity(accels, accel_type, address)
        gpus = list(gpus or [])
        if (accels, accel_type, address, gpus) != (
            self.accels, self.accel_type, self.address, getattr(self, "gpus", [])
        ):  # fmt: skip
            self._updated(accels=accels, accel_type=accel_type, address=address, gpus=gpus,
                          by=by)  # fmt: skip

    @event("Updated")
    def _updated(
        self, accels: int, accel_type: str, by: Actor, address: str | None = None,
        gpus: list[dict[str, Any]] | None = None,
    ) -> None:  # fmt: skip
        self.accels = accels
        self.accel_type = accel_type
        self.address = address
        self.gpus = list(gpus or [])

    # -- accelerators ----------------------------------------------------------------------

    def free_indices(self) -> list[int]:
        held = {index for indices in self.allocations.values() for index in indices}
        return [index for index in range(self.accels) if index not in held]

    def ahead_of(self, job_id: str, place: str) -> list[str]:
        """The jobs waiting for this node that came before ``job_id``."""
        earlier = sorted((key, other) for other, key in self.queue.items()
                         if other != job_id and key < place)  # fmt: skip
        return [other for _, other in earlier]

    def can_allocate(self, job_id: str, count: int, place: str) -> bool:
        """Whether ``count`` indices are free and no earlier job waits for them."""
        if job_id in self.allocations:
            return True
        return len(self.free_indices()) >= count and not self.ahead_of(job_id, place)

    def allocate(self, job_id: str, count: int, place: str, by: Actor) -> list[int]:
        """The lowest free indices for ``job_id`` (its own, if it holds some already)."""
        if job_id in self.allocations:
            return list(self.allocations[job_id])
        if not self.can_allocate(job_id, count, place):
            raise DomainError(
                f"node '{self.name}' cannot give {count} accelerator(s) to job {job_id} now"
            )
        indices = self.free_indices()[:count]
        self._allocated(job_id=job_id, indices=indices, by=by)
        return indices

    def release(self, job_id: str, by: Actor) -> bool:
        if job_id not in self.allocations:
            return False
        self._released(job_id=job_id, by=by)
        return True

    def enqueue(self, job_id: str, place: str, by: Actor) -> None:
        if job_id not in self.queue:
            self._queued(job_id=job_id, place=place, by=by)

    def dequeue(self, job_id: str, by: Actor) -> None:
        if job_id in self.queue:
            self._dequeued(job_id=job_id, by=by)

    @event("Allocated")
    def _allocated(self, job_id: str, indices: list[int], by: Actor) -> None:
        self.allocations[job_id] = list(indices)
        self.queue.pop(job_id, None)

    @event("Released")
    def _released(self, job_id: str, by: Actor) -> None:
        self.allocations.pop(job_id, None)

    @event("Queued")
    def _queued(self, job_id: str, place: str, by: Actor) -> None:
        self.queue[job_id] = place

    @event("Dequeued")
    def _dequeued(self, job_id: str, by: Actor) -> None:
        self.queue.pop(job_id, None)


def _check_capacity(accels: int, accel_type: str, address: str | None = None) -> None:
    _checked(values.check_int, accels, "accels", 0, values.MAX_ACCELS)
    _checked(values.check_text, accel_type, "accel_type", max_length=values.MAX_ACCEL_TYPE)
    if address is not None:
        _checked(values.check_address, address)


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
