"""A job's attempts: preemption (a higher-priority job takes its accelerators, and it waits
in line again) and retries (an attempt that failed for a cause the job retries on goes back to
``scheduling``). :class:`~domain.job.TrainingJob` inherits these commands and records their
events, under its own explicit topics (``domain.job:TrainingJob.Preempted``); ledgers written
before stored them as ``domain.job_attempts:JobAttempts.Preempted``, which still resolve
(:mod:`domain.topics`).

Every attempt after the first starts from the job's last checkpoint, if it took one; the agent
says which attempt it is in ``FLEXAI_RESTART_COUNT`` (the attempt, less one).
"""

from __future__ import annotations

import domain.values as values
from domain.actors import Actor
from domain.errors import DomainError, checked
from domain.job_state import JobState
from domain.lifecycle import ROWS, require
from domain.sharing import retry_cause
from domain.statuses import Status

JOB_EVENT_PREFIXES = ("TrainingJob.", "JobAttempts.")
"""The qualified names of a job's events start with one of these (``JobAttempts.``: in topics
stored before the job's events had explicit topics)."""


RETRIED_FROM = ROWS["Retried"].sources
"""Where an attempt may be retried: on its nodes, building, waiting or running."""


def is_job_event(domain_event: object) -> bool:
    return type(domain_event).__qualname__.startswith(JOB_EVENT_PREFIXES)


class JobAttempts(JobState):
    """The commands of a job's attempts and their events' bodies
    (:class:`~domain.job_state.JobState` says which attempt it is and what retries it has
    left). :class:`~domain.job.TrainingJob` makes each body an event (``job_event``), so that
    the one aggregate class holds every event of a job under a topic that does not depend on
    where a method sits."""

    # -- commands -------------------------------------------------------------------------

    def request_preemption(self, for_job: str, for_owner: str, by: Actor) -> bool:
        """Ask the job's nodes to stop it for ``for_owner``'s job ``for_job``; False when it
        is asked already."""
        require(self, "PreemptionRequested")
        if self.preemption is not None:
            return False
        if not self.job_spec.may_be_preempted:
            raise DomainError(f"job '{self.name}' is not preemptible (it was not run with "
                              "--preemptible)")  # fmt: skip
        checked(values.check_message, for_job, "for_job")
        checked(values.check_message, for_owner, "for_owner")
        self._preemption_requested(for_job=for_job, for_owner=for_owner, attempt=self.attempt,
                                   by=by)  # fmt: skip
        return True

    def yield_node(self, by: Actor, exit_code: int | None = None, node_index: int = 0) -> None:
        """A node's processes ended for the preemption; once every node's did, the job is
        ``enqueued`` again (``Preempted``), in line on the same nodes with what it built."""
        pending = [i for i, p in enumerate(self.placements) if not p.get("stopped")]
        before_others = len(pending) > 1 and node_index in pending
        require(self, "NodeYielded" if before_others else "Preempted")
        if exit_code is not None:
            checked(values.check_exit_code, exit_code)
        if before_others:
            self._node_yielded(node_index=node_index, exit_code=exit_code, by=by)
            return
        preemption = self.preemption or {}
        released = [list(p.get("accelerators") or []) for p in self.placements]
        self._preempted(attempt=self.attempt, for_job=str(preemption.get("for_job", "")),
                        for_owner=str(preemption.get("for_owner", "")), exit_code=exit_code,
                        allocations_released=released, by=by)  # fmt: skip

    def retry_if_owed(self, code: str, message: str, by: Actor,
                      exit_code: int | None = None) -> bool:  # fmt: skip
        """The attempt cannot go on for ``code`` (``message`` says why): the job is retried
        (``Retried``) when :meth:`owes_retry`; False leaves the failure to the caller."""
        cause = retry_cause(self.job_spec, code, exit_code)
        if cause is None or not self.owes_retry(code, exit_code):
            return False
        self.retry(cause, f"{message}; {self.retries_left - 1} retries left", by=by)
        return True

    def owes_retry(self, code: str, exit_code: int | None = None) -> bool:
        """Whether a failure for ``code`` (and ``exit_code``) must be retried rather than end
        the job: the job retries on it (every failure of the infrastructure, and the exit codes
        it names), has retries left, and is on its nodes (building, waiting or running)."""
        return (
            retry_cause(self.job_spec, code, exit_code) is not None
            and self.retries_left > 0
            and self.status in RETRIED_FROM
        )

    def refuse_failing_what_is_retried(self, code: str, exit_code: int | None = None) -> None:
        """A failure the job is owed a retry for is never recorded as its end."""
        if self.owes_retry(code, exit_code):
            raise DomainError(
                f"job '{self.name}' has {self.retries_left} retries left and retries on "
                f"{retry_cause(self.job_spec, code, exit_code)}: it is retried, not failed"
            )

    def retry(self, cause: str, message: str, by: Actor) -> None:
        """The attempt failed for ``cause`` (``node_lost``, ``exit code 137``) and retries are
        left: the job looks for nodes again (``Retried``)."""
        require(self, "Retried")
        checked(values.check_message, cause, "cause")
        checked(values.check_message, message)
        nodes = [str(p["node_name"]) for p in self.placements]
        self._retried(attempt=self.attempt, cause=cause, message=message, nodes=nodes,
                      retries_left=self.retries_left - 1, by=by)  # fmt: skip

    # -- events' bodies (TrainingJob records them as events): they only mutate -------------

    def _preemption_requested(self, for_job: str, for_owner: str, attempt: int,
                              by: Actor) -> None:  # fmt: skip
        self.preempting: dict[str, str] | None = {"for_job": for_job, "for_owner": for_owner}

    def _node_yielded(self, node_index: int, exit_code: int | None, by: Actor) -> None:
        self.placements[node_index]["stopped"] = True

    def _preempted(self, attempt: int, for_job: str, for_owner: str, exit_code: int | None,
                   allocations_released: list[list[int]], by: Actor) -> None:  # fmt: skip
        self.attempt_number, self.yielded = attempt + 1, True
        self.preempting = None
        self.accelerators = []
        for placement in self.placements:
            placement.update(accelerators=[], exit_code=None, stopped=False)
        self.status = Status.ENQUEUED

    def _retried(self, attempt: int, cause: str, message: str, nodes: list[str],
                 retries_left: int, by: Actor) -> None:  # fmt: skip
        self.attempt_number = attempt + 1
        self.retries = int(getattr(self, "retries", 0)) + 1
        self.preempting = None
        self.node_id = self.node_name = self.master_port = None
        self.accelerators = []
        self.placements = []
        self.status = Status.SCHEDULING
