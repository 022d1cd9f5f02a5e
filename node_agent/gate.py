"""Where a job built on this node waits for the control plane's go.

After the build the node reports ``built``; the control plane starts the job once every node of
it has built and their accelerators are free, either in its answer or, later, in an assignment
that lists the job ``in progress`` with this node's accelerators (:meth:`JobState.update`).
Node 0 of a multi-node job picks the port its nodes meet at, and says it with ``built``. The
go's accelerators are then claimed from this node's pool.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from node_agent.accelerators import AcceleratorPool
from node_agent.build.builder import BuiltJob
from node_agent.jobstate import JobState
from node_agent.models import BUILDING, ENQUEUED, IN_PROGRESS, STOP_IN_PROGRESS, Rendezvous
from node_agent.network import free_port
from node_agent.reports import JobReporter
from node_agent.shipping import JobShipping

log = logging.getLogger("flexai.agent")

CLAIM_PATIENCE = 60.0
"""How long a job waits for an accelerator still held by a job this agent is ending."""
ON_ITS_WAY = (None, BUILDING, ENQUEUED, IN_PROGRESS, STOP_IN_PROGRESS)
"""What the job may be after ``built``; anything else (another node failed it) ends it here."""


@dataclass(frozen=True)
class Start:
    """The control plane's go: this node's accelerators, and a multi-node job's rendezvous."""

    accelerators: tuple[int, ...]
    rendezvous: Rendezvous | None


class StartGate:
    """The wait of one job, built here, for the go of the control plane; a stop during it is
    reported ``stopped`` (no entry point ran)."""

    def __init__(
        self,
        job: JobState,
        reporter: JobReporter,
        shipping: JobShipping,
        pool: AcceleratorPool,
        address: str,
    ) -> None:
        self.job = job
        self.reporter = reporter
        self.shipping = shipping
        self.pool = pool
        self.address = address
        """How the job's other nodes reach this one."""
        self._master_port: int | None = None  # node 0 of a multi-node job: the port it chose

    def after_build(self, built: BuiltJob) -> Start | None:
        """Report ``built``; the go, at once or once an assignment gives it; None: stopped."""
        job = self.job
        if job.assignment.nnodes > 1 and job.assignment.node_index == 0:
            self._master_port = free_port(self.address)
        answer = self.reporter.built(built.commit, self._master_port, built.image_digest)
        if answer.status == STOP_IN_PROGRESS:
            job.stopping.set()
        if not answer.accepted or answer.status not in ON_ITS_WAY:
            if job.stopping.is_set():
                self.shipping.stopped_before_running()
            elif not answer.unreachable:
                log.warning("job %s: not started, the job is %s", job.job_id, answer.status)
            return None
        with job.changed:
            start = self.start_from(answer.status, answer.accelerators, answer.rendezvous)
        return start or self._wait(answer.status)

    def _wait(self, status: str | None) -> Start | None:
        job = self.job
        if status == BUILDING:
            waiting_for = "the job's other nodes to build"
        else:
            count = job.assignment.spec.accels
            waiting_for = f"{count} accelerator{'s' if count != 1 else ''} to be free"
        log.info("job %s: built, waiting for %s", job.job_id, waiting_for)
        self.shipping.say(f"[agent] built; waiting for {waiting_for}")
        with job.changed:
            while not job.stopping.is_set():
                latest = job.assignment
                start = self.start_from(latest.status, latest.accelerators, latest.rendezvous)
                if start is not None:
                    return start
                job.changed.wait(1.0)
        self.shipping.stopped_before_running()
        return None

    def start_from(
        self,
        status: str | None,
        accelerators: tuple[int, ...] | None,
        rendezvous: Rendezvous | None,
    ) -> Start | None:
        """The go, if the control plane gave it (call with the job's ``changed`` held)."""
        if status != IN_PROGRESS or accelerators is None:
            return None
        assignment = self.job.assignment
        if assignment.nnodes <= 1:
            return Start(accelerators, None)
        rendezvous = rendezvous or assignment.rendezvous
        if rendezvous is None and self._master_port is not None:  # node 0 knows its own
            rendezvous = Rendezvous(self.address, self._master_port)
        return Start(accelerators, rendezvous) if rendezvous is not None else None

    def claim(self, accelerators: Sequence[int]) -> bool:
        """Hold the accelerators the control plane allocated, unless something here still
        holds one of them (processes that would not die): then the job fails, not started."""
        job = self.job
        holder = self.pool.claim(
            job.job_id, accelerators, patience=CLAIM_PATIENCE, cancel=job.stopping
        )
        if holder is None:
            return True
        if job.stopping.is_set():
            self.shipping.stopped_before_running()
            return False
        message = f"{holder}; the job was not started on this node"
        log.error("job %s: %s", job.job_id, message)
        self.shipping.failed("node_lost", message, started=True)
        return False
