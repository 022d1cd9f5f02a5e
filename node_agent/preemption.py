"""Preemption on this node: the control plane asks a running attempt of a job to make way for a
higher-priority job (``preempt`` in its assignment).

The attempt is stopped as by the user and reported ``stopped``; back ``enqueued``, the job keeps
its build here and waits for the go of its next attempt, which gets folders of its own and runs
from the checkpoint that attempt names (:mod:`node_agent.build.attempts`).
"""

from __future__ import annotations

import logging

from node_agent.gate import ON_ITS_WAY, Start, StartGate
from node_agent.jobstate import JobState
from node_agent.models import ENQUEUED, IN_PROGRESS, Assignment
from node_agent.reports import Answer
from node_agent.shipping import JobShipping

log = logging.getLogger("flexai.agent")

PREEMPTED = "[agent] preempted: stopping for a higher-priority job"


def asked_to_make_way(assignment: Assignment, attempt: int) -> bool:
    """Whether the control plane asks this node to stop ``attempt`` of the job, running here,
    for a higher-priority job."""
    return assignment.status == IN_PROGRESS and assignment.preempt and assignment.attempt >= attempt


def runs_again(assignment: Assignment, ran: int) -> bool:
    """Whether the assignment is the go of an attempt after ``ran`` (accelerators still to
    be checked): the job waited enqueued since its preemption, and its turn came."""
    return assignment.status == IN_PROGRESS and assignment.attempt > ran and not assignment.preempt


def made_way(job: JobState, answer: Answer | None) -> bool:
    """Whether the attempt that just ended (``answer``: the control plane's to its end) was
    preempted, and the job waits its turn (``enqueued``; still ``in progress`` while its other
    nodes stop)."""
    if not job.preempted.is_set() or job.stopping.is_set() or answer is None:
        return False
    if not answer.accepted or answer.status not in (ENQUEUED, IN_PROGRESS):
        log.info("job %s: preempted, and ends here: the job is %s", job.job_id,
                 answer.status or "?")  # fmt: skip
        return False
    return True


def next_go(
    job: JobState, gate: StartGate, shipping: JobShipping
) -> tuple[Start, Assignment] | None:
    """Wait enqueued, the build kept, for the go of an attempt after the one that ran, and turn
    ``job`` (and its shipping) to that attempt; None when the job ends meanwhile (the user's
    stop, a terminal status)."""
    ran = job.attempt
    for stale in (job.dirs.exit_code_file, job.dirs.shim_pid_file,
                  job.dirs.sandbox_pid_file):  # not the next's  # fmt: skip
        stale.unlink(missing_ok=True)
    log.info("job %s: preempted, waiting for its accelerators again", job.job_id)
    go: tuple[Start, Assignment] | None = None
    with job.changed:
        while go is None and not job.stopping.is_set():
            latest = job.assignment
            if latest.status not in ON_ITS_WAY:
                log.info("job %s: not run again, the job is %s", job.job_id, latest.status)
                return None
            start = gate.start_from(latest.status, latest.accelerators, latest.rendezvous)
            if start is not None and runs_again(latest, ran):
                go = (start, latest)
            else:
                job.changed.wait(1.0)
    if go is None:
        shipping.stopped_before_running()
        return None
    job.next_attempt(go[1].attempt)
    shipping.dirs = job.dirs
    return go
