"""The scheduler's commands on jobs: place, reject, move from a lost node, preempt, and end
what overran. :class:`~domain.application.TrainingJobs` inherits them; each runs as any
command does there (load, command, let go of what the job no longer holds, save).

Imports: domain only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from domain.actors import agent, scheduler
from domain.job import TrainingJob
from domain.outcomes import Outcome
from domain.statuses import Status


class SchedulerCommands:
    """What the scheduler records on jobs."""

    def _command(self, job_id: UUID, command: Callable[[TrainingJob], object]) -> Outcome:
        raise NotImplementedError  # TrainingJobs'


    def begin_scheduling(self, job_id: UUID) -> Outcome:
        return self._command(job_id, lambda job: job.begin_scheduling(by=scheduler()))

    def assign(
        self, job_id: UUID, node_id: str, node_name: str,
        nodes: list[dict[str, Any]] | None = None,
    ) -> Outcome:  # fmt: skip
        """Place the job on its nodes (``nodes``: ``{node_id, node_name, address}`` per node
        index; by default the one node given)."""
        return self._command(
            job_id,
            lambda job: job.assign(node_id=node_id, node_name=node_name, nodes=nodes,
                                   by=scheduler()),  # fmt: skip
        )

    def schedule_onto(
        self, job_id: UUID, node_id: str, node_name: str, nodes: list[dict[str, Any]]
    ) -> Outcome:
        """A pending job that has room on nodes now: scheduled and placed in one save."""

        def command(job: TrainingJob) -> None:
            job.begin_scheduling(by=scheduler())
            job.assign(node_id=node_id, node_name=node_name, nodes=nodes, by=scheduler())

        return self._command(job_id, command)

    def reject(self, job_id: UUID, code: str, message: str) -> Outcome:
        return self._command(
            job_id, lambda job: job.reject(code=code, message=message, by=scheduler())
        )

    def node_lost(self, job_id: UUID, node_id: str, message: str,
                  left: str | None = None) -> Outcome:  # fmt: skip
        """The job's node ``node_id`` was lost: a running job is retried while it has retries
        left, else fails (``node_lost``); one building or waiting looks for other nodes; a stop
        fails; a job that moved on already is left as it is. ``left``: the node's name, when
        its agent said it is stopping and ended the job's processes there: a stop is then
        confirmed, not failed."""

        def command(job: TrainingJob) -> None:
            index = job.placement_index(node_id, None)
            if index is None:
                return
            if job.status == Status.STOP_IN_PROGRESS and left is not None:
                job.confirm_stopped(by=agent(left), node_index=index)
                return
            if job.status == Status.IN_PROGRESS:
                if not job.retry_if_owed("node_lost", message, by=scheduler()):
                    job.fail("node_lost", message, by=scheduler())
            elif job.status in (Status.BUILDING, Status.ENQUEUED):
                job.requeue(f"{message}; the job looks for another node", by=scheduler())
            elif job.status == Status.STOP_IN_PROGRESS:
                job.fail_stop(f"{message} before it confirmed the stop; its processes may "
                              "still run there", by=scheduler())  # fmt: skip

        return self._command(job_id, command)

    def request_preemption(self, job_id: UUID, for_job: str, for_owner: str) -> Outcome:
        """Ask a running job's nodes to stop it for ``for_owner``'s job ``for_job``."""
        return self._command(
            job_id, lambda job: job.request_preemption(for_job, for_owner, by=scheduler())
        )

    def fail_stop(self, job_id: UUID, message: str) -> Outcome:
        """A stop no node confirmed in time."""

        def command(job: TrainingJob) -> None:
            if job.status == Status.STOP_IN_PROGRESS:
                job.fail_stop(message, by=scheduler())

        return self._command(job_id, command)

    def fail_overdue(self, job_id: UUID, message: str) -> Outcome:
        """A job still running well past its time limit (its node did not end it)."""

        def command(job: TrainingJob) -> None:
            if job.status == Status.IN_PROGRESS:
                job.fail("time_limit_exceeded", message, by=scheduler())

        return self._command(job_id, command)
