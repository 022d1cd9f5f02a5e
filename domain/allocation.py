"""Accelerators handed out by the control plane, in the ledger: one unit of work per command.

A job starts when every node of it is built and each of those nodes can give it the
accelerators it asks for; the indices are taken from the :class:`~domain.node.Node`
aggregates and saved in the same transaction as the job's ``Started`` event, so two jobs never
hold the same index, even with several server replicas (the second save conflicts, is retried,
and sees the indices taken). A built job that cannot start yet is ``enqueued`` and lines up on
each of its nodes by its place key (submission time, then id): the same order on every node, so
a multi-node job never deadlocks with another, and a large job is never overtaken by a stream
of small ones that came later. When a job lets go of its nodes, the jobs waiting there are
started in that order, in the same transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from domain.actors import scheduler
from domain.job import TrainingJob
from domain.node import Node
from domain.statuses import Status

HOLDS_ACCELERATORS = frozenset({Status.IN_PROGRESS, Status.STOP_IN_PROGRESS})


LINE_RANKS = "cba"
"""A place key's first letter by priority rank: high jobs (``a``) go before normal ones before
low ones; keys written before priorities (a bare time) go before them all."""


def place_key(job: TrainingJob) -> str:
    """A job's place in every node's line: its priority, its submission time, then its id."""
    return f"{LINE_RANKS[job.job_spec.rank]}/{job.created_on.isoformat()}/{job.id}"


class UnitOfWork:
    """The aggregates one command loads and changes, each loaded once, saved together."""

    def __init__(
        self, load_job: Callable[[UUID], TrainingJob], load_node: Callable[[UUID], Node]
    ) -> None:
        self._load_job = load_job
        self._load_node = load_node
        self.jobs: dict[UUID, TrainingJob] = {}
        self.nodes: dict[str, Node] = {}

    def job(self, job_id: UUID) -> TrainingJob:
        if job_id not in self.jobs:
            self.jobs[job_id] = self._load_job(job_id)
        return self.jobs[job_id]

    def node(self, node_id: str) -> Node:
        if node_id not in self.nodes:
            self.nodes[node_id] = self._load_node(UUID(node_id))
        return self.nodes[node_id]

    def aggregates(self) -> list[Any]:
        return [*self.jobs.values(), *self.nodes.values()]

    # -- starting --------------------------------------------------------------------------

    def try_start(self, job: TrainingJob) -> bool:
        """Start a built job whose nodes can all give it their accelerators now; else line it
        up (``enqueued``) on its nodes. True when it started."""
        if job.status not in (Status.BUILDING, Status.ENQUEUED) or not job.all_built:
            return False
        job_id, place = str(job.id), place_key(job)
        accels = job.job_spec.accels
        nodes = [self.node(placement["node_id"]) for placement in job.placements]
        # Its place where it is in line already (a key written before priorities keeps it).
        places = [node.queue.get(job_id, place) for node in nodes]
        busy = [node.name for node, at in zip(nodes, places, strict=True)
                if not node.can_allocate(job_id, accels, at)]  # fmt: skip
        if not busy:
            allocations = [node.allocate(job_id, accels, at, by=scheduler())
                           for node, at in zip(nodes, places, strict=True)]  # fmt: skip
            job.start(job.commit, allocations[0], by=scheduler(), allocations=allocations)
            return True
        if job.status == Status.BUILDING:
            job.enqueue(job.commit, by=scheduler(), waiting_on=busy)
        for node in nodes:
            node.enqueue(job_id, place, by=scheduler())
        return False

    # -- letting go ------------------------------------------------------------------------

    def settle(self, job: TrainingJob, node_ids: list[str]) -> None:
        """After a command on ``job`` (which was placed on ``node_ids`` before it): free the
        accelerators and places in line it no longer needs, and start who waited for them."""
        job_id = str(job.id)
        freed: list[Node] = []
        for node_id in dict.fromkeys(node_ids):
            node = self.node(node_id)
            released = job.status not in HOLDS_ACCELERATORS and node.release(job_id, scheduler())
            left = job.status != Status.ENQUEUED and job_id in node.queue
            if left:
                node.dequeue(job_id, by=scheduler())
            elif job.status == Status.ENQUEUED:  # preempted: back in line where it built
                node.enqueue(job_id, place_key(job), by=scheduler())
            if released or left:
                freed.append(node)
        for node in freed:
            self.dispatch(node)

    def dispatch(self, node: Node) -> None:
        """Start the jobs waiting for ``node``, oldest first, while they can start."""
        for job_id in node.ahead_of("", "\U0010ffff"):
            job = self.job(UUID(job_id))
            if job.status != Status.ENQUEUED:  # a stale place in line: the job went on
                node.dequeue(job_id, by=scheduler())
                continue
            if not self.try_start(job):
                return
