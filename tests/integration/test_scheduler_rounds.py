"""The scheduler's rounds against the real services (each store): placement, stops no node
confirms, jobs past their time limit that their node did not end, and node leases."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from api.scheduling import arrivals as arrivals_module
from api.scheduling import scheduler as scheduler_module
from api.scheduling.scheduler import REPLAN_EVERY_S, Scheduler
from api.services import Services, build_services
from api.settings import Settings
from domain.actors import user
from domain.statuses import Status
from tests.integration.conftest import job_spec


class Round:
    def __init__(self, services: Services) -> None:
        self.services = services
        self.scheduler = Scheduler(services.scheduling())
        self.node_id, _ = services.jobs.register_node("gpu-1", 2, "cpu", address="127.0.0.1")
        services.state.claim_node(self.node_id, "gpu-1", "agent-0123456789abcdef", 30)

    def run(self, heartbeat: bool = True) -> None:
        if heartbeat:  # the node's agent is alive
            self.services.state.heartbeat(self.node_id)
        self.scheduler._deadlines_at = 0  # every round checks deadlines here
        self.scheduler.run_once()

    def submit(self, name: str, **spec: Any) -> UUID:
        job = {**job_spec(), **spec}
        job_id = self.services.jobs.submit("alice", name, job, by=user("alice")).job_id
        self.services.projector.catch_up()  # as the submit route does
        return job_id

    def report(self, job_id: UUID, kind: str, **facts: Any) -> None:
        self.services.jobs.report(job_id, self.node_id,
                                  {"node_id": self.node_id, "type": kind, **facts})  # fmt: skip
        self.services.projector.catch_up()

    def status(self, job_id: UUID) -> str:
        self.services.projector.catch_up()
        document = self.services.queries.job(str(job_id))
        assert document is not None
        return str(document["status"])

    def document(self, job_id: UUID) -> dict[str, Any]:
        document = self.services.queries.job(str(job_id))
        assert document is not None
        return document


@pytest.fixture
def rounds(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Round]:
    # Every line here is short, however slow the machine (a loaded one took over 5 ms to plan
    # three jobs, and a joining job then had its like's reason without a place); the tests of
    # long lines set LONG_PLAN_S themselves.
    monkeypatch.setattr(arrivals_module, "LONG_PLAN_S", 60.0)
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url,
                        stop_confirm_timeout_s=0.3, node_timeout_s=0.5)  # fmt: skip
    services = build_services(settings)
    services.projector.catch_up()
    yield Round(services)
    services.close()


def test_a_round_places_a_job_and_a_built_one_runs_on_the_indices_it_was_given(
    rounds: Round,
) -> None:
    job_id = rounds.submit("placed")
    rounds.run()
    assert rounds.status(job_id) == "building"
    rounds.report(job_id, "built", commit="c0ffee")
    assert rounds.status(job_id) == "in progress"
    assert rounds.document(job_id)["placements"][0]["accelerators"] == [0]


def test_a_stop_no_node_confirms_fails_after_its_grace_and_the_timeout(rounds: Round) -> None:
    job_id = rounds.submit("unconfirmed", stop_grace_s=0)
    rounds.run()
    rounds.report(job_id, "built")
    rounds.services.jobs.request_stop(job_id, by=user("alice"))
    rounds.run()
    assert rounds.status(job_id) == "stop in progress"
    time.sleep(0.5)
    rounds.run()
    assert rounds.status(job_id) == "stop failed"
    failure = rounds.document(job_id)["failure"]
    assert "no node confirmed the stop within 0.3 s" in failure["message"]
    assert "may still run on gpu-1" in failure["message"]


def test_a_job_its_node_did_not_end_past_its_time_limit_fails_saying_so(rounds: Round) -> None:
    job_id = rounds.submit("overdue", time_limit_s=1, stop_grace_s=0)
    rounds.run()
    rounds.report(job_id, "built")
    rounds.run()
    assert rounds.status(job_id) == "in progress"
    time.sleep(1.5)
    rounds.run()
    assert rounds.status(job_id) == "failed"
    failure = rounds.document(job_id)["failure"]
    assert failure["code"] == "time_limit_exceeded"
    assert "time limit of 1s and its node did not end it" in failure["message"]


def test_a_node_silent_past_its_lease_loses_its_jobs_but_not_while_the_server_starts(
    rounds: Round,
) -> None:
    job_id = rounds.submit("on-a-silent-node")
    rounds.run()
    rounds.report(job_id, "built")
    time.sleep(0.7)  # the node falls silent; the server started as long ago
    rounds.scheduler.started_at = datetime.now(UTC)
    rounds.run(heartbeat=False)
    assert rounds.status(job_id) == "in progress"  # a server just up gives agents time
    rounds.scheduler.started_at = datetime.now(UTC) - timedelta(seconds=10)
    rounds.run(heartbeat=False)
    assert rounds.status(job_id) == "failed"
    failure = rounds.document(job_id)["failure"]
    assert failure["code"] == "node_lost"
    assert failure["message"].startswith("node gpu-1 was lost: last heard of at")


def test_jobs_that_wait_for_nodes_say_why_and_their_place_among_those_not_placed(
    rounds: Round,
) -> None:
    rounds.services.jobs.register_node("gpu-2", 2, "cpu")  # registered, never heard of
    first = rounds.submit("needs-two", nodes=2)
    second = rounds.submit("needs-two-too", nodes=2)
    rounds.run()
    rounds.run()
    assert (rounds.status(first), rounds.status(second)) == ("scheduling", "scheduling")
    waiting = rounds.services.waits.detail(str(second))
    assert waiting is not None
    assert waiting["reason"] == (
        "waits for 2 live nodes with 1 accelerator; 1 of the 2 registered are live"
    )
    nodes = {node["node"]: node["alive"] for node in waiting["nodes"]}
    assert nodes == {"gpu-1": True, "gpu-2": False}
    assert rounds.services.queries.place_in_scheduling(str(second)) == (2, 2)
    rounds.services.jobs.request_stop(first, by=user("alice"))
    rounds.run()
    assert rounds.services.queries.place_in_scheduling(str(second)) == (1, 1)


def test_jobs_enqueued_behind_one_another_on_a_node_say_how_many_are_ahead(
    rounds: Round,
) -> None:
    holder = rounds.submit("holds-the-node", accels=2)
    rounds.run()
    rounds.report(holder, "built", commit="c0ffee")
    first, second = rounds.submit("first-in-line", accels=1), rounds.submit("next", accels=1)
    rounds.run()
    for job_id in (first, second):
        rounds.report(job_id, "built", commit="c0ffee")
    rounds.run()
    assert [rounds.status(job) for job in (holder, first, second)] == [
        "in progress", "enqueued", "enqueued"
    ]  # fmt: skip
    waiting = rounds.services.waits.detail(str(second))
    assert waiting is not None
    assert waiting["place"] == 2
    assert waiting["reason"] == (
        "waits for 1 accelerator: gpu-1 has 0 of 2 free (held by holds-the-node), "
        "1 job(s) ahead in line"
    )


def test_one_round_places_as_many_jobs_as_the_node_has_room_for_each_once(rounds: Round) -> None:
    jobs = [rounds.submit(f"burst-{n}", accels=1) for n in range(5)]
    rounds.run()  # their saves go side by side: the room is counted as they are decided
    assert [rounds.status(job) for job in jobs] == ["building"] * 2 + ["scheduling"] * 3
    for job in jobs:
        names = [entry["event"] for entry in rounds.document(job)["history"]]
        assert names.count("NodeAssigned") == (1 if job in jobs[:2] else 0)
    rounds.run()  # no room came free: they wait, and say why
    assert [rounds.status(job) for job in jobs] == ["building"] * 2 + ["scheduling"] * 3
    waiting = rounds.services.waits.detail(str(jobs[-1]))
    assert waiting is not None and [node["node"] for node in waiting["nodes"]] == ["gpu-1"]


def test_a_job_joining_the_end_of_the_line_counts_in_everyones_place_but_rewrites_one_row(
    rounds: Round,
) -> None:
    rounds.services.jobs.register_node("gpu-2", 2, "cpu")  # registered, never heard of
    waiting = [rounds.submit(f"sweep-{n}", nodes=2) for n in range(3)]
    rounds.run()
    rounds.run()  # the first round begins their scheduling, the next places them
    first = rounds.services.waits.detail(str(waiting[0]))
    assert first is not None and (first["place"], first["of"]) == (1, 3)

    waiting.append(rounds.submit("sweep-3", nodes=2))
    rounds.run()
    rounds.run()
    again = rounds.services.waits.detail(str(waiting[0]))
    last = rounds.services.waits.detail(str(waiting[-1]))
    assert again is not None and (again["place"], again["of"]) == (1, 4)
    assert again["updated_at"] == first["updated_at"]  # its own row was not written again
    assert last is not None and (last["place"], last["of"]) == (4, 4)


def test_a_round_that_finds_nothing_changed_makes_no_new_plan_until_something_or_time_moves(
    rounds: Round, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines: list[int] = []  # each time a round plans: it takes the jobs waiting to be placed
    line = rounds.scheduler.line
    taken = line.rows

    def counted() -> dict[str, dict[str, Any]]:
        lines.append(1)
        return taken()

    monkeypatch.setattr(line, "rows", counted)
    rounds.services.jobs.register_node("gpu-2", 2, "cpu")  # registered, never heard of
    first = rounds.submit("needs-two", nodes=2)
    rounds.run()
    rounds.run()  # it begins scheduling, then waits
    planned = len(lines)
    rounds.run()
    rounds.run()
    assert len(lines) == planned  # nothing it reads changed: no new plan
    assert rounds.services.waits.detail(str(first)) is not None  # the last one's reasons stay

    second = rounds.submit("needs-two-too", nodes=2)  # a new job: the views moved
    rounds.run()
    rounds.run()
    assert len(lines) > planned
    assert rounds.services.queries.place_in_scheduling(str(second)) == (2, 2)

    rounds.services.identities.create_user("alice", admin=False, by="admin")
    rounds.services.identities.set_quota("alice", 1, by="admin")  # not in the ledger
    planned = len(lines)
    rounds.run()
    assert len(lines) == planned + 1
    reason = (rounds.services.waits.detail(str(first)) or {}).get("reason", "")
    assert reason.startswith("quota: alice runs 0 of 1 accelerators")  # the quota, at once

    planned = len(lines)
    time.sleep(REPLAN_EVERY_S)  # patience, fair share and preemption move with time alone
    time.sleep(max(rounds.scheduler._replan_at - time.monotonic(), 0))  # a slow plan: later
    rounds.run()
    assert len(lines) == planned + 1


def test_a_plan_that_takes_long_is_made_again_less_often_while_nothing_changes(
    rounds: Round, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long line's plan takes at most REPLAN_SHARE of the server's time when it is made only
    because time passed: here a plan of 20 ms is made again a second later, not half."""
    lines: list[float] = []
    line = rounds.scheduler.line
    taken = line.rows

    def slow() -> dict[str, dict[str, Any]]:
        lines.append(time.monotonic())
        time.sleep(0.02)
        return taken()

    monkeypatch.setattr(line, "rows", slow)
    monkeypatch.setattr(scheduler_module, "REPLAN_SHARE", 0.02)
    rounds.services.jobs.register_node("gpu-2", 2, "cpu")  # registered, never heard of
    rounds.submit("needs-two", nodes=2)  # it waits for two live nodes
    for _ in range(3):  # it begins scheduling, waits, and its reasons are written
        rounds.run()
    planned = len(lines)
    time.sleep(REPLAN_EVERY_S + 0.05)
    rounds.run()
    assert len(lines) == planned  # half a second passed, but the plan took 20 ms: not yet
    assert rounds.scheduler._replan_at - lines[-1] >= 1.0
    time.sleep(max(rounds.scheduler._replan_at - time.monotonic(), 0) + 0.01)
    rounds.run()
    assert len(lines) == planned + 1


def test_a_round_reads_again_only_the_waiting_jobs_that_changed_and_every_one_now_and_then(
    rounds: Round, monkeypatch: pytest.MonkeyPatch
) -> None:
    full: list[int] = []
    again: list[set[str]] = []
    queries = rounds.services.queries
    jobs_in, list_rows = queries.jobs_in, queries.list_rows

    def counted(statuses: list[Status]) -> list[dict[str, Any]]:
        full.extend([1] if Status.SCHEDULING in statuses else [])
        return jobs_in(statuses)

    def read_again(job_ids: Any) -> dict[str, dict[str, Any]]:
        again.append(set(job_ids))
        return list_rows(job_ids)

    monkeypatch.setattr(queries, "jobs_in", counted)
    monkeypatch.setattr(queries, "list_rows", read_again)
    rounds.services.jobs.register_node("gpu-2", 2, "cpu")  # registered, never heard of
    waiting = [rounds.submit(f"wide-{n}", nodes=2) for n in range(3)]
    rounds.run()
    rounds.run()  # they begin scheduling, then wait
    assert len(full) == 1  # the first round read them all
    assert [rounds.status(job) for job in waiting] == ["scheduling"] * 3

    rounds.services.jobs.request_stop(waiting[0], by=user("alice"))
    rounds.services.projector.catch_up()
    rounds.run()
    assert len(full) == 1 and again[-1] == {str(waiting[0])}  # that job alone, read again
    assert rounds.services.queries.place_in_scheduling(str(waiting[1])) == (1, 2)
    assert rounds.services.waits.detail(str(waiting[0])) is None  # it left the line

    rounds.scheduler.line._full_at = 0  # as FULL_READ_S after the last full read
    rounds.submit("wide-3", nodes=2)
    rounds.run()
    assert len(full) == 2


def test_jobs_that_only_join_a_long_line_are_explained_as_their_like_without_a_new_plan(
    rounds: Round, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arrivals_module, "LONG_PLAN_S", 0.0)  # every line counts as long
    plans: list[int] = []
    real_plan = scheduler_module.plan

    def counted(*args: Any, **kwargs: Any) -> Any:
        plans.append(1)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(scheduler_module, "plan", counted)
    waits, queries = rounds.services.waits, rounds.services.queries

    def joined(name: str, **spec: Any) -> str:
        job_id = str(rounds.submit(name, **spec))
        rounds.run()  # it begins scheduling
        rounds.run()  # it waits
        return job_id

    rounds.services.jobs.register_node("gpu-2", 2, "cpu")  # registered, never heard of
    first = joined("wide-1", nodes=2)  # it waits for two live nodes
    rounds.run()
    planned = len(plans)
    reason = (waits.detail(first) or {})["reason"]

    second = joined("wide-2", nodes=2)  # the same shape: no plan, the same reason
    assert len(plans) == planned
    detail = waits.detail(second)
    assert detail is not None and detail["reason"] == reason and "place" not in detail
    assert detail["asked"] == {"accels": 1, "nodes": 2}
    assert queries.place_in_scheduling(second) == (2, 2)  # inspect's place meanwhile
    assert (waits.detail(first) or {})["of"] == 2  # the line's length moved

    third = joined("wider", nodes=2, accels=2)  # another shape: a plan
    assert len(plans) == planned + 1
    assert [(waits.detail(job_id) or {}).get("place") for job_id in (first, second, third)] == [
        1, 2, 3]  # fmt: skip

    planned = len(plans)
    rounds.services.jobs.request_stop(UUID(first), by=user("alice"))  # another event: a plan
    rounds.services.projector.catch_up()
    rounds.run()
    assert len(plans) == planned + 1
    assert waits.detail(first) is None  # it left the line
    assert [(waits.detail(job_id) or {}).get("place") for job_id in (second, third)] == [1, 2]

    planned = len(plans)
    rounds.services.identities.create_user("bob", admin=False, by="admin")
    rounds.services.identities.set_quota("bob", 8, by="admin")  # the quotas changed: a plan
    joined("wide-5", nodes=2)
    assert len(plans) > planned


def test_a_short_line_is_planned_again_for_every_job_that_joins_it(
    rounds: Round, monkeypatch: pytest.MonkeyPatch
) -> None:
    plans: list[int] = []
    real_plan = scheduler_module.plan
    monkeypatch.setattr(scheduler_module, "plan",
                        lambda *args: plans.append(1) or real_plan(*args))  # fmt: skip
    rounds.services.jobs.register_node("gpu-2", 2, "cpu")
    rounds.submit("wide-1", nodes=2)
    for _ in range(3):
        rounds.run()
    planned = len(plans)
    second = str(rounds.submit("wide-2", nodes=2))
    rounds.run()
    rounds.run()
    assert len(plans) > planned  # a plan that took less than LONG_PLAN_S
    assert (rounds.services.waits.detail(second) or {}).get("place") == 2


def test_a_full_read_of_the_line_hands_each_row_that_did_not_change_as_the_same_object(
    rounds: Round,
) -> None:
    """The plan keeps what it read from a row while it is the same object: a full read of a
    long line (every 5 s) would otherwise make it read every waiting job again."""
    rounds.services.jobs.register_node("gpu-2", 2, "cpu")  # registered, never heard of
    waiting = [rounds.submit(f"wide-{index}", nodes=2) for index in range(3)]
    for _ in range(3):
        rounds.run()
    line = rounds.scheduler.line
    before = dict(line.rows())
    assert set(before) == {str(job_id) for job_id in waiting}
    rounds.services.jobs.request_stop(waiting[0], by=user("alice"))
    rounds.services.projector.catch_up()
    line.forget()  # the next read reads every waiting job
    after = line.rows()
    assert line.read_again is None
    assert set(after) == {str(job_id) for job_id in waiting[1:]}
    assert all(after[job_id] is before[job_id] for job_id in after)


def test_however_long_a_plan_takes_time_is_seen_within_replan_at_most_s(
    rounds: Round, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduler_module, "REPLAN_SHARE", 0.0001)  # a 1 ms plan: 10 s later...
    monkeypatch.setattr(scheduler_module, "REPLAN_AT_MOST_S", 0.6)  # ...but at most this
    rounds.services.jobs.register_node("gpu-2", 2, "cpu")
    rounds.submit("needs-two", nodes=2)
    started = time.monotonic()
    for _ in range(3):
        rounds.run()
    assert rounds.scheduler._replan_at - started <= 0.6 + (time.monotonic() - started)
