"""The application service: the only write path to the ledger (load, command, save)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from uuid import UUID, uuid5

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import DomainEvent
from eventsourcing.persistence import RecordConflictError

from domain.datasets import Dataset
from domain.model import (
    NAMESPACE,
    Actor,
    DomainError,
    JobName,
    Node,
    Status,
    TrainingJob,
    agent,
    scheduler,
)

T = TypeVar("T")
CONFLICT_RETRIES = 8


class JobNotFound(DomainError):
    def __init__(self, what: str) -> None:
        super().__init__(f"no job {what}; `flexai training list` shows your jobs")


class WrongNode(DomainError):
    pass


@dataclass(frozen=True)
class Outcome:
    """What a command did: the job it touched and the ledger position of its last event
    (None when it recorded nothing, as an idempotent resend does)."""

    job_id: UUID
    position: int | None


# The status an agent report leads to; a resend finds the job there already.
REPORT_STATUS = {
    "enqueued": Status.ENQUEUED,
    "started": Status.IN_PROGRESS,
    "build_failed": Status.FAILED,
    "failed": Status.FAILED,
    "stopped": Status.STOPPED,
    "stop_failed": Status.STOP_FAILED,
}


class TrainingJobs(Application[UUID]):
    """Training jobs, their names and the nodes that run them."""

    name = "flexai"

    # -- helpers --------------------------------------------------------------------------

    def _retrying(self, command: Callable[[], T]) -> T:
        """Re-run a load-command-save on optimistic-concurrency conflicts."""
        for _ in range(CONFLICT_RETRIES - 1):
            try:
                return command()
            except RecordConflictError:
                continue
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

    def _command(self, job_id: UUID, command: Callable[[TrainingJob], None]) -> Outcome:
        def run() -> Outcome:
            job = self.job(job_id)
            command(job)
            return self._save(job_id, job)

        return self._retrying(run)

    # -- users ----------------------------------------------------------------------------

    def submit(self, owner: str, name: str, spec: dict[str, Any], by: Actor) -> Outcome:
        """Record a new job and claim its name in one atomic save."""

        def run() -> Outcome:
            job = TrainingJob.submit(owner=owner, name=name, spec=spec, by=by)
            index_id = JobName.create_id(owner, name)
            index: JobName
            try:
                index = self.repository.get(index_id)
            except AggregateNotFoundError:
                index = JobName(owner=owner, name=name, job_id=job.id)
            else:
                index.claim(job.id)
            return self._save(job.id, job, index)

        return self._retrying(run)

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

    def history(self, job_id: UUID) -> list[DomainEvent]:
        """Every event of the job, deleted or not, read from the ledger."""
        events = cast(list[DomainEvent], list(self.events.get(job_id)))
        if not events or not isinstance(self.job(job_id), TrainingJob):
            raise JobNotFound(f"with id {job_id}")
        return events

    # -- scheduler ------------------------------------------------------------------------

    def begin_scheduling(self, job_id: UUID) -> Outcome:
        return self._command(job_id, lambda job: job.begin_scheduling(by=scheduler()))

    def assign(self, job_id: UUID, node_id: str, node_name: str) -> Outcome:
        return self._command(
            job_id, lambda job: job.assign(node_id=node_id, node_name=node_name, by=scheduler())
        )

    def reject(self, job_id: UUID, code: str, message: str) -> Outcome:
        return self._command(
            job_id, lambda job: job.reject(code=code, message=message, by=scheduler())
        )

    # -- agents ---------------------------------------------------------------------------

    def register_node(self, name: str, accels: int, accel_type: str) -> tuple[str, Outcome]:
        node_id = Node.create_id(name)

        def run() -> Outcome:
            node: Node
            try:
                node = self.repository.get(node_id)
            except AggregateNotFoundError:
                node = Node.register(name, accels, accel_type, by=agent(name))
            else:
                node.update(accels=accels, accel_type=accel_type, by=agent(name))
            return self._save(node_id, node)

        return str(node_id), self._retrying(run)

    def _assigned_job(self, job_id: UUID, node_id: str) -> tuple[TrainingJob, Actor]:
        """The job an agent reports on, which must be its node's; and the agent as actor."""
        job = self.job(job_id)
        if job.node_id != node_id or job.node_name is None:
            raise WrongNode(
                f"job '{job.name}' is not assigned to node {node_id}; "
                "drop it and take the node's current assignments"
            )
        return job, agent(job.node_name)

    def report(self, job_id: UUID, node_id: str, report: dict[str, Any]) -> Outcome:
        """Apply an agent's report once: a resend of a recorded report changes nothing."""
        kind = report["type"]

        def run() -> Outcome:
            job, by = self._assigned_job(job_id, node_id)
            if kind == "logs_unavailable":
                noted = job.note_logs_unavailable(
                    report["message"], report["offset"], report["written"], by=by
                )
                return self._save(job_id, job) if noted else Outcome(job_id, None)
            if _already_recorded(job, kind, report):
                return Outcome(job_id, None)
            _apply_report(job, kind, report, by)
            return self._save(job_id, job)

        return self._retrying(run)

    def record_checkpoint(
        self, job_id: UUID, node_id: str, checkpoint: dict[str, Any]
    ) -> Outcome:
        def run() -> Outcome:
            job, by = self._assigned_job(job_id, node_id)
            if not job.record_checkpoint(checkpoint, by=by):
                return Outcome(job_id, None)
            return self._save(job_id, job)

        return self._retrying(run)

    # -- datasets -------------------------------------------------------------------------

    def push_dataset(
        self, owner: str, name: str, content_hash: str, size: int, files: int, by: Actor
    ) -> int | None:
        """Record a version of the owner's dataset ``name`` (made on its first push); return
        its ledger position, or None when the latest version holds that content already."""
        dataset_id = Dataset.create_id(owner, name)

        def run() -> int | None:
            dataset: Dataset
            try:
                dataset = self.repository.get(dataset_id)
            except AggregateNotFoundError:
                dataset = Dataset.create(owner, name, by=by)
            if not dataset.push(content_hash, size, files, by=by):
                return None
            return self._save(dataset_id, dataset).position

        return self._retrying(run)


def checkpoint_id(job_id: UUID, name: str) -> str:
    """Checkpoint ids derive from job and name, so a re-upload names the same checkpoint."""
    return str(uuid5(NAMESPACE, f"checkpoint\x00{job_id}\x00{name}"))


def _already_recorded(job: TrainingJob, kind: str, report: dict[str, Any]) -> bool:
    if kind == "exited":
        expected = Status.SUCCEEDED if report.get("exit_code") == 0 else Status.FAILED
        return job.status == expected
    return REPORT_STATUS.get(kind) == job.status


def _apply_report(job: TrainingJob, kind: str, report: dict[str, Any], by: Actor) -> None:
    if kind == "enqueued":
        job.enqueue(commit=report.get("commit"), by=by)
    elif kind == "started":
        job.start(commit=report.get("commit"), accelerators=report.get("accelerators", []), by=by)
    elif kind == "build_failed":
        job.fail_build(
            code=report["code"], message=report["message"], commit=report.get("commit"), by=by
        )
    elif kind == "exited":
        job.finish(exit_code=int(report["exit_code"]), by=by)
    elif kind == "failed":
        job.fail(code=report["code"], message=report["message"], by=by)
    elif kind == "stopped":
        job.confirm_stopped(by=by, exit_code=report.get("exit_code"))
    elif kind == "stop_failed":
        job.fail_stop(message=report["message"], by=by)
    else:
        raise DomainError(f"unknown report type '{kind}'")
