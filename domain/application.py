"""The application service: the only write path to the ledger (load, command, save)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import suppress
from datetime import datetime
from functools import cached_property
from typing import Any, TypeVar, cast
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import DomainEvent
from eventsourcing.persistence import JSONTranscoder, RecordConflictError

from domain.actors import Actor, agent, scheduler
from domain.allocation import UnitOfWork
from domain.datasets import Dataset
from domain.errors import DomainError, IllegalTransition, JobDeleted
from domain.history import PastJob, version_at
from domain.job import TrainingJob
from domain.job_facts import GivenSpec
from domain.job_name import JobName
from domain.name_claims import NameClaims
from domain.node import Node
from domain.node_turns import NodeTurns
from domain.outcomes import JobNotFound, Outcome
from domain.reports import apply_report, report_facts, reporting_node
from domain.scheduler_commands import SchedulerCommands
from domain.statuses import Status
from domain.submissions import submit_all
from domain.topics import register_old_topics
from domain.transcodings import SetAsList

T = TypeVar("T")
CONFLICT_RETRIES = 16

register_old_topics()  # before this application reads a ledger written before the split


class TrainingJobs(SchedulerCommands, Application[UUID]):
    """Training jobs, their names and the nodes that run them."""

    name = "flexai"
    env = {
        "AGGREGATE_CACHE_MAXSIZE": "4096",
        "AGGREGATE_CACHE_FASTFORWARD": "y",
    }
    """Commands load a job and its nodes again and again: each load takes the aggregate last
    loaded here (a copy of it) and applies only the events recorded since, by this server or
    another one on the same ledger, so a load never misses an event (nor replays a node's)."""
    snapshotting_intervals = {Node: 100, TrainingJob: 100}  # type: ignore[dict-item]
    """A node's accelerator ledger grows with every job it runs, a job's history with every
    checkpoint it takes: both load from their last snapshot, taken every 100 events."""

    def register_transcodings(self, transcoder: JSONTranscoder) -> None:
        super().register_transcodings(transcoder)
        transcoder.register(SetAsList())

    after_save: tuple[Callable[[int], None], ...] = ()
    """Told the last ledger position of each save once it committed (on PostgreSQL the server
    sets one that tells the other replicas' views: see ``api.services``)."""

    def _notify(self, recordings: list[Any]) -> None:
        position = max((r.notification.id for r in recordings), default=None)
        if position is not None:
            for hook in self.after_save:
                hook(position)

    # -- helpers --------------------------------------------------------------------------

    _retry_lock = threading.Lock()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._node_turns = NodeTurns()

    def _retrying(self, command: Callable[[], T]) -> T:
        """Re-run a load-command-save on optimistic-concurrency conflicts, then holding the
        process's retry lock: commands racing on a hot aggregate (a node that many jobs'
        reports touch) take turns rather than collide again and again."""
        with suppress(RecordConflictError):
            return command()
        with self._retry_lock:
            for _ in range(CONFLICT_RETRIES - 2):
                with suppress(RecordConflictError):
                    return command()
            return command()

    def _save(self, job_id: UUID, *aggregates: Any) -> Outcome:
        recordings = self.save(*aggregates)
        position = max((r.notification.id for r in recordings), default=None)
        return Outcome(job_id, position)

    def job(self, job_id: UUID) -> TrainingJob:
        try:
            job: TrainingJob = self.repository.get(job_id)
        except AggregateNotFoundError:
            raise JobNotFound(f"with id {job_id}") from None
        if not isinstance(job, TrainingJob):
            raise JobNotFound(f"with id {job_id}")
        return job

    def job_id_for(self, owner: str, name: str) -> UUID:
        """The live job that holds ``name`` for ``owner``."""
        try:
            index: JobName = self.repository.get(JobName.create_id(owner, name))
        except AggregateNotFoundError:
            raise JobNotFound(f"named '{name}'") from None
        if index.job_id is None:
            raise JobNotFound(f"named '{name}'")
        return UUID(str(index.job_id))

    def node(self, node_id: UUID) -> Node:
        node: Node = self.repository.get(node_id)
        return node

    def _work(self) -> UnitOfWork:
        return UnitOfWork(self.job, self.node)

    def _command(self, job_id: UUID, command: Callable[[TrainingJob], object]) -> Outcome:
        """Load, command, let go of what the job no longer holds (starting who waited for
        it), save: all in one transaction."""

        def run() -> Outcome:
            work = self._work()
            job = work.job(job_id)
            node_ids = [placement["node_id"] for placement in job.placements]
            with self._node_turns.holding(node_ids):  # its nodes are loaded in their turn
                command(job)
                work.settle(job, node_ids)
                return self._save(job_id, *work.aggregates())

        return self._retrying(run)

    # -- users ----------------------------------------------------------------------------

    def submit(
        self, owner: str, name: str, spec: GivenSpec, by: Actor, *, schedule: bool = False
    ) -> Outcome:
        """Record a new job and claim its name in one atomic save (a name never seen claimed
        is claimed unread: see ``domain/name_claims.py``). With ``schedule`` (a scheduler runs
        that would start it at once), its scheduling starts in that same save."""

        def save(read: bool) -> Outcome:
            job = TrainingJob.submit(owner=owner, name=name, spec=spec, by=by)
            if schedule:
                job.begin_scheduling(by=scheduler())
            return self._save(job.id, job, self._claims.claim(owner, name, job.id, read=read))

        return self._claims.saving(owner, name, save, self._retrying)

    @cached_property
    def _claims(self) -> NameClaims:
        return NameClaims(self.repository)

    def submit_many(
        self, owner: str, submissions: Sequence[tuple[str, GivenSpec]], by: Actor, *,
        schedule: bool = False,
    ) -> list[Outcome | DomainError]:  # fmt: skip
        """Record new jobs, each claiming its name, in one atomic save: a job whose name is
        taken or whose spec is refused gets its error in its place, the others are saved
        (see ``domain/submissions.py``); ``schedule`` as for ``submit``."""
        saved = submit_all(self, owner, submissions, by, schedule=schedule,
                           retrying=self._retrying)  # fmt: skip
        return [Outcome(*one) if isinstance(one, tuple) else one for one in saved]

    def request_stop(self, job_id: UUID, by: Actor) -> Outcome:
        """Ask for a stop; a job no node holds yet stops at once."""

        def command(job: TrainingJob) -> None:
            on_no_node = job.status in (Status.PENDING, Status.SCHEDULING)
            job.request_stop(by=by)
            if on_no_node:
                job.confirm_stopped(by=scheduler())

        return self._command(job_id, command)

    def delete(self, job_id: UUID, by: Actor) -> Outcome:
        def run() -> Outcome:
            job = self.job(job_id)
            job.delete(by=by)
            index: JobName = self.repository.get(JobName.create_id(job.owner, job.name))
            index.release(job.id)
            return self._save(job_id, job, index)

        return self._retrying(run)

    def purge_artifacts(self, job_id: UUID, objects: int, by: Actor) -> Outcome:
        """Record that a deleted job's artifacts left the store; nothing for a job purged."""

        def run() -> Outcome:
            job = self.job(job_id)
            if not job.purge_artifacts(objects, by=by):
                return Outcome(job_id, None)
            return self._save(job_id, job)

        return self._retrying(run)

    def history(self, job_id: UUID) -> list[DomainEvent]:
        """Every event of the job, deleted or not, read from the ledger."""
        events = cast(list[DomainEvent], list(self.events.get(job_id)))
        if not events or not isinstance(self.job(job_id), TrainingJob):
            raise JobNotFound(f"with id {job_id}")
        return events

    def job_as_of(
        self, job_id: UUID, *, version: int | None = None, at: datetime | None = None,
        owner: str | None = None,
    ) -> PastJob:  # fmt: skip
        """The job folded from the ledger up to ``version``, or up to its last event recorded
        at or before ``at`` (timezone-aware); the latest version when neither is given. With
        ``owner``, another owner's job is not found."""
        events = self.history(job_id)
        if owner is not None and getattr(events[0], "owner", None) != owner:
            raise JobNotFound(f"with id {job_id}")
        version = version_at(job_id, events, version, at)
        job: TrainingJob = self.repository.get(job_id, version=version)
        return PastJob(job, events[version - 1], events[-1].originator_version,
                       events[0].timestamp)  # fmt: skip

    def open_debug_session(
        self, job_id: UUID, session_id: str, node_index: int, key_fingerprint: str, by: Actor,
        relay: str | None = None,
    ) -> Outcome:  # fmt: skip
        """Record a debug session into the running job (``DebugSessionOpened``), relayed by
        the server process ``relay``."""
        return self._command(
            job_id,
            lambda job: job.open_debug_session(session_id, node_index, key_fingerprint, by=by,
                                               relay=relay),  # fmt: skip
        )

    def close_debug_session(
        self, job_id: UUID, session_id: str, reason: str, seconds: float, by: Actor
    ) -> Outcome:
        """Record the end of a debug session once (``DebugSessionClosed``); a job ended or
        deleted meanwhile records it too, since the session was open."""

        def run() -> Outcome:
            job = self.job(job_id)
            if not job.close_debug_session(session_id, reason, seconds, by=by):
                return Outcome(job_id, None)
            return self._save(job_id, job)

        return self._retrying(run)

    # -- agents ---------------------------------------------------------------------------

    def register_node(
        self, name: str, accels: int, accel_type: str, address: str | None = None,
        gpus: list[dict[str, Any]] | None = None, isolation: dict[str, Any] | None = None,
    ) -> tuple[str, Outcome]:  # fmt: skip
        node_id = Node.create_id(name)

        def run() -> Outcome:
            node: Node
            try:
                node = self.repository.get(node_id)
            except AggregateNotFoundError:
                node = Node.register(name, accels, accel_type, by=agent(name), address=address,
                                     gpus=gpus, isolation=isolation)  # fmt: skip
            else:
                node.update(accels=accels, accel_type=accel_type, by=agent(name),
                            address=address, gpus=gpus, isolation=isolation)  # fmt: skip
            return self._save(node_id, node)

        return str(node_id), self._retrying(run)

    def report(self, job_id: UUID, node_id: str, report: dict[str, Any]) -> Outcome:
        """Apply an agent's report once: a resend of a recorded report changes nothing. A
        report the job's status refuses is kept for audit (``ReportRefused``), then refused."""
        kind = report["type"]

        def run() -> Outcome:
            work = self._work()
            job = work.job(job_id)
            index, by = reporting_node(job, node_id, report.get("node_index"))
            node_ids = [placement["node_id"] for placement in job.placements]
            with self._node_turns.holding(node_ids):  # its nodes are loaded in their turn
                if not apply_report(job, kind, report, by, index):
                    return Outcome(job_id, None)
                if kind == "built":
                    work.try_start(job)
                work.settle(job, node_ids)
                return self._save(job_id, *work.aggregates())

        try:
            return self._retrying(run)
        except (IllegalTransition, JobDeleted) as refusal:
            self._keep_refused(job_id, node_id, report, refusal)
            raise

    def _keep_refused(
        self, job_id: UUID, node_id: str, report: dict[str, Any], refusal: Exception
    ) -> None:
        def run() -> Outcome:
            job = self.job(job_id)
            index, by = reporting_node(job, node_id, report.get("node_index"))
            facts = report_facts(report)
            if not job.note_refused_report(report["type"], index, str(refusal), facts, by):
                return Outcome(job_id, None)
            return self._save(job_id, job)

        with suppress(DomainError):  # the refusal itself is what the agent hears about
            self._retrying(run)

    def record_checkpoint(
        self, job_id: UUID, node_id: str, checkpoint: dict[str, Any]
    ) -> Outcome:
        def run() -> Outcome:
            job = self.job(job_id)
            _, by = reporting_node(job, node_id, checkpoint.get("node_index"))
            if not job.record_checkpoint(checkpoint, by=by):
                return Outcome(job_id, None)
            return self._save(job_id, job)

        return self._retrying(run)

    def record_outputs(
        self, job_id: UUID, node_id: str, node_index: int, size: int, sha256: str
    ) -> Outcome:
        """Record node ``node_index``'s output archive (its bytes and their SHA-256) once."""

        def run() -> Outcome:
            job = self.job(job_id)
            index, by = reporting_node(job, node_id, node_index)
            if not job.record_outputs(index, size, sha256, by=by):
                return Outcome(job_id, None)
            return self._save(job_id, job)

        return self._retrying(run)

    # -- datasets -------------------------------------------------------------------------

    def push_dataset(
        self, owner: str, name: str, content_hash: str, size: int, files: int, by: Actor,
        archive_size: int | None = None,
    ) -> int | None:  # fmt: skip
        """Record a version of the owner's dataset ``name`` (made on its first push; ``size``:
        its files' bytes, ``archive_size``: its archive's); return its ledger position, or None
        when the latest version holds that content already."""
        dataset_id = Dataset.create_id(owner, name)

        def run() -> int | None:
            dataset: Dataset
            try:
                dataset = self.repository.get(dataset_id)
            except AggregateNotFoundError:
                dataset = Dataset.create(owner, name, by=by)
            if not dataset.push(content_hash, size, files, by=by, archive_size=archive_size):
                return None
            return self._save(dataset_id, dataset).position

        return self._retrying(run)
