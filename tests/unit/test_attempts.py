"""A job's attempts in the aggregate: preemption, retries on a lost node or an exit code, and a
user's stop that wins over either; the order of a node's line by priority."""

from __future__ import annotations

from typing import Any

import pytest

from domain.actors import agent, scheduler, user
from domain.allocation import place_key
from domain.errors import DomainError, IllegalTransition
from domain.job import TrainingJob
from domain.reports import apply_report
from domain.statuses import Status

NODE = agent("gpu-node-1")


def running(**spec: Any) -> TrainingJob:
    job = TrainingJob.submit(
        owner="alice", name="job",
        spec={"repository_url": "https://example.com/r.git", "entry_point": ["train.py"],
              "accels": 1, "nodes": 1, **spec},
        by=user("alice"),
    )  # fmt: skip
    job.begin_scheduling(scheduler())
    job.assign("node-1", "gpu-node-1", by=scheduler())
    job.record_built(0, "c0ffee", None, by=NODE)
    job.start("c0ffee", [0], by=scheduler())
    return job


def report(job: TrainingJob, kind: str, **facts: Any) -> bool:
    return apply_report(job, kind, {"type": kind, **facts}, NODE, 0)


def test_a_preempted_job_waits_in_line_again_with_its_build_and_one_attempt_more() -> None:
    job = running(priority="low")
    assert job.request_preemption("urgent", "bob", by=scheduler())
    assert not job.request_preemption("urgent", "bob", by=scheduler())  # asked once
    assert job.status == Status.IN_PROGRESS and job.preemption == {"for_job": "urgent",
                                                                  "for_owner": "bob"}
    assert report(job, "stopped", exit_code=143)
    assert (job.status, job.attempt, job.all_built) == (Status.ENQUEUED, 2, True)
    assert job.accelerators == [] and job.preemption is None
    assert not report(job, "stopped", exit_code=143)  # a resend of the node's confirmation
    job.start("c0ffee", [1], by=scheduler())
    assert job.status == Status.IN_PROGRESS and job.accelerators == [1]


def test_a_users_stop_wins_over_a_preemption_under_way() -> None:
    job = running(priority="low")
    job.request_preemption("urgent", "bob", by=scheduler())
    job.request_stop(by=user("alice"))
    assert report(job, "stopped", exit_code=143)
    assert job.status == Status.STOPPED and job.attempt == 1


def test_only_a_preemptible_job_is_preempted_and_only_while_it_runs() -> None:
    with pytest.raises(DomainError, match="not preemptible .*--preemptible"):
        running().request_preemption("urgent", "bob", by=scheduler())
    assert running(priority="high", preemptible=True).request_preemption(
        "urgent", "bob", by=scheduler())
    with pytest.raises(DomainError, match="was not asked to make way"):
        running(priority="low").yield_node(by=NODE)
    job = running(priority="low")
    job.finish(0, by=NODE)
    with pytest.raises(DomainError, match="only a running job is preempted"):
        job.request_preemption("urgent", "bob", by=scheduler())


def test_an_exit_code_the_job_retries_on_sends_it_back_to_scheduling_until_retries_are_spent(
) -> None:  # fmt: skip
    job = running(max_retries=1, retry_on_exit_codes=[137])
    assert report(job, "exited", exit_code=137)
    assert (job.status, job.attempt, job.retries_left) == (Status.SCHEDULING, 2, 0)
    assert job.placements == [] and job.node_id is None
    job.assign("node-2", "gpu-node-2", by=scheduler())
    job.record_built(0, "c0ffee", None, by=agent("gpu-node-2"))
    job.start("c0ffee", [0], by=scheduler())
    assert apply_report(job, "exited", {"type": "exited", "exit_code": 137},
                        agent("gpu-node-2"), 0)  # fmt: skip
    assert job.status == Status.FAILED and job.failure is not None
    assert job.failure["code"] == "entry_point_failed"


def test_other_exit_codes_and_jobs_without_retries_fail_at_once() -> None:
    job = running(max_retries=2, retry_on_exit_codes=[137])
    report(job, "exited", exit_code=1)
    assert job.status == Status.FAILED
    job = running(retry_on_exit_codes=[137])  # no --max-retries: nothing to spend
    report(job, "exited", exit_code=137)
    assert job.status == Status.FAILED
    with pytest.raises(DomainError, match="has no retries left"):
        running().retry("node_lost", "node gpu-node-1 was lost", by=scheduler())


def test_a_retry_is_refused_outside_a_running_attempt() -> None:
    job = running(max_retries=1)
    job.finish(0, by=NODE)
    with pytest.raises(IllegalTransition):
        job.retry("node_lost", "node gpu-node-1 was lost", by=scheduler())


def test_a_nodes_line_puts_high_before_normal_before_low_and_keys_from_before_first() -> None:
    jobs = {priority: running(priority=priority) for priority in ("low", "normal", "high")}
    keys = {priority: place_key(job) for priority, job in jobs.items()}
    assert keys["high"] < keys["normal"] < keys["low"]
    older = f"{jobs['low'].created_on.isoformat()}/{jobs['low'].id}"  # a key from before
    assert older < keys["high"]
