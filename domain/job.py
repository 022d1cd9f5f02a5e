"""The TrainingJob aggregate: one job's whole history, from its submission to its end.

Every public command method guards (its event's row of :mod:`domain.lifecycle`, then the facts'
bounds), then triggers a private ``@event`` method whose body only mutates: bodies re-run on
every replay.
"""

from __future__ import annotations

from typing import Any

from eventsourcing.domain import Aggregate, event

import domain.values as values
from domain.actors import Actor
from domain.errors import checked
from domain.ids import time_ordered_id
from domain.job_attempts import JobAttempts
from domain.job_facts import (
    GivenSpec,
    check_allocations,
    check_failure,
    check_spec,
    placed_nodes,
    stored_spec,
)
from domain.job_name import check_name
from domain.job_records import JobRecords
from domain.lifecycle import require
from domain.sharing import EXITED
from domain.statuses import Status

TOPIC = "domain.job:TrainingJob"
"""The job's topic in the ledger; each of its events' is ``TOPIC.<event>``. Spelled out, so
that moving a method between classes or modules renames nothing stored."""


def job_event(name: str) -> Any:
    """``@event(name)`` under the job's explicit topic for it."""
    return event(name, topic=f"{TOPIC}.{name}")


class TrainingJob(JobAttempts, JobRecords, Aggregate):
    """One training job; its events are the job's whole history. Its id is ordered by time."""
    TOPIC = TOPIC
    create_id = staticmethod(time_ordered_id)

    class Created(Aggregate.Created):  # eventsourcing's base; a job's first event: Submitted
        TOPIC = f"{TOPIC}.Created"

    _preemption_requested = job_event("PreemptionRequested")(JobAttempts._preemption_requested)
    _node_yielded = job_event("NodeYielded")(JobAttempts._node_yielded)
    _preempted = job_event("Preempted")(JobAttempts._preempted)
    _retried = job_event("Retried")(JobAttempts._retried)
    _logs_unavailable = job_event("LogsUnavailable")(JobRecords._logs_unavailable)
    _checkpoint_recorded = job_event("CheckpointRecorded")(JobRecords._checkpoint_recorded)
    _outputs_recorded = job_event("OutputsRecorded")(JobRecords._outputs_recorded)
    _debug_session_opened = job_event("DebugSessionOpened")(JobRecords._debug_session_opened)
    _debug_session_closed = job_event("DebugSessionClosed")(JobRecords._debug_session_closed)
    _artifacts_purged = job_event("ArtifactsPurged")(JobRecords._artifacts_purged)

    @classmethod
    def submit(cls, owner: str, name: str, spec: GivenSpec, by: Actor) -> TrainingJob:
        check_name(name)
        stored = stored_spec(spec)
        check_spec(stored)
        return cls(owner=owner, name=name, spec=stored, by=by)

    @job_event("Submitted")
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
        self.output_hashes: dict[str, str] = {}
        self.logs_unavailable_at: set[int] = set()
        self.placements: list[dict[str, Any]] = []
        self.master_port: int | None = None
        self.refused: set[str] = set()
        self.debug_sessions: set[str] = set()
        self.deleted = False

    # -- commands -------------------------------------------------------------------------

    def begin_scheduling(self, by: Actor) -> None:
        require(self, "SchedulingStarted")
        self._scheduling_started(by=by)

    def assign(
        self, node_id: str, node_name: str, by: Actor, nodes: list[dict[str, Any]] | None = None
    ) -> None:
        """Place the job on its nodes (``nodes``: one ``{node_id, node_name, address}`` per
        node index; by default the one node given)."""
        require(self, "NodeAssigned")
        nodes = nodes or [{"node_id": node_id, "node_name": node_name, "address": None}]
        placed = placed_nodes(self.name, self.nnodes, nodes)
        self._node_assigned(node_id=str(placed[0]["node_id"]),
                            node_name=str(placed[0]["node_name"]), nodes=placed, by=by)  # fmt: skip

    def reject(self, code: str, message: str, by: Actor) -> None:
        require(self, "Rejected")
        check_failure(code, message)
        self._rejected(code=code, message=message, by=by)

    def record_built(
        self, node_index: int, commit: str | None, master_port: int | None, by: Actor,
        image_digest: str | None = None,
    ) -> bool:
        """One node's build succeeded (in its runtime's image of ``image_digest``, where it
        ran in one); False when that node's build is already recorded (a resend, whatever the
        status since)."""
        if self.deleted or not self.placements:  # no node, nothing built: refused at once
            require(self, "Built")
        checked(values.check_commit, commit)
        if master_port is not None:
            checked(values.check_port, master_port)
        checked(values.check_image_digest, image_digest)
        if self._placement(node_index)["built"]:
            return False
        require(self, "Built")
        self._built(node_index=node_index, commit=commit, master_port=master_port, by=by,
                    image_digest=image_digest)  # fmt: skip
        return True

    def enqueue(self, commit: str | None, by: Actor, waiting_on: list[str] | None = None) -> None:
        """Built, but the accelerators are busy (``waiting_on``: the nodes that are busy)."""
        require(self, "Enqueued")
        checked(values.check_commit, commit)
        self._enqueued(commit=commit, waiting_on=list(waiting_on or []), by=by)

    def start(
        self, commit: str | None, accelerators: list[int], by: Actor,
        allocations: list[list[int]] | None = None,
    ) -> None:  # fmt: skip
        """Every node is built and its accelerators allocated (``allocations``: the indices
        per node index; by default ``accelerators`` on the one node)."""
        checked(values.check_commit, commit)
        allocations = allocations if allocations is not None else [list(accelerators)]
        check_allocations(allocations, self.placements)
        require(self, "Started")  # after the facts: what is wrong with them is said first
        self._started(commit=commit or self.commit, accelerators=list(allocations[0]),
                      allocations=[list(a) for a in allocations], by=by)  # fmt: skip

    def fail_build(
        self, code: str, message: str, commit: str | None, by: Actor, node_index: int = 0
    ) -> None:
        require(self, "BuildFailed")
        check_failure(code, message)
        checked(values.check_commit, commit)
        self.refuse_failing_what_is_retried(code)
        self._build_failed(code=code, message=self._on_node(message, node_index),
                           commit=commit, node_index=node_index, by=by)  # fmt: skip

    def requeue(self, reason: str, by: Actor) -> None:
        require(self, "Requeued")
        checked(values.check_message, reason, "reason")
        self._requeued(reason=reason, by=by)

    def finish(self, exit_code: int, by: Actor, node_index: int = 0, ended_at: str | None = None
               ) -> None:  # fmt: skip
        """One node's entry point exited (at ``ended_at``, :func:`domain.job_facts.end_moment`;
        None: now): a non-zero code fails the job at once; it succeeds once every node exited 0."""
        checked(values.check_exit_code, exit_code)
        if exit_code == 0:
            others = [p for i, p in enumerate(self.placements) if i != node_index]
            if all(p["exit_code"] == 0 for p in others):
                require(self, "Succeeded")
                self._succeeded(exit_code=0, node_index=node_index, by=by, ended_at=ended_at)
            else:
                require(self, "NodeExited")
                self._node_exited(node_index=node_index, exit_code=0, by=by)
            return
        self.fail(EXITED, f"the entry point exited with code {exit_code}", by, node_index,
                  ended_at, exit_code)  # fmt: skip

    def fail(self, code: str, message: str, by: Actor, node_index: int | None = None,
             ended_at: str | None = None, exit_code: int | None = None) -> None:  # fmt: skip
        require(self, "Failed")
        check_failure(code, message, exit_code)
        self.refuse_failing_what_is_retried(code, exit_code)
        if node_index is not None:
            message = self._on_node(message, node_index)
        self._failed(code=code, message=message, exit_code=exit_code, node_index=node_index,
                     by=by, ended_at=ended_at)  # fmt: skip

    def request_stop(self, by: Actor) -> None:
        require(self, "StopRequested")
        self._stop_requested(stopping_from=str(self.status), by=by)  # a str after a snapshot

    def confirm_stopped(self, by: Actor, exit_code: int | None = None,
                        node_index: int | None = None, ended_at: str | None = None) -> None:
        """A node's processes ended (``exit_code``: how its entry point ended, when it ran, an
        exit 0 that raced the stop included); the job is stopped once every node said so."""
        pending = [i for i, p in enumerate(self.placements) if not p.get("stopped")]
        before_others = node_index if len(pending) > 1 and node_index in pending else None
        require(self, "Stopped" if before_others is None else "NodeStopped")
        if exit_code is not None:
            checked(values.check_exit_code, exit_code)
        if before_others is not None:
            self._node_stopped(node_index=before_others, exit_code=exit_code, by=by)
            return
        released = [list(p.get("accelerators") or []) for p in self.placements]
        self._stopped(accelerators_released=list(self.accelerators), exit_code=exit_code,
                      allocations_released=released, by=by, ended_at=ended_at)

    def fail_stop(self, message: str, by: Actor) -> None:
        require(self, "StopFailed")
        checked(values.check_message, message)
        self._stop_failed(message=message, by=by)

    def note_refused_report(self, kind: str, node_index: int, reason: str, facts: dict[str, Any],
                            by: Actor) -> bool:  # fmt: skip
        """Keep a report the job's status refused, for audit (once per kind and node): a late
        report never changes a status, but the ledger says it came."""
        key = f"{kind}/{node_index}"
        if self.deleted or key in self.refused:
            return False
        checked(values.check_message, reason, "reason")
        self._report_refused(report=kind, node_index=node_index, reason=reason,
                             facts=dict(facts), by=by)  # fmt: skip
        return True

    def delete(self, by: Actor) -> None:
        require(self, "Deleted")
        self._deleted(by=by)

    # -- events: bodies only mutate -------------------------------------------------------

    @job_event("SchedulingStarted")
    def _scheduling_started(self, by: Actor) -> None:
        self.status = Status.SCHEDULING

    @job_event("NodeAssigned")
    def _node_assigned(self, node_id: str, node_name: str, by: Actor,
                       nodes: list[dict[str, Any]] | None = None) -> None:  # fmt: skip
        self.node_id, self.node_name = node_id, node_name
        placed = nodes or [{"node_id": node_id, "node_name": node_name, "address": None}]
        self.placements = [
            {**node, "built": False, "accelerators": [], "exit_code": None, "stopped": False}
            for node in placed
        ]
        self.status = Status.BUILDING

    @job_event("Built")
    def _built(self, node_index: int, commit: str | None, master_port: int | None,
               by: Actor, image_digest: str | None = None) -> None:  # fmt: skip
        self.placements[node_index]["built"] = True
        self.commit = commit or self.commit
        if master_port is not None:
            self.master_port = master_port

    @job_event("Rejected")
    def _rejected(self, code: str, message: str, by: Actor) -> None:
        self.failure = {"code": code, "message": message}
        self.status = Status.REJECTED

    @job_event("Enqueued")
    def _enqueued(self, commit: str | None, by: Actor, waiting_on: list[str] | None = None) -> None:
        self.commit = commit or self.commit
        self.status = Status.ENQUEUED

    class Started(Aggregate.Event):
        """Every node built and its accelerators allocated: the job runs. Version 2 holds each
        node's ``allocations``; version 1 (before multi-node jobs) node 0's, upcast when read."""

        TOPIC = f"{TOPIC}.Started"
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
        self.commit, self.accelerators = commit, list(accelerators)
        for placement, indices in zip(self.placements, allocations, strict=False):
            placement["accelerators"] = list(indices)
        self.status, self.yielded = Status.IN_PROGRESS, False

    @job_event("BuildFailed")
    def _build_failed(self, code: str, message: str, commit: str | None, by: Actor,
                      node_index: int = 0) -> None:  # fmt: skip
        self.commit = commit
        self.failure = {"code": code, "message": message}
        self.status = Status.FAILED

    @job_event("Requeued")
    def _requeued(self, reason: str, by: Actor) -> None:
        self.node_id = self.node_name = self.master_port = None
        self.placements = []
        self.status = Status.SCHEDULING

    @job_event("NodeExited")
    def _node_exited(self, node_index: int, exit_code: int, by: Actor) -> None:
        self.placements[node_index]["exit_code"] = exit_code

    @job_event("Succeeded")  # ended_at: when the entry point ended (None: the event's time)
    def _succeeded(self, exit_code: int, by: Actor, node_index: int = 0,
                   ended_at: str | None = None) -> None:  # fmt: skip
        if self.placements:
            self.placements[node_index]["exit_code"] = exit_code
        self.status = Status.SUCCEEDED

    @job_event("Failed")
    def _failed(
        self, code: str, message: str, exit_code: int | None, by: Actor,
        node_index: int | None = None, ended_at: str | None = None,
    ) -> None:  # fmt: skip
        self.failure = {"code": code, "message": message}
        if exit_code is not None and node_index is not None and self.placements:
            self.placements[node_index]["exit_code"] = exit_code
        self.status = Status.FAILED

    @job_event("StopRequested")
    def _stop_requested(self, stopping_from: str, by: Actor) -> None:
        self.status = Status.STOP_IN_PROGRESS

    @job_event("NodeStopped")
    def _node_stopped(self, node_index: int, exit_code: int | None, by: Actor) -> None:
        self.placements[node_index]["stopped"] = True

    @job_event("Stopped")
    def _stopped(
        self, accelerators_released: list[int], by: Actor, exit_code: int | None = None,
        allocations_released: list[list[int]] | None = None, ended_at: str | None = None,
    ) -> None:  # fmt: skip
        self.accelerators = []
        for placement in self.placements:
            placement["stopped"] = True
        self.status = Status.STOPPED

    @job_event("ReportRefused")
    def _report_refused(self, report: str, node_index: int, reason: str,
                        facts: dict[str, Any], by: Actor) -> None:  # fmt: skip
        self.refused.add(f"{report}/{node_index}")

    @job_event("StopFailed")
    def _stop_failed(self, message: str, by: Actor) -> None:
        self.failure = {"code": "stop_failed", "message": message}
        self.status = Status.STOP_FAILED

    @job_event("Deleted")
    def _deleted(self, by: Actor) -> None:
        self.deleted = True
