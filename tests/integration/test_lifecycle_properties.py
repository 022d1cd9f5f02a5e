"""Random command sequences against the real application and store keep the ledger lawful.

The expected transitions are copied from the lifecycle table of SPEC.md, not from the code, so
a wrong table in ``domain/model.py`` fails here. Most steps send a job a command that
SPEC.md allows from its status, so jobs get far into their lifecycle; the first time a job is
in a status, it is sent every other command too, so refusals get tried from each status.
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
from domain.application import Outcome, TrainingJobs, WrongNode, checkpoint_id
from domain.model import (
    EVENT_STATUS,
    DomainError,
    IllegalTransition,
    JobDeleted,
    JobNotTerminal,
    NameTaken,
    TrainingJob,
    scheduler,
    user,
)
from tests.support import SPEC_TERMINAL as TERMINAL
from tests.support import SPEC_TRANSITIONS

STOPPABLE = {"pending", "scheduling", "building", "enqueued", "in progress"}
ON_NO_NODE = {"pending", "scheduling"}
RUNNING = {"in progress", "stop in progress"}

# The commands that move a job on from each status, and how often to pick each (an agent's
# unasked "stopped" is tried too, and must be refused). Only to aim the random choice, so
# that jobs get deep into their lifecycle within a few steps; every other command is tried.
AIMED: dict[str, dict[str, int]] = {
    "pending": {"begin_scheduling": 4, "request_stop": 1},
    "scheduling": {"assign": 6, "reject": 1, "request_stop": 1},
    "building": {"report_started": 3, "report_enqueued": 2, "report_build_failed": 1,
                 "request_stop": 1, "report_stopped": 1},
    "enqueued": {"report_started": 2, "requeue_after_node_loss": 2, "request_stop": 1,
                 "report_stopped": 1},
    "in progress": {"report_exited": 2, "record_checkpoint": 2, "report_failed": 1,
                    "request_stop": 2, "report_stopped": 1},
    "stop in progress": {"report_stopped": 2, "report_stop_failed": 1, "record_checkpoint": 1},
    **{status: {"delete": 1} for status in TERMINAL},
}  # fmt: skip
COMMANDS = sorted({command for commands in AIMED.values() for command in commands})

NODES = {"node-a": 8, "node-b": 4}
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
    events: int = 1


@dataclass
class Refused:
    """The error a command must raise; for IllegalTransition, the statuses it names."""

    error: type[DomainError]
    current: str = ""
    attempted: str = ""


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

    @initialize()
    def register_nodes(self) -> None:
        for name, accels in NODES.items():
            self.node_ids[name], _ = self.app.register_node(name, accels, "H100")

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
            assert self._ledger_end() == before, "a refused command recorded events"
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

    # -- rules -------------------------------------------------------------------------------

    @precondition(lambda self: len(self.live_names) < 2)
    @rule(target=jobs, name=job_names, data=st.data())
    def submit(self, name: str, data: st.DataObject) -> Any:
        spec = {"repository_url": "https://example.com/r.git", "entry_point": ["train.py"],
                "accels": 1, "nodes": 1}  # fmt: skip

        def command() -> Outcome:
            return self.app.submit(self.owner, name, spec, user(self.owner))

        if name in self.live_names:
            self._run(command, Refused(NameTaken))
            return multiple()
        outcome = self._run(command, 2)  # the job's Submitted, and the name's claim
        assert outcome is not None
        self.expected[outcome.job_id] = Expected(name=name)
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
            self._run(lambda: self.app.request_stop(job_id, user(self.owner)), 1)
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
            job.node_id = self.node_ids[node]

    def reject(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        message = "no registered node has 99 accelerators"
        refusal = self._refusal(job, "rejected", job.status == "scheduling")
        self._run(lambda: self.app.reject(job_id, "no_node_meets_request", message),
                  refusal or 1)  # fmt: skip
        if refusal is None:
            self._moved(job, "rejected")
            job.failure_code, job.failure_says = "no_node_meets_request", message

    def requeue_after_node_loss(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        """The application has no command for node loss yet: the aggregate's own is saved."""

        def requeue() -> Outcome:
            aggregate = self.app.job(job_id)
            aggregate.requeue(reason="node lost", by=scheduler())
            recordings = self.app.save(aggregate)
            return Outcome(job_id, max(r.notification.id for r in recordings))

        refusal = self._refusal(job, "scheduling", job.status == "enqueued")
        self._run(requeue, refusal or 1)
        if refusal is None:
            self._moved(job, "scheduling")
            job.node_id = None

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
        elif job.status == target:
            self._run(command, None)  # a resend of a recorded report
        elif job.deleted:
            self._run(command, Refused(JobDeleted))
        elif job.status not in allowed_from:
            self._run(command, Refused(IllegalTransition, job.status, target))
        else:
            self._run(command, change())

    def report_enqueued(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        commit = data.draw(commits)

        def change() -> int:
            self._moved(job, "enqueued")
            job.commit = commit
            return 1

        report = {"type": "enqueued", "commit": commit}
        self._report(job_id, job, data, report, "enqueued", {"building"}, change)

    def report_started(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        commit = data.draw(st.none() | commits)
        accelerators = data.draw(st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True))

        def change() -> int:
            self._moved(job, "in progress")
            job.commit, job.accelerators = commit or job.commit, accelerators
            return 1

        report = {"type": "started", "commit": commit, "accelerators": accelerators}
        self._report(job_id, job, data, report, "in progress", {"building", "enqueued"}, change)

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

    def report_exited(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        exit_code = data.draw(st.sampled_from([0, 1, 2, 137]))
        target = "succeeded" if exit_code == 0 else "failed"

        def change() -> int:
            self._moved(job, target)
            if exit_code:
                job.failure_code = "entry_point_failed"
                job.failure_says = f"exited with code {exit_code}"
            return 1

        report = {"type": "exited", "exit_code": exit_code}
        self._report(job_id, job, data, report, target, {"in progress"}, change)

    def report_failed(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        message = "the job ran past its time limit"

        def change() -> int:
            self._moved(job, "failed")
            job.failure_code, job.failure_says = "time_limit_exceeded", message
            return 1

        report = {"type": "failed", "code": "time_limit_exceeded", "message": message}
        self._report(job_id, job, data, report, "failed", {"in progress"}, change)

    def report_stopped(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        def change() -> int:
            self._moved(job, "stopped")
            job.accelerators = []
            return 1

        # Only a user asks for a stop: an agent's "stopped" confirms one, never starts one.
        allowed_from = {"stop in progress"}
        self._report(job_id, job, data, {"type": "stopped"}, "stopped", allowed_from, change)

    def report_stop_failed(self, job_id: UUID, job: Expected, data: st.DataObject) -> None:
        message = "the processes did not end within the grace period"

        def change() -> int:
            self._moved(job, "stop failed")
            job.failure_code, job.failure_says = "stop_failed", message
            return 1

        report = {"type": "stop_failed", "message": message}
        self._report(job_id, job, data, report, "stop failed", {"stop in progress"}, change)

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

    # -- invariants --------------------------------------------------------------------------

    def _event_names(self, job_id: UUID) -> list[str]:
        return [type(event).__name__ for event in self.app.history(job_id)]

    @invariant()
    def every_history_follows_the_lifecycle_table(self) -> None:
        for job_id, job in self.expected.items():
            names = self._event_names(job_id)
            assert len(names) == job.events, f"{job.name}: {names}"
            assert names[0] == "Submitted"
            statuses = [EVENT_STATUS[name].value for name in names if name in EVENT_STATUS]
            for before, after in itertools.pairwise(statuses):
                assert (before, after) in SPEC_TRANSITIONS, f"{job.name}: {before} -> {after}"
            assert statuses[-1] == job.status

    @invariant()
    def terminal_statuses_stay_terminal(self) -> None:
        for job_id in self.expected:
            names = self._event_names(job_id)
            ends = [i for i, name in enumerate(names)
                    if name in EVENT_STATUS and EVENT_STATUS[name].value in TERMINAL]  # fmt: skip
            if ends:
                assert names[ends[0] + 1 :] in ([], ["Deleted"]), names

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
