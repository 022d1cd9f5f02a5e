"""The application service on each store: unique names, idempotent reports, readable history."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from domain.actors import user
from domain.application import JobNotFound, Outcome, TrainingJobs
from domain.errors import DomainError, IllegalTransition, JobNotTerminal, NameTaken
from domain.reports import WrongNode

if TYPE_CHECKING:
    from tests.integration.conftest import Lifecycle


def submitted_names(app: TrainingJobs) -> list[str]:
    """The name of every job ever submitted, read from the ledger itself."""
    notifications = app.recorder.select_notifications(start=1, limit=10_000)
    events = [app.mapper.to_domain_event(n) for n in notifications]
    return [vars(e)["name"] for e in events if type(e).__qualname__ == "TrainingJob.Submitted"]


def event_names(app: TrainingJobs, job_id: Any) -> list[str]:
    return [type(event).__name__ for event in app.history(job_id)]


# -- names ---------------------------------------------------------------------------------


def test_a_second_job_with_a_live_name_is_refused(lifecycle: Lifecycle) -> None:
    first = lifecycle.submit("resnet-50")
    with pytest.raises(NameTaken) as refused:
        lifecycle.submit("resnet-50")
    assert "pick another name, or delete that job first" in str(refused.value)
    assert "`flexai training delete resnet-50`" in str(refused.value)
    assert submitted_names(lifecycle.app) == ["resnet-50"]
    assert lifecycle.app.job_id_for("alice", "resnet-50") == first


def test_the_same_name_is_free_for_another_owner(lifecycle: Lifecycle) -> None:
    lifecycle.submit("resnet-50")
    bob = lifecycle.submit("resnet-50", owner="bob")
    assert lifecycle.app.job_id_for("bob", "resnet-50") == bob


def test_a_deleted_jobs_name_is_free_again(lifecycle: Lifecycle) -> None:
    first = lifecycle.succeeded("resnet-50")
    lifecycle.app.delete(first, by=user("alice"))
    with pytest.raises(JobNotFound, match="named 'resnet-50'"):
        lifecycle.app.job_id_for("alice", "resnet-50")
    second = lifecycle.submit("resnet-50")
    assert second != first
    assert lifecycle.app.job_id_for("alice", "resnet-50") == second
    assert submitted_names(lifecycle.app) == ["resnet-50", "resnet-50"]


def submit_at_once(replicas: list[TrainingJobs], name: str) -> list[Outcome | Exception]:
    """Every replica submits a job named ``name`` at the same moment; what each got."""
    barrier = threading.Barrier(len(replicas))
    outcomes: list[Outcome | Exception] = []
    spec = {"repository_url": "/repo", "entry_point": ["train.py"], "accels": 1, "nodes": 1}

    def submit(replica: TrainingJobs) -> None:
        barrier.wait()
        try:
            outcomes.append(replica.submit("alice", name, spec, by=user("alice")))
        except Exception as error:  # collected and checked by the caller
            outcomes.append(error)

    threads = [threading.Thread(target=submit, args=(replica,)) for replica in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


def test_of_two_replicas_submitting_one_name_at_once_exactly_one_wins(
    open_app: Callable[[], TrainingJobs],
) -> None:
    replicas = [open_app(), open_app()]
    for round_ in range(5):
        name = f"race-{round_}"
        outcomes = submit_at_once(replicas, name)
        wins = [outcome for outcome in outcomes if isinstance(outcome, Outcome)]
        losses = [outcome for outcome in outcomes if not isinstance(outcome, Outcome)]
        assert len(wins) == 1, outcomes
        assert len(losses) == 1 and isinstance(losses[0], NameTaken), outcomes
        assert replicas[1].job_id_for("alice", name) == wins[0].job_id
        assert submitted_names(replicas[0]).count(name) == 1


def test_of_two_replicas_reusing_a_freed_name_at_once_exactly_one_wins(
    lifecycle: Lifecycle, open_app: Callable[[], TrainingJobs]
) -> None:
    replicas = [lifecycle.app, open_app()]
    replicas[0].delete(lifecycle.succeeded("resnet-50"), by=user("alice"))
    outcomes = submit_at_once(replicas, "resnet-50")
    wins = [outcome for outcome in outcomes if isinstance(outcome, Outcome)]
    assert len(wins) == 1, outcomes
    assert isinstance(next(o for o in outcomes if o not in wins), NameTaken), outcomes
    assert replicas[1].job_id_for("alice", "resnet-50") == wins[0].job_id
    assert submitted_names(replicas[0]).count("resnet-50") == 2


# -- agent reports -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("report", "facts"),
    [
        ("built", {"commit": "c0ffee"}),
        ("build_failed", {"code": "revision_not_found", "message": "no v9", "commit": None}),
    ],
)
def test_a_resent_build_report_records_nothing(
    lifecycle: Lifecycle, report: str, facts: dict[str, Any]
) -> None:
    job_id = lifecycle.building("resnet-50")
    first = lifecycle.report(job_id, report, **facts)
    assert first.position is not None
    history = event_names(lifecycle.app, job_id)
    again = lifecycle.report(job_id, report, **facts)
    assert again == Outcome(job_id, None)
    assert event_names(lifecycle.app, job_id) == history


def test_a_time_limits_failure_keeps_the_exit_code_its_entry_point_ended_with(
    lifecycle: Lifecycle,
) -> None:
    job_id = lifecycle.in_progress("resnet-50")
    lifecycle.report(job_id, "failed", code="time_limit_exceeded", message="ran past 1 h",
                     exit_code=143)  # fmt: skip
    job = lifecycle.app.job(job_id)
    assert job.failure == {"code": "time_limit_exceeded", "message": "ran past 1 h"}
    assert job.placements[0]["exit_code"] == 143
    with pytest.raises(DomainError, match="exit_code"):
        lifecycle.report(lifecycle.in_progress("vit"), "failed", code="time_limit_exceeded",
                         message="ran past 1 h", exit_code=1000)  # fmt: skip


@pytest.mark.parametrize(
    ("report", "facts", "status"),
    [
        ("exited", {"exit_code": 0}, "succeeded"),
        ("exited", {"exit_code": 3}, "failed"),
        ("failed", {"code": "time_limit_exceeded", "message": "ran past 1 h"}, "failed"),
        ("stopped", {}, "stopped"),
    ],
)
def test_a_resent_final_report_records_nothing(
    lifecycle: Lifecycle, report: str, facts: dict[str, Any], status: str
) -> None:
    job_id = lifecycle.in_progress("resnet-50")
    if report == "stopped":
        lifecycle.app.request_stop(job_id, by=user("alice"))
    lifecycle.report(job_id, report, **facts)
    history = event_names(lifecycle.app, job_id)
    end = lifecycle.app.recorder.max_notification_id()
    assert lifecycle.report(job_id, report, **facts).position is None
    assert lifecycle.app.job(job_id).status == status
    assert event_names(lifecycle.app, job_id) == history
    assert lifecycle.app.recorder.max_notification_id() == end


def test_a_report_that_contradicts_the_recorded_one_is_refused(lifecycle: Lifecycle) -> None:
    job_id = lifecycle.in_progress("resnet-50")
    lifecycle.report(job_id, "exited", exit_code=0)
    with pytest.raises(IllegalTransition, match="'succeeded' and cannot become 'failed'"):
        lifecycle.report(job_id, "exited", exit_code=1)
    assert lifecycle.app.job(job_id).status == "succeeded"


def test_a_report_from_a_node_the_job_is_not_assigned_to_is_refused(
    lifecycle: Lifecycle,
) -> None:
    job_id = lifecycle.building("resnet-50")
    history = event_names(lifecycle.app, job_id)
    other = lifecycle.other_node_id
    report = {"node_id": other, "type": "built", "commit": "c0ffee"}
    with pytest.raises(WrongNode, match="not assigned to node"):
        lifecycle.app.report(job_id, other, report)
    with pytest.raises(WrongNode):
        lifecycle.app.record_checkpoint(job_id, other, {"id": "ck-1", "name": "ck-1"})
    assert lifecycle.app.job(job_id).status == "building"
    assert event_names(lifecycle.app, job_id) == history


def test_an_agent_report_names_the_node_that_sent_it(lifecycle: Lifecycle) -> None:
    job_id = lifecycle.in_progress("resnet-50")
    *_, built, started = lifecycle.app.history(job_id)
    assert built.by == {"kind": "agent", "id": "gpu-node-1"}  # type: ignore[attr-defined]
    assert started.by == {"kind": "scheduler", "id": "scheduler"}  # type: ignore[attr-defined]


# -- stop and delete -----------------------------------------------------------------------


def test_a_job_no_node_holds_yet_stops_at_once(lifecycle: Lifecycle) -> None:
    job_id = lifecycle.submit("resnet-50")
    lifecycle.app.request_stop(job_id, by=user("alice"))
    assert lifecycle.app.job(job_id).status == "stopped"
    assert event_names(lifecycle.app, job_id)[-2:] == ["StopRequested", "Stopped"]


def test_a_job_on_a_node_waits_for_the_agent_to_stop_it(lifecycle: Lifecycle) -> None:
    lifecycle.in_progress("first", accels=2)
    job_id = lifecycle.in_progress("resnet-50", accels=2)
    lifecycle.app.request_stop(job_id, by=user("alice"))
    assert lifecycle.app.job(job_id).status == "stop in progress"
    lifecycle.report(job_id, "stopped")
    stopped = lifecycle.app.history(job_id)[-1]
    assert stopped.accelerators_released == [2, 3]  # type: ignore[attr-defined]


def test_deleting_a_running_job_is_refused_and_keeps_its_name(lifecycle: Lifecycle) -> None:
    job_id = lifecycle.in_progress("resnet-50")
    with pytest.raises(JobNotTerminal, match="stop it first"):
        lifecycle.app.delete(job_id, by=user("alice"))
    assert lifecycle.app.job_id_for("alice", "resnet-50") == job_id


def test_the_history_of_a_deleted_job_stays_readable(lifecycle: Lifecycle) -> None:
    job_id = lifecycle.succeeded("resnet-50")
    lifecycle.app.delete(job_id, by=user("alice"))
    assert event_names(lifecycle.app, job_id) == [
        "Submitted", "SchedulingStarted", "NodeAssigned", "Built", "Started", "Succeeded",
        "Deleted",
    ]  # fmt: skip
    assert lifecycle.app.history(job_id)[-1].by == {  # type: ignore[attr-defined]
        "kind": "user",
        "id": "alice",
    }
    assert lifecycle.app.job(job_id).deleted


def test_the_history_of_an_unknown_job_is_not_found(app: TrainingJobs) -> None:
    import uuid

    with pytest.raises(JobNotFound):
        app.history(uuid.uuid4())
