"""A fleet in the ledger (each store): the control plane hands out accelerator indices, lines
waiting jobs up first come first served, runs multi-node jobs, and tells node loss truthfully."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any
from uuid import UUID

import pytest

from domain.actors import user
from domain.application import TrainingJobs
from domain.errors import IllegalTransition
from domain.node import Node
from tests.integration.conftest import Lifecycle, job_spec


def events(app: TrainingJobs, job_id: UUID) -> list[str]:
    return [type(event).__name__ for event in app.history(job_id)]


def node(app: TrainingJobs, node_id: str) -> Node:
    return app.node(UUID(node_id))


class Fleet(Lifecycle):
    """gpu-node-1 (8) and gpu-node-2 (8), plus small nodes for each test's needs."""

    def placed(self, name: str, accels: int, node_ids: list[str]) -> UUID:
        job_id = self.app.submit(self.owner, name, {**job_spec(accels), "nodes": len(node_ids)},
                                 by=user(self.owner)).job_id  # fmt: skip
        self.app.begin_scheduling(job_id)
        nodes = [{"node_id": n, "node_name": node(self.app, n).name, "address": "127.0.0.1"}
                 for n in node_ids]  # fmt: skip
        self.app.assign(job_id, node_ids[0], nodes[0]["node_name"], nodes=nodes)
        return job_id

    def from_node(self, job_id: UUID, node_id: str, index: int, kind: str, **facts: Any) -> Any:
        report = {"node_id": node_id, "node_index": index, "type": kind, **facts}
        return self.app.report(job_id, node_id, report)


@pytest.fixture
def fleet(app: TrainingJobs) -> Fleet:
    return Fleet(app)


def test_jobs_on_one_node_get_distinct_indices_and_a_waiting_one_starts_when_they_free(
    fleet: Fleet,
) -> None:
    small, _ = fleet.app.register_node("small", accels=3, accel_type="cpu")
    first = fleet.placed("first", 2, [small])
    second = fleet.placed("second", 1, [small])
    third = fleet.placed("third", 2, [small])
    for job_id in (first, second, third):
        fleet.from_node(job_id, small, 0, "built", commit="c0ffee")
    app = fleet.app
    assert (app.job(first).accelerators, app.job(second).accelerators) == ([0, 1], [2])
    assert app.job(third).status == "enqueued"
    assert node(app, small).queue.keys() == {str(third)}

    fleet.from_node(first, small, 0, "exited", exit_code=0)
    assert app.job(third).status == "in progress"
    assert app.job(third).accelerators == [0, 1]
    assert node(app, small).allocations == {str(second): [2], str(third): [0, 1]}
    assert node(app, small).queue == {}


def test_a_large_job_in_line_is_not_overtaken_by_smaller_ones_that_came_later(
    fleet: Fleet,
) -> None:
    small, _ = fleet.app.register_node("small", accels=2, accel_type="cpu")
    running = fleet.placed("running", 1, [small])
    large = fleet.placed("large", 2, [small])
    later = fleet.placed("later", 1, [small])
    fleet.from_node(running, small, 0, "built")
    fleet.from_node(large, small, 0, "built")
    fleet.from_node(later, small, 0, "built")  # one index is free, but "large" came first
    app = fleet.app
    assert (app.job(large).status, app.job(later).status) == ("enqueued", "enqueued")
    fleet.from_node(running, small, 0, "exited", exit_code=0)
    assert app.job(large).status == "in progress"
    assert app.job(later).status == "enqueued"
    fleet.from_node(large, small, 0, "exited", exit_code=0)
    assert app.job(later).status == "in progress"


def test_a_stopped_job_leaves_the_line_and_the_next_one_moves_up(fleet: Fleet) -> None:
    small, _ = fleet.app.register_node("small", accels=1, accel_type="cpu")
    running, waiting, next_one = (fleet.placed(name, 1, [small])
                                  for name in ("running", "waiting", "next-one"))  # fmt: skip
    for job_id in (running, waiting, next_one):
        fleet.from_node(job_id, small, 0, "built")
    fleet.app.request_stop(waiting, by=user("alice"))
    fleet.from_node(waiting, small, 0, "stopped")
    assert str(waiting) not in node(fleet.app, small).queue
    fleet.from_node(running, small, 0, "exited", exit_code=0)
    assert fleet.app.job(next_one).status == "in progress"


def test_a_multi_node_job_starts_once_every_node_is_built_with_indices_on_each(
    fleet: Fleet,
) -> None:
    nodes = [fleet.node_id, fleet.other_node_id]
    job_id = fleet.placed("two-nodes", 4, nodes)
    answer = fleet.from_node(job_id, nodes[0], 0, "built", commit="c0ffee", master_port=29500)
    assert answer.position is not None and fleet.app.job(job_id).status == "building"
    fleet.from_node(job_id, nodes[1], 1, "built", commit="c0ffee")
    job = fleet.app.job(job_id)
    assert job.status == "in progress" and job.master_port == 29500
    assert [p["accelerators"] for p in job.placements] == [[0, 1, 2, 3], [0, 1, 2, 3]]

    fleet.from_node(job_id, nodes[0], 0, "exited", exit_code=0)
    assert fleet.app.job(job_id).status == "in progress"  # node 1 still runs
    fleet.from_node(job_id, nodes[1], 1, "exited", exit_code=0)
    assert fleet.app.job(job_id).status == "succeeded"
    assert events(fleet.app, job_id)[-2:] == ["NodeExited", "Succeeded"]
    assert all(node(fleet.app, n).allocations == {} for n in nodes)


def test_a_multi_node_job_fails_as_one_node_fails_naming_it_and_late_reports_are_kept(
    fleet: Fleet,
) -> None:
    nodes = [fleet.node_id, fleet.other_node_id]
    job_id = fleet.placed("two-nodes", 1, nodes)
    fleet.from_node(job_id, nodes[0], 0, "built")
    fleet.from_node(job_id, nodes[1], 1, "built")
    fleet.from_node(job_id, nodes[1], 1, "exited", exit_code=3)
    job = fleet.app.job(job_id)
    assert job.status == "failed"
    assert job.failure == {
        "code": "entry_point_failed",
        "message": "the entry point exited with code 3 (node gpu-node-2, index 1)",
    }
    assert all(node(fleet.app, n).allocations == {} for n in nodes)
    for _ in range(2):  # node 0 ends too, and says so (twice: a resend)
        with pytest.raises(IllegalTransition):
            fleet.from_node(job_id, nodes[0], 0, "exited", exit_code=0)
    assert fleet.app.job(job_id).status == "failed"
    refused = [e for e in fleet.app.history(job_id) if type(e).__name__ == "ReportRefused"]
    assert len(refused) == 1
    assert (refused[0].report, refused[0].node_index) == ("exited", 0)  # type: ignore[attr-defined]
    assert refused[0].facts == {"exit_code": 0}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("reach", "status", "code"),
    [("in progress", "failed", "node_lost"), ("building", "scheduling", None),
     ("enqueued", "scheduling", None), ("stop in progress", "stop failed", "stop_failed")],
)  # fmt: skip
def test_a_lost_node_fails_or_requeues_its_jobs_truthfully(
    fleet: Fleet, reach: str, status: str, code: str | None
) -> None:
    small, _ = fleet.app.register_node("small", accels=1, accel_type="cpu")
    blocker = fleet.placed("blocker", 1, [small])
    fleet.from_node(blocker, small, 0, "built")
    job_id = fleet.placed("victim", 1, [small])
    if reach != "building":
        fleet.app.report(blocker, small, {"node_id": small, "type": "exited", "exit_code": 0})
        fleet.from_node(job_id, small, 0, "built")
        if reach == "enqueued":  # the victim runs; another job waits behind it
            other = fleet.placed("other", 1, [small])
            fleet.from_node(other, small, 0, "built")
            job_id = other
    if reach == "stop in progress":
        fleet.app.request_stop(job_id, by=user("alice"))
    assert fleet.app.job(job_id).status == reach

    message = "node small was lost: last heard of at 12:00, more than 30 s before 12:01"
    fleet.app.node_lost(job_id, small, message)
    job = fleet.app.job(job_id)
    assert job.status == status
    if code is not None:
        assert job.failure is not None and job.failure["code"] == code
        assert "node small was lost" in job.failure["message"]
    else:
        assert events(fleet.app, job_id)[-1] == "Requeued" and job.placements == []
    assert str(job_id) not in node(fleet.app, small).allocations
    assert str(job_id) not in node(fleet.app, small).queue


def test_two_replicas_never_give_one_index_to_two_jobs(
    open_app: Callable[[], TrainingJobs],
) -> None:
    replicas = [open_app(), open_app()]
    lifecycle = Fleet(replicas[0])
    tiny, _ = replicas[0].register_node("tiny", accels=1, accel_type="cpu")
    jobs = [lifecycle.placed(f"race-{n}", 1, [tiny]) for n in range(2)]
    barrier = threading.Barrier(2)

    def built(app: TrainingJobs, job_id: UUID) -> None:
        barrier.wait()
        app.report(job_id, tiny, {"node_id": tiny, "type": "built"})

    threads = [threading.Thread(target=built, args=(app, job_id))
               for app, job_id in zip(replicas, jobs, strict=True)]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = sorted(replicas[1].job(job_id).status for job_id in jobs)
    assert statuses == ["enqueued", "in progress"]
    assert list(node(replicas[1], tiny).allocations.values()) == [[0]]
