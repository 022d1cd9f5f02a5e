"""When a round may explain new jobs as the last plan explained their like, without a plan of
its own (:mod:`api.scheduling.arrivals`), and when it must plan."""

from __future__ import annotations

from typing import Any

from api.scheduling.arrivals import Arrivals
from domain.policy import Plan, Queued
from domain.scheduling import Assign, NodeCapacity, Wait

FULL = Wait("waits for its turn: the live node big enough has a full line")
OFFLINE = Wait("waits for 2 live nodes with 1 accelerator; 1 of the 2 registered are live")
NODE = NodeCapacity("n1", "gpu-1", 8, 0, True, "127.0.0.1")


class Submitted:  # an event's class, as the projector's listeners see it
    __qualname__ = "TrainingJob.Submitted"


class Started:
    __qualname__ = "TrainingJob.Started"


def queued(job_id: str, owner: str = "alice", accels: int = 1, nodes: int = 1,
           priority: int = 1, waited_s: float = 1.0) -> Queued:  # fmt: skip
    return Queued(job_id, owner, accels, nodes, priority, 0.0, waited_s)


def row(job_id: str, accels: int = 1, nodes: int = 1) -> dict[str, Any]:
    return {"id": job_id, "accels": accels, "nodes": nodes}


def planned(decisions: dict[str, Any], queue: list[Queued], took: float = 1.0,
            quotas: dict[str, int] | None = None) -> Arrivals:  # fmt: skip
    arrivals = Arrivals()
    arrivals.planning()
    decided = Plan(decisions, tuple(decisions), (), dict.fromkeys(decisions, ""))
    arrivals.planned([job.job_id for job in queue], queue, decided, quotas or {}, 60.0, took)
    return arrivals


STATIC = {"new": ("alice", 1, False), "b": ("bob", 1, False)}


def test_a_new_job_of_a_shape_that_waited_waits_for_the_same_reason() -> None:
    arrivals = planned({"a": FULL, "b": OFFLINE}, [queued("a"), queued("b", nodes=2)])
    rows = {"a": row("a"), "b": row("b", nodes=2), "new": row("new")}
    arrivals.on_events([Submitted()])
    explained = arrivals.explain({"new", "claim-of-its-name"}, rows, STATIC, {})
    assert explained is not None and explained["new"]["reason"] == FULL.reason
    assert "place" not in explained["new"]
    assert arrivals.explain({"new"}, rows, STATIC, {}) is None  # now in the line: it changed


def test_a_round_plans_for_anything_else() -> None:
    queue = [queued("a"), queued("b", nodes=2)]
    rows = {"a": row("a"), "b": row("b", nodes=2), "new": row("new", accels=2)}
    waits = {"a": FULL, "b": OFFLINE}
    assert planned(waits, queue).explain({"new"}, rows, STATIC, {}) is None  # a new shape
    assert planned(waits, queue, took=0.001).explain(set(), rows, STATIC, {}) is None  # short
    assert planned(waits, queue).explain(None, rows, STATIC, {}) is None  # every job read
    rows["new"] = row("new")
    assert planned(waits, queue).explain({"new"}, rows, STATIC, {"alice": 4}) is None  # quota
    assert planned(waits, queue).explain({"a"}, rows, STATIC, {}) is None  # a waiting job
    assert planned(waits, queue).explain({"new"}, rows, {}, {}) is None  # its owner unknown
    placed = planned({"a": Assign((NODE,)), "b": OFFLINE}, queue)
    assert placed.explain({"new"}, rows, STATIC, {}) is None  # the last plan placed one
    other = planned(waits, queue)
    other.on_events([Submitted(), Started()])
    assert other.explain({"new"}, rows, STATIC, {}) is None  # another event came
    mixed = planned({"a": FULL, "c": OFFLINE}, [queued("a"), queued("c")])
    assert mixed.explain({"new"}, rows, STATIC, {}) is None  # its like waited for two reasons


def test_jobs_past_their_patience_or_under_a_quota_teach_nothing() -> None:
    queue = [queued("a", waited_s=100.0), queued("b", owner="bob")]
    arrivals = planned({"a": FULL, "b": FULL}, queue, quotas={"bob": 8})
    assert arrivals.explain({"new"}, {"new": row("new")}, STATIC, {"bob": 8}) is None
