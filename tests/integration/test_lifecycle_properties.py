"""Random command sequences against the real application and store keep the ledger lawful.

The expected transitions are copied from the lifecycle table of SPEC.md, not from the code, so
a wrong table in ``domain/lifecycle.py`` fails here. Most steps send a job a command that
SPEC.md allows from its status, so jobs get far into their lifecycle; the first time a job is
in a status, it is sent every other command too, so refusals get tried from each status.

The machine also keeps its own account of the two nodes' accelerators (node-a has 2, node-b
1): a built job starts on the lowest free index unless an earlier job waits in that node's
line (then it is enqueued), and a job that lets go of an index starts the next one in line,
in the same transaction. Every ledger event a command records is counted.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from api.settings import Settings
from domain.actors import user
from domain.application import Outcome, TrainingJobs
from domain.errors import DomainError, IllegalTransition, JobDeleted, JobNotTerminal, NameTaken
from domain.failures import is_infrastructure
from domain.ids import checkpoint_id
from domain.job import TrainingJob
from domain.lifecycle import EVENT_STATUS
from domain.reports import WrongNode
from node_agent.shipping import LOST_WHILE_AWAY, NEVER_LAUNCHED
from tests.support import SPEC_TERMINAL as TERMINAL
from tests.support import SPEC_TRANSITIONS

STOPPABLE = {"pending", "scheduling", "building", "enqueued", "in progress"}
ON_NO_NODE = {"pending", "scheduling"}
RUNNING = {"in progress", "stop in progress"}
RAN = RUNNING | {"succeeded", "failed", "stopped", "stop failed"}
"""Where a node's outputs may be recorded (the issue's contract: once the job ran)."""

# The commands that move a job on from each status, and how often to pick each (an agent's
# unasked "stopped" is tried too, and must be refused). Only to aim the random choice, so
# that jobs get deep into their lifecycle within a few steps; every other command is tried.
AIMED: dict[str, dict[str, int]] = {
    "pending": {"begin_scheduling": 4, "request_stop": 1},
    "scheduling": {"assign": 6, "reject": 1, "request_stop": 1},
    "building": {"report_built": 5, "report_build_failed": 1, "request_stop": 1,
                 "report_stopped": 1, "lose_node": 1, "report_agent_failed_building": 1},
    "enqueued": {"report_exited_elsewhere": 3, "lose_node": 2, "request_stop": 1,
                 "report_stopped": 1, "report_agent_failed_building": 1},
    "in progress": {"report_exited": 2, "record_checkpoint": 2, "record_outputs": 1,
                    "report_failed": 1, "request_stop": 2, "report_stopped": 1, "lose_node": 1,
                    "preempt": 2, "report_agent_restarted": 1},
    "stop in progress": {"report_stopped": 2, "report_stop_failed": 1, "record_checkpoint": 1,
                         "record_outputs": 1, "lose_node": 1},
    **{status: {"delete": 1, "record_outputs": 1} for status in TERMINAL - {"rejected"}},
    "rejected": {"delete": 1},
}  # fmt: skip
COMMANDS = sorted({command for commands in AIMED.values() for command in commands})

NODES = {"node-a": 2, "node-b": 1}
job_names = st.sampled_from(["resnet", "bert-base", "llama_7b"]) | st.from_regex(
    r"\A[A-Za-z0-9][A-Za-z0-9_-]{1,10}[A-Za-z0-9]\Z"
)
commits = st.sampled_from(["a1b2c3d", "0badc0de", "feedface"])


@dataclass
class Expected:
    """What the machine believes one job is, from SPEC.md alone."""

    name: str
    status: str = "pending"
    node_id: str | None = None
    commit: str | None = None
    accelerators: list[int] = field(default_factory=list)
    failure_code: str | None = None
    failure_says: str | None = None
    deleted: bool = False
    checkpoints: set[str] = field(default_factory=set)
    output: str | None = None
    """The SHA-256 of node 0's output archive, once recorded."""
    events: int = 1
    place: int = 0
    """Its place among the example's submissions: the order of every node's line."""
    built: bool = False
    index: int | None = None
    """The accelerator index it holds, while it holds one."""
    refused: set[str] = field(default_factory=set)
    """The report kinds refused once already (each is kept once, for audit)."""
    retries_left: int = 0
    """``--max-retries`` less the retries spent (a lost node, an exit code of 137)."""
    yielded: bool = False
    """Preempted, and waiting in line since: its node's "stopped" is recorded already."""


@dataclass
class Refused:
    """The error a command must raise; for IllegalTransition, the statuses it names; and how
    many events its refusal records (an agent's refused report is kept once, for audit)."""

    error: type[DomainError]
    current: str = ""
    attempted: str = ""
    records: int = 0


Expectation = Refused | int | None
"""A refusal, the number of ledger events a command records, or None for a resend."""


class Ledger(RuleBasedStateMachine):
    """One example: a fresh store (SQLite) or a fresh owner on the shared database (PostgreSQL)."""

    jobs = Bundle("jobs")

    @staticmethod
    def new_store_env() -> dict[str, str]:
        raise NotImplementedError("ledger_on() names the store")

    def __init__(self) -> None:
        super().__init__()
        self.store_env = self.new_store_env()
        self.app = TrainingJobs(env=self.store_env)
        self.owner = f"owner-{uuid.uuid4().hex[:8]}"
        self.expected: dict[UUID, Expected] = {}
        self.live_names: dict[str, UUID] = {}
        self.node_ids: dict[str, str] = {}
        self.probed: set[str] = set()
        self.submitted = itertools.count()
        self.histories: dict[UUID, list[Any]] = {}
        self.histories_at = -1
        """Each job's history as read at ledger position ``histories_at`` (the invariants
        read each once per step: a history changes only as the ledger grows)."""

    @initialize()
    def register_nodes(self) -> None:
        suffix = uuid.uuid4().hex[:8]  # its own nodes: the PostgreSQL run shares a database
        for name, accels in NODES.items():
            self.node_ids[name], _ = self.app.register_node(f"{name}-{suffix}", accels, "H100")

    # -- running a command and checking what it did -----------------------------------------

    def _ledger_end(self) -> int:
        return int(self.app.recorder.max_notification_id() or 0)

    def _run(self, command: Callable[[], Outcome], expected: Expectation) -> Outcome | None:
        before = self._ledger_end()
        if isinstance(expected, Refused):
            try:
                command()
            except expected.error as error:
                if isinstance(error, IllegalTransition):
                    statuses = (error.current, error.attempted)
                    assert statuses == (expected.current, expected.attempted)
                    assert f"'{expected.current}'" in str(error)
                    assert f"'{expected.attempted}'" in str(error)
            else:
                raise AssertionError(f"accepted; SPEC.md says {expected}")
            assert self._ledger_end() == before + expected.records, "refused, yet recorded"
            return None
        outcome = command()
        if expected is None:
            assert outcome.position is None
            assert self._ledger_end() == before, "a resend recorded events"
        else:
            assert outcome.position == self._ledger_end() == before + expected
        return outcome

    def _refusal(self, job: Expected, attempted: str, allowed: bool) -> Refused | None:
        """What SPEC.md says a user or scheduler command meets, if it is refused."""
        if job.deleted:
            return Refused(JobDeleted)
        if not allowed:
            return Refused(IllegalTransition, job.status, attempted)
        return None

    def _moved(self, job: Expected, status: str, events: int = 1) -> None:
        job.status, job.events = status, job.events + events
        job.yielded = status == "enqueued" and job.yielded

    # -- rules -------------------------------------------------------------------------------

    @precondition(lambda self: len(self.live_names) < 3)
    @rule(target=jobs, name=job_names, data=st.data())
    def submit(self, name: str, data: st.DataObject) -> Any:
        retries = data.draw(st.sampled_from([0, 1]))
        spec = {"repository_url": "https://example.com/r.git", "entry_point": ["train.py"],
                "accels": 1, "nodes": 1, "priority": "low"}  # fmt: skip
        if retries:
            spec |= {"max_retries": retries, "retry_on_exit_codes": [137]}

        def command() -> Outcome:
            return self.app.submit(self.owner, name, spec, user(self.owner))

        if name in self.live_names:
            self._run(command, Refused(NameTaken))
            return multiple()
        outcome = self._run(command, 2)  # the job's Submitted, and the name's claim
        assert outcome is not None
        self.expected[outcome.job_id] = Expected(name=name, place=next(self.submitted),
                                                 retries_left=retries)  # fmt: skip
        self.live_names[name] = outcome.job_id
        self._probe_the_first_time(outcome.job_id, data)
        return outcome.job_id

    @rule(job_id=jobs, aim=st.sampled_from(["on", "on", "on", "any"]), data=st.data())
    def send_a_command(self, job_id: UUID, aim: str, data: st.DataObject) -> None:
        """Three steps in four move a live job on; the others send a command of any kind to
        any job, deleted ones included."""
        if aim == "on" and self.expected[job_id].deleted and self.live_names:
            job_id = data.draw(st.sampled_from(list(self.live_names.values())))
        job = self.expected[job_id]
        onwards = {} if job.deleted else AIMED[job.status]
        if aim == "on" and onwards:
            weighted = [command for command in onwards for _ in range(onwards[command])]
            command = data.draw(st.sampled_from(weighted))
        else:
            command = data.draw(st.sampled_from(COMMANDS))
        getattr(self, command)(job_id, job, data)
        self._probe_the_first_time(job_id, data)

    def _probe_the_first_time(self, job_id: UUID, data: st.DataObject) -> None:
        """The first time a job of this example is in a status, send it every command that
        does not move it on: each must be refused (or be a resend) and record nothing."""
        job = self.expected[job_id]
        status = "deleted" if job.deleted else job.status
        if status in self.probed:
            return
        self.probed.add(status)
        onwards = {} if job.deleted else AIMED[job.status]
        for command in COMMANDS:
            if command not in onwards:
                getattr(self, command)(job_id, job, data)
        assert job.status == status or job.deleted

    # -- users -------------------------------------------------------------------------------

    def request_stop(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        refusal = self._refusal(job, "stop in progress", job.status in STOPPABLE)
        if refusal:
            self._run(lambda: self.app.request_stop(job_id, user(self.owner)), refusal)
        elif job.status in ON_NO_NODE:  # no node holds it: it stops at once
            self._run(lambda: self.app.request_stop(job_id, user(self.owner)), 2)
            self._moved(job, "stopped", events=2)
        else:
            left_the_line = 1 if job.status == "enqueued" else 0  # the node's Dequeued
            self._run(lambda: self.app.request_stop(job_id, user(self.owner)),
                      1 + left_the_line)  # fmt: skip
            self._moved(job, "stop in progress")

    def delete(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        refusal = None
        if job.deleted:
            refusal = Refused(JobDeleted)
        elif job.status not in TERMINAL:
            refusal = Refused(JobNotTerminal)
        self._run(lambda: self.app.delete(job_id, user(self.owner)), refusal or 2)
        if refusal is None:  # the job's Deleted, and the name's release
            job.deleted, job.events = True, job.events + 1
            del self.live_names[job.name]

    # -- the scheduler -----------------------------------------------------------------------

    def begin_scheduling(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        refusal = self._refusal(job, "scheduling", job.status == "pending")
        self._run(lambda: self.app.begin_scheduling(job_id), refusal or 1)
        if refusal is None:
            self._moved(job, "scheduling")

    def assign(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(sorted(NODES)))
        refusal = self._refusal(job, "building", job.status == "scheduling")
        self._run(lambda: self.app.assign(job_id, self.node_ids[node], node), refusal or 1)
        if refusal is None:
            self._moved(job, "building")
            job.node_id, job.built = self.node_ids[node], False

    def reject(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        message = "no registered node has 99 accelerators"
        refusal = self._refusal(job, "rejected", job.status == "scheduling")
        self._run(lambda: self.app.reject(job_id, "no_node_meets_request", message),
                  refusal or 1)  # fmt: skip
        if refusal is None:
            self._moved(job, "rejected")
            job.failure_code, job.failure_says = "no_node_meets_request", message

    def lose_node(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        """The job's node (or another, one time in ten) is lost."""
        node_id = self._reporting_node(job, data)
        message = "node lost: silent past its lease"

        def command() -> Outcome:
            return self.app.node_lost(job_id, node_id, message)

        if node_id != job.node_id or job.deleted or job.status not in (
            "building", "enqueued", "in progress", "stop in progress"
        ):  # fmt: skip
            self._run(command, None)  # not on that node (any more): nothing to do
            return
        status = job.status
        target = {"building": "scheduling", "enqueued": "scheduling", "in progress": "failed",
                  "stop in progress": "stop failed"}[status]  # fmt: skip
        if status == "in progress" and job.retries_left:
            target, job.retries_left = "scheduling", job.retries_left - 1  # Retried
        self._moved(job, target)
        if target == "scheduling":
            events = self._let_go(job_id, job, status)
            job.node_id, job.built, job.accelerators = None, False, []
            self._run(command, 1 + events)
            return
        else:
            job.failure_code = "stop_failed" if target == "stop failed" else "node_lost"
            job.failure_says = message
        self._run(command, 1 + self._let_go(job_id, job, status))

    # -- the nodes' accelerators -----------------------------------------------------------

    def _node_of(self, job: Expected) -> str:
        return next(name for name, node_id in self.node_ids.items() if node_id == job.node_id)

    def _others_on(self, node: str, job_id: UUID) -> list[tuple[UUID, Expected]]:
        return [(other_id, other) for other_id, other in self.expected.items()
                if other_id != job_id and other.node_id == self.node_ids[node]
                and not other.deleted]  # fmt: skip

    def _free_index(self, node: str, job_id: UUID) -> int | None:
        held = {other.index for _, other in self._others_on(node, job_id)
                if other.index is not None}  # fmt: skip
        return next((i for i in range(NODES[node]) if i not in held), None)

    def _earlier_in_line(self, node: str, job_id: UUID, job: Expected) -> bool:
        return any(other.status == "enqueued" and other.place < job.place
                   for _, other in self._others_on(node, job_id))  # fmt: skip

    def _start_or_line_up(self, job_id: UUID, job: Expected) -> None:
        """The job was built: 2 more ledger events either way (Started and Allocated, or
        Enqueued and Queued)."""
        node = self._node_of(job)
        index = self._free_index(node, job_id)
        if index is not None and not self._earlier_in_line(node, job_id, job):
            self._moved(job, "in progress")
            job.index, job.accelerators = index, [index]
        else:
            self._moved(job, "enqueued")

    def _let_go(self, job_id: UUID, job: Expected, was: str) -> int:
        """The job left status ``was``: it lets go of its index or its place in line, and the
        next jobs in line start. Returns the ledger events that makes (beyond the job's)."""
        node_id = job.node_id or next(
            (self.node_ids[n] for n in NODES if self._holds_or_waits(job, n)), None
        )
        if was == "enqueued":
            return 1  # Dequeued: the line's head is blocked by capacity, no one starts
        if job.index is None or node_id is None:
            return 0
        node = next(n for n, i in self.node_ids.items() if i == node_id)
        job.index = None
        waiting = [other_id for other_id, other in self._others_on(node, job_id)
                   if other.status == "enqueued"]  # fmt: skip
        return 1 + self._start_in_line(node, waiting)  # Released, then who starts

    def _start_in_line(self, node: str, waiting: list[UUID]) -> int:
        """Start the jobs waiting on ``node`` in their order while indices are free; returns
        the events that makes (each one's Started, and the node's Allocated)."""
        events = 0
        for other_id in sorted(waiting, key=lambda other_id: self.expected[other_id].place):
            other = self.expected[other_id]
            index = self._free_index(node, other_id)
            if index is None:
                break
            other.status, other.events, other.yielded = "in progress", other.events + 1, False
            other.index, other.accelerators = index, [index]
            events += 2
        return events

    def _holds_or_waits(self, job: Expected, node: str) -> bool:
        return job.node_id == self.node_ids[node]

    # -- node agents -------------------------------------------------------------------------

    def _reporting_node(self, job: Expected, data: st.DataObject) -> str:
        """The job's node, but one time in ten (and always while it has none) another."""
        from_other_node = data.draw(st.integers(0, 9)) == 9
        if job.node_id is None or from_other_node:
            return next(i for i in self.node_ids.values() if i != job.node_id)
        return job.node_id

    def _report(
        self,
        job_id: UUID,
        job: Expected,
        data: st.DataObject,
        report: dict[str, Any],
        target: str,
        allowed_from: set[str],
        change: Callable[[], int],
    ) -> None:
        """Send a report, mostly from the job's node; ``change`` updates the expected job and
        says how many events the report records where SPEC.md allows it."""
        node_id = self._reporting_node(job, data)

        def command() -> Outcome:
            return self.app.report(job_id, node_id, {"node_id": node_id, **report})

        if node_id != job.node_id:
            self._run(command, Refused(WrongNode))
        elif job.status == target or (report["type"] == "stopped" and job.yielded):
            self._run(command, None)  # a resend of a recorded report
        elif job.deleted:
            self._run(command, Refused(JobDeleted))
        elif job.status not in allowed_from:
            self._refuse(job, report["type"], command, job.status, target)
        else:
            self._run(command, change())

    def _refuse(self, job: Expected, kind: str, command: Callable[[], Outcome], current: str,
                attempted: str) -> None:  # fmt: skip
        """A report the status refuses; the first of its kind is kept (ReportRefused)."""
        first = kind not in job.refused
        self._run(command, Refused(IllegalTransition, current, attempted, records=int(first)))
        if first:
            job.refused.add(kind)
            job.events += 1

    def report_built(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        commit = data.draw(st.none() | commits)
        node_id = self._reporting_node(job, data)

        def command() -> Outcome:
            report = {"node_id": node_id, "type": "built", "commit": commit}
            return self.app.report(job_id, node_id, report)

        if node_id != job.node_id:
            self._run(command, Refused(WrongNode))
        elif job.deleted:
            self._run(command, Refused(JobDeleted))
        elif job.built:
            self._run(command, None)  # a resend: this node's build is recorded
        elif job.status != "building":
            self._refuse(job, "built", command, job.status, "in progress")
        else:
            job.built, job.events = True, job.events + 1  # Built
            job.commit = commit or job.commit
            self._start_or_line_up(job_id, job)
            self._run(command, 3)

    def report_exited_elsewhere(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        """A job that holds this enqueued job's node ends (if there is one)."""
        running = [(other_id, other) for other_id, other in self.expected.items()
                   if other_id != job_id and other.node_id == job.node_id
                   and other.status == "in progress" and not other.deleted]  # fmt: skip
        if running:
            other_id, other = running[0]
            self.report_exited(other_id, other, data, from_its_node=True)

    def report_build_failed(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        commit = data.draw(st.none() | commits)
        message = "the requirements file requirements.txt was not found"

        def change() -> int:
            self._moved(job, "failed")
            job.commit = commit
            job.failure_code, job.failure_says = "requirements_not_found", message
            return 1

        report = {"type": "build_failed", "code": "requirements_not_found",
                  "message": message, "commit": commit}  # fmt: skip
        self._report(job_id, job, data, report, "failed", {"building"}, change)

    def report_exited(self, job_id: UUID, job: Expected, data: st.DataObject,
                      from_its_node: bool = False) -> None:  # fmt: skip
        exit_code = data.draw(st.sampled_from([0, 1, 2, 137]))
        target = "succeeded" if exit_code == 0 else "failed"
        retried = exit_code == 137 and job.retries_left > 0 and job.status == "in progress"
        if retried:
            target = "scheduling"

        def change() -> int:
            self._moved(job, target)
            if retried:  # Retried: the job looks for nodes again, from its last checkpoint
                job.retries_left -= 1
                events = self._let_go(job_id, job, "in progress")
                job.node_id, job.built, job.accelerators = None, False, []
                return 1 + events
            if exit_code:
                job.failure_code = "entry_point_failed"
                job.failure_says = f"exited with code {exit_code}"
            return 1 + self._let_go(job_id, job, "in progress")

        report = {"type": "exited", "exit_code": exit_code}
        if from_its_node and job.node_id is not None:
            node_id = job.node_id
            self._run(lambda: self.app.report(job_id, node_id, {"node_id": node_id, **report}),
                      change())  # fmt: skip
            return
        self._report(job_id, job, data, report, target, {"in progress"}, change)

    def report_failed(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        message = "the job ran past its time limit"

        def change() -> int:
            self._moved(job, "failed")
            job.failure_code, job.failure_says = "time_limit_exceeded", message
            return 1 + self._let_go(job_id, job, "in progress")

        report = {"type": "failed", "code": "time_limit_exceeded", "message": message}
        self._report(job_id, job, data, report, "failed", {"in progress"}, change)

    def report_agent_restarted(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        """The agent restarted and found the job it ran gone (no process, no exit code): an
        infrastructure failure, retried while the job has retries left."""
        message = data.draw(st.sampled_from([NEVER_LAUNCHED, LOST_WHILE_AWAY]))
        retried = job.retries_left > 0 and job.status == "in progress"

        def change() -> int:
            self._moved(job, "scheduling" if retried else "failed")
            events = self._let_go(job_id, job, "in progress")
            if retried:  # Retried: the job looks for nodes again, from its last checkpoint
                job.retries_left -= 1
                job.node_id, job.built, job.accelerators = None, False, []
            else:
                job.failure_code, job.failure_says = "node_lost", message
            return 1 + events

        report = {"type": "failed", "code": "node_lost", "message": message}
        self._report(job_id, job, data, report, "failed", {"in progress"}, change)

    def report_agent_failed_building(self, job_id: UUID, job: Expected,
                                     data: st.DataObject) -> None:  # fmt: skip
        """The agent failed before the entry point started (the job built, or waited for its
        accelerators): retried while the job has retries left; else a build fails, and a job
        that waits looks for another node."""
        message = "the node agent failed while running the job: disk full"
        was = job.status
        retried = job.retries_left > 0
        target = "scheduling" if retried or was == "enqueued" else "failed"

        def change() -> int:
            self._moved(job, target)
            events = self._let_go(job_id, job, was)
            if target == "scheduling":
                job.retries_left -= int(retried)
                job.node_id, job.built, job.accelerators = None, False, []
            else:
                job.failure_code, job.failure_says = "node_lost", message
            return 1 + events

        report = {"type": "build_failed", "code": "node_lost", "message": message}
        if was not in ("building", "enqueued"):
            target = "failed"  # refused from any other status, as any build failure
        self._report(job_id, job, data, report, target, {"building", "enqueued"}, change)

    def report_stopped(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        def change() -> int:
            self._moved(job, "stopped")
            job.accelerators = []
            return 1 + self._let_go(job_id, job, "stop in progress")

        # Only a user asks for a stop: an agent's "stopped" confirms one, never starts one.
        allowed_from = {"stop in progress"}
        self._report(job_id, job, data, {"type": "stopped"}, "stopped", allowed_from, change)

    def report_stop_failed(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        message = "the processes did not end within the grace period"

        def change() -> int:
            self._moved(job, "stop failed")
            job.failure_code, job.failure_says = "stop_failed", message
            return 1 + self._let_go(job_id, job, "stop in progress")

        report = {"type": "stop_failed", "message": message}
        self._report(job_id, job, data, report, "stop failed", {"stop in progress"}, change)

    def preempt(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        """The scheduler asks the node to make way (a fact), then the node confirms its
        processes ended: the job waits in its node's line again (``Preempted``), lets go of its
        accelerator, and whoever is first in that line starts, itself maybe."""
        asked = job.status == "in progress" and not job.deleted
        expected: Expectation = 1 if asked else Refused(DomainError)
        if job.deleted:
            expected = Refused(JobDeleted)
        self._run(lambda: self.app.request_preemption(job_id, "urgent", "bob"), expected)
        if not asked:
            return
        job.events += 1  # PreemptionRequested
        node_id = job.node_id
        assert node_id is not None
        self._moved(job, "enqueued")
        node = self._node_of(job)
        job.index, job.accelerators, job.yielded = None, [], True
        waiting = [other_id for other_id, other in self.expected.items()
                   if other.node_id == node_id and other.status == "enqueued"
                   and not other.deleted]  # fmt: skip
        events = 3 + self._start_in_line(node, waiting)  # Preempted, Released and Queued
        report = {"node_id": node_id, "type": "stopped", "exit_code": 143}
        self._run(lambda: self.app.report(job_id, node_id, report), events)

    def record_checkpoint(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(["checkpoint-100", "checkpoint-200"]))
        node_id = self._reporting_node(job, data)
        checkpoint = {"id": checkpoint_id(job_id, name), "name": name, "size": 1024}
        expected: Expectation = 1
        if node_id != job.node_id:
            expected = Refused(WrongNode)
        elif job.deleted:
            expected = Refused(JobDeleted)
        elif checkpoint["id"] in job.checkpoints:
            expected = None
        elif job.status not in RUNNING:
            expected = Refused(DomainError)
        self._run(lambda: self.app.record_checkpoint(job_id, node_id, checkpoint), expected)
        if expected == 1:
            job.checkpoints.add(str(checkpoint["id"]))
            job.events += 1

    def record_outputs(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        sha256 = data.draw(st.sampled_from(["a" * 64, "b" * 64]))
        node_id = self._reporting_node(job, data)
        expected: Expectation = 1
        if node_id != job.node_id:
            expected = Refused(WrongNode)
        elif job.deleted:
            expected = Refused(JobDeleted)
        elif job.output == sha256:
            expected = None  # a resend; another archive replaces the one recorded
        elif job.status not in RAN:
            expected = Refused(DomainError)
        self._run(lambda: self.app.record_outputs(job_id, node_id, 0, 2048, sha256), expected)
        if expected == 1:
            job.output = sha256
            job.events += 1

    # -- invariants --------------------------------------------------------------------------

    def _histories(self) -> dict[UUID, list[Any]]:
        """Every job's history: its events."""
        end = self._ledger_end()
        if end != self.histories_at:
            self.histories, self.histories_at = {}, end
        for job_id in self.expected.keys() - self.histories.keys():
            self.histories[job_id] = list(self.app.history(job_id))
        return self.histories

    def _event_names(self) -> dict[UUID, list[str]]:
        """Every job's history: the event names."""
        return {job_id: [type(event).__name__ for event in events]
                for job_id, events in self._histories().items()}  # fmt: skip

    @invariant()
    def every_history_follows_the_lifecycle_table(self) -> None:
        histories = self._event_names()
        for job_id, job in self.expected.items():
            names = histories[job_id]
            assert len(names) == job.events, f"{job.name}: {names}"
            assert names[0] == "Submitted"
            statuses = [EVENT_STATUS[name].value for name in names if name in EVENT_STATUS]
            for before, after in itertools.pairwise(statuses):
                assert (before, after) in SPEC_TRANSITIONS, f"{job.name}: {before} -> {after}"
            assert statuses[-1] == job.status

    @invariant()
    def no_job_with_retries_left_fails_for_the_infrastructure(self) -> None:
        """An infrastructure failure (however it was noticed: the server's lease, an agent's
        restart, an agent's failure while building) ends a job only once its retries are
        spent."""
        for job_id, events in self._histories().items():
            asked = int(getattr(events[0], "spec", {}).get("max_retries") or 0)
            spent = 0
            for event in events:
                name = type(event).__name__
                spent += name == "Retried"
                if name in ("Failed", "BuildFailed") and is_infrastructure(event.code):
                    assert spent == asked, f"{self.expected[job_id].name}: {event.code} with " \
                        f"{asked - spent} retries left"  # fmt: skip

    @invariant()
    def terminal_statuses_stay_terminal(self) -> None:
        for names in self._event_names().values():
            ends = [i for i, name in enumerate(names)
                    if name in EVENT_STATUS and EVENT_STATUS[name].value in TERMINAL]  # fmt: skip
            if ends:  # only a deletion follows, late reports kept for audit and nodes' outputs
                after = [name for name in names[ends[0] + 1 :]
                         if name not in ("ReportRefused", "OutputsRecorded")]  # fmt: skip
                assert after in ([], ["Deleted"]), names

    @invariant()
    def each_live_name_points_at_its_job(self) -> None:
        for name, job_id in self.live_names.items():
            assert self.app.job_id_for(self.owner, name) == job_id

    def teardown(self) -> None:
        try:
            self._replay_rebuilds_what_the_machine_tracked()
        finally:
            self.app.close()

    def _replay_rebuilds_what_the_machine_tracked(self) -> None:
        replica = TrainingJobs(env=self.store_env)
        try:
            for job_id, expected in self.expected.items():
                job: TrainingJob = replica.repository.get(job_id)
                assert isinstance(job, TrainingJob)
                assert job.status.value == expected.status
                assert job.node_id == expected.node_id
                assert job.commit == expected.commit
                assert job.accelerators == expected.accelerators
                assert job.deleted == expected.deleted
                assert job.checkpoint_ids == expected.checkpoints
                assert job.recorded_output(0) == expected.output
                if expected.failure_code is None:
                    assert job.failure is None
                else:
                    assert job.failure is not None
                    assert job.failure["code"] == expected.failure_code
                    assert str(expected.failure_says) in job.failure["message"]
        finally:
            replica.close()


def ledger_on(new_store_env: Callable[[], dict[str, str]]) -> type[Ledger]:
    """The machine, each of whose examples opens the store ``new_store_env`` gives."""
    return type("LedgerOnThisStore", (Ledger,), {"new_store_env": staticmethod(new_store_env)})


def test_random_command_sequences_keep_every_job_history_lawful(
    database_url: str, tmp_path: Path
) -> None:
    if database_url.startswith("sqlite"):
        files = itertools.count()

        def new_store_env() -> dict[str, str]:  # a new SQLite file per example
            url = f"sqlite:///{tmp_path / f'ledger-{next(files)}.sqlite3'}"
            return Settings(data_dir=tmp_path, database_url=url).event_store_env()

        max_examples, phases = 25, tuple(Phase)
    else:
        # One database for every example: each example is a new owner, so its names and
        # jobs are its own; the append-only ledger simply grows. Shrinking a failure is left
        # to the SQLite run, where it takes minutes instead of many.
        shared = Settings(data_dir=tmp_path, database_url=database_url).event_store_env()

        def new_store_env() -> dict[str, str]:
            return shared

        max_examples, phases = 15, tuple(phase for phase in Phase if phase != Phase.shrink)
    run_state_machine_as_test(
        ledger_on(new_store_env),
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=30,
            deadline=None,
            phases=phases,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
