"""Accelerators handed out by the ledger: never shared, never beyond a node's capacity, first
come first served on every node, and no job waits forever (hypothesis, on the aggregates)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.actors import agent, scheduler, user
from domain.allocation import UnitOfWork, place_key
from domain.job import TrainingJob
from domain.node import Node
from domain.statuses import Status

CAPACITIES = {"n0": 2, "n1": 4, "n2": 3}


class Fleet:
    """Nodes and jobs in memory, changed through the same unit of work the service uses."""

    def __init__(self) -> None:
        self.nodes = {
            str(Node.create_id(name)): Node.register(name, accels, "cpu", by=agent(name))
            for name, accels in CAPACITIES.items()
        }
        self.jobs: dict[UUID, TrainingJob] = {}
        self.started_while_earlier_waited: list[str] = []

    def work(self) -> UnitOfWork:
        return UnitOfWork(self.jobs.__getitem__, lambda node_id: self.nodes[str(node_id)])

    def submit(self, accels: int, node_ids: list[str]) -> TrainingJob:
        spec = {"repository_url": "/r", "entry_point": ["t.py"], "accels": accels,
                "nodes": len(node_ids)}  # fmt: skip
        job = TrainingJob.submit("alice", f"job-{len(self.jobs):03d}", spec, by=user("alice"))
        job.begin_scheduling(by=scheduler())
        nodes = [{"node_id": n, "node_name": self.nodes[n].name, "address": None}
                 for n in node_ids]  # fmt: skip
        job.assign(node_ids[0], nodes[0]["node_name"], by=scheduler(), nodes=nodes)
        self.jobs[job.id] = job
        return job

    def build(self, job: TrainingJob, index: int) -> None:
        if job.status != Status.BUILDING or job.placements[index]["built"]:
            return
        job.record_built(index, "c0ffee", None, by=agent("n"))
        self._watch(job, lambda work: work.try_start(job))

    def finish(self, job: TrainingJob) -> None:
        if job.status != Status.IN_PROGRESS:
            return
        node_ids = [p["node_id"] for p in job.placements]
        for index in range(len(job.placements)):
            if job.status == Status.IN_PROGRESS:
                job.finish(0, by=agent("n"), node_index=index)
        self._watch(job, lambda work: work.settle(job, node_ids))

    def stop(self, job: TrainingJob) -> None:
        if job.is_terminal:
            return
        node_ids = [p["node_id"] for p in job.placements]
        job.request_stop(by=user("alice"))
        job.confirm_stopped(by=scheduler())
        self._watch(job, lambda work: work.settle(job, node_ids))

    def _watch(self, job: TrainingJob, step: Any) -> None:
        """Run a step; note every job it started while an earlier one waited on its node."""
        lines = {node_id: dict(node.queue) for node_id, node in self.nodes.items()}
        running = {j.id for j in self.jobs.values() if j.status == Status.IN_PROGRESS}
        step(self.work())
        for started in self.jobs.values():
            if started.status != Status.IN_PROGRESS or started.id in running:
                continue
            for placement in started.placements:
                line = lines[placement["node_id"]]
                earlier = [j for j, key in line.items() if key < place_key(started)
                           and self.jobs[UUID(j)].status == Status.ENQUEUED]  # fmt: skip
                if earlier:
                    self.started_while_earlier_waited.append(started.name)

    def check(self) -> None:
        for node in self.nodes.values():
            held = [i for indices in node.allocations.values() for i in indices]
            assert len(held) == len(set(held)), f"{node.name} gave an index twice"
            assert all(0 <= i < node.accels for i in held), f"{node.name} beyond capacity"
        for job in self.jobs.values():
            holding = [n for n in self.nodes.values() if str(job.id) in n.allocations]
            if job.status in (Status.IN_PROGRESS, Status.STOP_IN_PROGRESS):
                assert {str(n.id) for n in holding} == {p["node_id"] for p in job.placements}
                for node in holding:
                    assert len(node.allocations[str(job.id)]) == job.spec["accels"]
                    index = next(i for i, p in enumerate(job.placements)
                                 if p["node_id"] == str(node.id))  # fmt: skip
                    assert job.placements[index]["accelerators"] == node.allocations[
                        str(job.id)]
            else:
                assert holding == [], f"{job.name} ({job.status}) still holds accelerators"
        assert self.started_while_earlier_waited == []


node_choice = st.lists(st.sampled_from(sorted(CAPACITIES)), min_size=1, max_size=2, unique=True)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_allocations_never_overlap_follow_the_line_and_every_job_starts_in_the_end(
    data: st.DataObject,
) -> None:
    fleet = Fleet()
    for _ in range(data.draw(st.integers(1, 25), label="steps")):
        action = data.draw(st.sampled_from(["submit", "build", "finish", "stop"]))
        jobs = list(fleet.jobs.values())
        if action == "submit" or not jobs:
            names = data.draw(node_choice, label="nodes")
            node_ids = [str(Node.create_id(name)) for name in names]
            most = min(CAPACITIES[name] for name in names)
            fleet.submit(data.draw(st.integers(1, most), label="accels"), node_ids)
        else:
            job = jobs[data.draw(st.integers(0, len(jobs) - 1), label="job")]
            if action == "build":
                fleet.build(job, data.draw(st.integers(0, len(job.placements) - 1)))
            elif action == "finish":
                fleet.finish(job)
            else:
                fleet.stop(job)
        fleet.check()
    # Liveness: once every build is done, finishing whatever runs lets every job through.
    for job in list(fleet.jobs.values()):
        for index in range(len(job.placements)):
            fleet.build(job, index)
        fleet.check()
    for _ in range(len(fleet.jobs) + 1):
        for job in list(fleet.jobs.values()):
            fleet.finish(job)
        fleet.check()
    assert {job.status for job in fleet.jobs.values()} <= {Status.SUCCEEDED, Status.STOPPED}
