"""A training job's lifecycle as one table, keyed by event: the statuses each event may be
recorded in, the status it leaves the job in, and the guard that must hold besides.

Every command of :class:`~domain.job.TrainingJob` looks up the row of the event it is about to
record (:func:`require`) and records it only if the row allows it; no command checks a status
of its own. The views read the status each event leads to (:data:`EVENT_STATUS`) from here too,
and docs/design.md shows the table as :func:`markdown_table` prints it (a test compares them,
and the transitions with SPEC.md's).

A deleted job records one event more, ``ArtifactsPurged``, and no other.

An event that records one node's part of a transition (``Built``, ``NodeExited``,
``NodeStopped``, ``NodeYielded``) moves no status: a refusal names the status it leads toward.
An event that records a fact (a checkpoint, a debug session, ...) moves none either, and a
refusal says when the fact can be recorded. ``ReportRefused`` and ``DebugSessionClosed`` are
recorded whatever the status (the second even once the job is deleted): their commands never
consult the table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from domain.errors import (
    DomainError,
    IllegalTransition,
    JobDeleted,
    JobNotRunning,
    JobNotStoppable,
    JobNotTerminal,
)
from domain.job_state import JobState
from domain.statuses import ON_A_NODE, TERMINAL, Status

Refusal = Callable[[str, Status], DomainError]
"""The error refusing an event to job ``name`` in ``status``."""


@dataclass(frozen=True)
class Guard:
    """A named predicate on the job that must hold besides its status."""

    name: str
    holds: Callable[[JobState], bool]
    refusal: str
    """What the job cannot do while the guard does not hold, after ``job '<name>'``."""


def _every_node_built(job: JobState) -> bool:
    """Every node the job is placed on has built it (a job placed on none waits for none)."""
    return all(placement["built"] for placement in job.placements)


EVERY_NODE_BUILT = Guard("every node built", _every_node_built,
                         "cannot start before every node is built")  # fmt: skip
DELETED = Guard("the job deleted", lambda job: job.deleted,
                "keeps its artifacts until it is deleted")  # fmt: skip
"""The one guard a deleted job can meet: every other event is refused once it is deleted."""
PREEMPTING = Guard("a preemption asked", lambda job: job.preemption is not None,
                   "was not asked to make way for another job")  # fmt: skip
RETRIES_LEFT = Guard("retries left", lambda job: job.retries_left > 0,
                     "has no retries left (run --max-retries)")  # fmt: skip


def _fact_recorded_only(when: str) -> Refusal:
    def refusal(name: str, status: Status) -> DomainError:
        return DomainError(f"job '{name}' is '{status}'; {when}")

    return refusal


@dataclass(frozen=True)
class Row:
    event: str
    sources: frozenset[Status]
    """The statuses the event may be recorded in."""
    target: Status | None = None
    """The status it leaves the job in; None: the job stays where it is."""
    toward: Status | None = None
    """For one node's part of a transition: the status it leads toward."""
    guard: Guard | None = None
    refusal: Refusal | None = None
    """How a job in another status is refused; by default an IllegalTransition."""

    def refuse(self, name: str, status: Status) -> DomainError:
        if self.refusal is not None:
            return self.refusal(name, status)
        attempted = self.target or self.toward
        if attempted is None:
            raise ValueError(f"the row of {self.event} says neither where it leads nor how "
                             "it is refused")  # fmt: skip
        return IllegalTransition(name, status, attempted)


def _from(*statuses: Status) -> frozenset[Status]:
    return frozenset(statuses)


STOPPABLE = _from(Status.PENDING, Status.SCHEDULING, Status.BUILDING, Status.ENQUEUED,
                  Status.IN_PROGRESS)  # fmt: skip
ANY = frozenset(Status)
TERMINAL_RAN = (Status.SUCCEEDED, Status.FAILED, Status.STOPPED, Status.STOP_FAILED)
"""The ends a job may reach after it ran: its nodes' outputs may still come."""

LIFECYCLE: tuple[Row, ...] = (
    Row("Submitted", _from(), Status.PENDING),
    Row("SchedulingStarted", _from(Status.PENDING), Status.SCHEDULING),
    Row("NodeAssigned", _from(Status.SCHEDULING), Status.BUILDING),
    Row("Rejected", _from(Status.SCHEDULING), Status.REJECTED),
    Row("Built", _from(Status.BUILDING), toward=Status.IN_PROGRESS),
    Row("Enqueued", _from(Status.BUILDING), Status.ENQUEUED),
    Row("Started", _from(Status.BUILDING, Status.ENQUEUED), Status.IN_PROGRESS,
        guard=EVERY_NODE_BUILT),
    Row("BuildFailed", _from(Status.BUILDING), Status.FAILED),
    Row("Requeued", _from(Status.BUILDING, Status.ENQUEUED), Status.SCHEDULING),
    Row("NodeExited", _from(Status.IN_PROGRESS), toward=Status.SUCCEEDED),
    Row("Succeeded", _from(Status.IN_PROGRESS), Status.SUCCEEDED),
    Row("Failed", _from(Status.IN_PROGRESS), Status.FAILED),
    Row("PreemptionRequested", _from(Status.IN_PROGRESS),
        refusal=_fact_recorded_only("only a running job is preempted")),
    Row("NodeYielded", _from(Status.IN_PROGRESS), toward=Status.ENQUEUED, guard=PREEMPTING),
    Row("Preempted", _from(Status.IN_PROGRESS), Status.ENQUEUED, guard=PREEMPTING),
    Row("Retried", _from(Status.BUILDING, Status.ENQUEUED, Status.IN_PROGRESS), Status.SCHEDULING,
        guard=RETRIES_LEFT),
    Row("StopRequested", STOPPABLE, Status.STOP_IN_PROGRESS, refusal=JobNotStoppable),
    Row("NodeStopped", _from(Status.STOP_IN_PROGRESS), toward=Status.STOPPED),
    Row("Stopped", _from(Status.STOP_IN_PROGRESS), Status.STOPPED),
    Row("StopFailed", _from(Status.STOP_IN_PROGRESS), Status.STOP_FAILED),
    Row("CheckpointRecorded", _from(Status.IN_PROGRESS, Status.STOP_IN_PROGRESS),
        refusal=_fact_recorded_only("checkpoints are taken only while it runs")),
    Row("OutputsRecorded", _from(Status.IN_PROGRESS, Status.STOP_IN_PROGRESS, *TERMINAL_RAN),
        refusal=_fact_recorded_only("outputs are recorded only once it ran")),
    Row("LogsUnavailable", ON_A_NODE,
        refusal=_fact_recorded_only("log problems are reported only while it is on a node")),
    Row("DebugSessionOpened", _from(Status.IN_PROGRESS), refusal=JobNotRunning),
    Row("DebugSessionClosed", ANY),
    Row("ReportRefused", ANY),
    Row("Deleted", TERMINAL, refusal=JobNotTerminal),
    Row("ArtifactsPurged", TERMINAL, guard=DELETED,
        refusal=_fact_recorded_only("its artifacts are purged only once it ended")),
)  # fmt: skip
ROWS = {row.event: row for row in LIFECYCLE}

EVENT_STATUS: dict[str, Status] = {
    row.event: row.target for row in LIFECYCLE if row.target is not None
}
"""The status each event leaves the job in; events absent here leave it unchanged."""

TRANSITIONS: dict[Status, frozenset[Status]] = {
    source: frozenset(row.target for row in LIFECYCLE
                      if row.target is not None and source in row.sources)
    for source in Status
    if any(row.target is not None and source in row.sources for row in LIFECYCLE)
}  # fmt: skip
"""Which statuses each status may become."""


def require(job: JobState, event: str) -> Row:
    """Refuse ``event`` unless its row allows it for ``job`` now."""
    row = ROWS[event]
    if job.deleted and row.guard is not DELETED:
        raise JobDeleted(job.name)
    if job.status not in row.sources:
        raise row.refuse(job.name, job.status)
    if row.guard is not None and not row.guard.holds(job):
        raise DomainError(f"job '{job.name}' {row.guard.refusal}")
    return row


# -- the table as docs/design.md shows it ---------------------------------------------------


def _statuses(statuses: Iterable[Status]) -> str:
    chosen = set(statuses)
    if not chosen:
        return "(a new job)"
    if chosen == ANY:
        return "any"
    return ", ".join(str(status) for status in Status if status in chosen)


def _leads_to(row: Row) -> str:
    if row.target is not None:
        return str(row.target)
    if row.toward is not None:
        return f"unchanged (one node's part, toward {row.toward})"
    return "unchanged"


def markdown_table() -> str:
    """The table, one line per event."""
    rows = [(row.event, _statuses(row.sources), _leads_to(row),
             row.guard.name if row.guard else "") for row in LIFECYCLE]  # fmt: skip
    lines = [("event", "from", "to", "guard"), ("---",) * 4, *rows]
    return "".join("|" + "|".join(f" {cell} " if cell else " " for cell in line) + "|\n"
                   for line in lines)  # fmt: skip
