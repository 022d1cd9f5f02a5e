"""The list and inspect views on each store: what they show, read-your-writes, exactly once."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from domain.actors import user
from domain.application import TrainingJobs
from domain.ids import checkpoint_id
from ledger.database import Database, open_database
from projections.projector import BATCH, Projector
from projections.queries import Queries

if TYPE_CHECKING:
    from tests.integration.conftest import Lifecycle

Replica = tuple[Projector, Queries]


@pytest.fixture
def open_views(database_url: str) -> Iterator[Callable[[TrainingJobs], Replica]]:
    """Opens the views of one replica (its own connections) over an application instance."""
    databases: list[Database] = []

    def open_one(app: TrainingJobs) -> Replica:
        database = open_database(database_url)
        databases.append(database)
        return Projector(app, database), Queries(database)

    yield open_one
    for database in databases:
        database.close()


@pytest.fixture
def views(lifecycle: Lifecycle, open_views: Callable[[TrainingJobs], Replica]) -> Replica:
    return open_views(lifecycle.app)


def statuses(queries: Queries, job_id: object) -> list[str]:
    document = queries.job(str(job_id))
    assert document is not None
    return [entry["status"] for entry in document["history"]]


# -- what the views show -------------------------------------------------------------------


def test_the_list_shows_the_owners_live_jobs_newest_first(
    lifecycle: Lifecycle, views: Replica
) -> None:
    projector, queries = views
    lifecycle.succeeded("first")
    lifecycle.building("second")
    lifecycle.submit("third")
    lifecycle.submit("someone-elses", owner="bob")
    projector.catch_up()
    rows = queries.list_jobs("alice")
    assert [(row["name"], row["status"]) for row in rows] == [
        ("third", "pending"),
        ("second", "building"),
        ("first", "succeeded"),
    ]
    assert rows[1]["node"] == "gpu-node-1"
    assert rows[2]["started_at"] is not None and rows[2]["ended_at"] is not None
    assert rows[0]["started_at"] is None and rows[0]["ended_at"] is None


def test_inspect_shows_the_node_commit_accelerators_and_every_event(
    lifecycle: Lifecycle, views: Replica
) -> None:
    projector, queries = views
    job_id = lifecycle.in_progress("resnet-50", accels=2)
    lifecycle.report(job_id, "exited", exit_code=0)
    projector.catch_up()
    document = queries.job_by_name("alice", "resnet-50")
    assert document is not None
    assert document["id"] == str(job_id)
    assert document["status"] == "succeeded"
    assert (document["node"], document["commit"]) == ("gpu-node-1", "c0ffee")
    assert document["accelerators"] == [0, 1]
    assert document["failure"] is None
    assert document["spec"]["entry_point"] == ["train.py", "--epochs", "1"]
    history = [(e["event"], e["status"], e["by"]["kind"]) for e in document["history"]]
    assert history == [
        ("Submitted", "pending", "user"),
        ("SchedulingStarted", "scheduling", "scheduler"),
        ("NodeAssigned", "building", "scheduler"),
        ("Built", "building", "agent"),
        ("Started", "in progress", "scheduler"),
        ("Succeeded", "succeeded", "agent"),
    ]
    assert document["history"][4]["facts"]["accelerators"] == [0, 1]
    assert document["started_at"] == document["history"][4]["at"]
    assert document["ended_at"] == document["history"][5]["at"]
    assert document["placements"] == [{
        "index": 0, "node": "gpu-node-1", "node_id": lifecycle.node_id, "address": None,
        "built": True, "accelerators": [0, 1], "exit_code": 0,
    }]  # fmt: skip


def test_inspect_of_a_failed_build_says_why(lifecycle: Lifecycle, views: Replica) -> None:
    projector, queries = views
    job_id = lifecycle.building("resnet-50")
    message = "revision 'v9' was not found in the repository"
    lifecycle.report(job_id, "build_failed", code="revision_not_found", message=message,
                     commit=None)  # fmt: skip
    projector.catch_up()
    document = queries.job(str(job_id))
    assert document is not None
    assert document["status"] == "failed"
    assert document["failure"] == {"code": "revision_not_found", "message": message, "kind": "user"}


def test_inspect_of_a_failed_run_gives_the_exit_code(lifecycle: Lifecycle, views: Replica) -> None:
    projector, queries = views
    job_id = lifecycle.in_progress("resnet-50")
    lifecycle.report(job_id, "exited", exit_code=3)
    projector.catch_up()
    document = queries.job(str(job_id))
    assert document is not None
    assert document["failure"]["code"] == "entry_point_failed"
    assert "exited with code 3" in document["failure"]["message"]


def test_a_job_stopped_while_enqueued_shows_no_accelerators_were_allocated(
    lifecycle: Lifecycle, views: Replica
) -> None:
    projector, queries = views
    lifecycle.in_progress("holds-all", accels=8)
    job_id = lifecycle.building("resnet-50")
    lifecycle.report(job_id, "built", commit="c0ffee")
    assert lifecycle.app.job(job_id).status == "enqueued"
    lifecycle.app.request_stop(job_id, by=user("alice"))
    lifecycle.report(job_id, "stopped")
    projector.catch_up()
    document = queries.job(str(job_id))
    assert document is not None
    assert document["status"] == "stopped"
    assert document["stop"]["from_status"] == "enqueued"
    assert document["stop"]["accelerators_allocated"] is False
    assert statuses(queries, job_id)[-2:] == ["stop in progress", "stopped"]


def test_a_job_stopped_while_in_progress_shows_its_accelerators_were_released(
    lifecycle: Lifecycle, views: Replica
) -> None:
    projector, queries = views
    lifecycle.in_progress("first-four", accels=4)
    job_id = lifecycle.in_progress("resnet-50", accels=2)
    lifecycle.app.request_stop(job_id, by=user("alice"))
    lifecycle.report(job_id, "stopped")
    projector.catch_up()
    document = queries.job(str(job_id))
    assert document is not None
    assert document["stop"]["from_status"] == "in progress"
    assert document["stop"]["accelerators_allocated"] is True
    assert document["stop"]["accelerators_released"] == [4, 5]
    assert document["accelerators"] == []


def test_a_stop_that_failed_shows_who_asked_the_accelerators_it_held_and_why(
    lifecycle: Lifecycle, views: Replica
) -> None:
    projector, queries = views
    job_id = lifecycle.in_progress("resnet-50", accels=2)
    lifecycle.app.request_stop(job_id, by=user("alice"))
    lifecycle.report(job_id, "stop_failed", message="1 process survived SIGKILL: pid 42")
    projector.catch_up()
    document = queries.job(str(job_id))
    assert document is not None and document["status"] == "stop failed"
    assert document["stop"]["requested_by"] == {"kind": "user", "id": "alice"}
    assert document["stop"]["accelerators_allocated"] is True
    assert document["stop"]["reason"] == "1 process survived SIGKILL: pid 42"


def test_a_checkpoint_is_listed_and_leaves_the_status_as_it_was(
    lifecycle: Lifecycle, views: Replica
) -> None:
    projector, queries = views
    job_id = lifecycle.in_progress("resnet-50")
    checkpoint = {"id": checkpoint_id(job_id, "checkpoint-500"), "name": "checkpoint-500",
                  "node": "gpu-node-1", "size": 2048, "step": 500, "train_loss": 0.25,
                  "inference_ready": True}  # fmt: skip
    lifecycle.app.record_checkpoint(job_id, lifecycle.node_id, checkpoint)
    projector.catch_up()
    [row] = queries.checkpoints(str(job_id))
    assert (row["name"], row["step"], row["train_loss"], row["size"]) == (
        "checkpoint-500", 500, 0.25, 2048,
    )  # fmt: skip
    assert row["inference_ready"]
    assert statuses(queries, job_id)[-1] == "in progress"


def test_a_deleted_job_leaves_the_list_but_stays_findable_by_its_name_for_audit(
    lifecycle: Lifecycle, views: Replica
) -> None:
    projector, queries = views
    first = lifecycle.succeeded("resnet-50")
    lifecycle.app.delete(first, by=user("alice"))
    projector.catch_up()
    assert queries.list_jobs("alice") == []
    assert queries.job_by_name("alice", "resnet-50") is None
    [audit] = queries.jobs_ever_named("alice", "resnet-50")
    assert audit["id"] == str(first)
    assert audit["status"] == "succeeded" and audit["deleted_at"] is not None

    second = lifecycle.submit("resnet-50")
    projector.catch_up()
    assert [row["id"] for row in queries.list_jobs("alice")] == [str(second)]
    ever = queries.jobs_ever_named("alice", "resnet-50")
    assert [row["id"] for row in ever] == [str(first), str(second)]
    assert ever[1]["deleted_at"] is None


# -- read-your-writes and exactly once -----------------------------------------------------


def a_job_straddles_a_batch_boundary(app: TrainingJobs) -> bool:
    """Whether some job has events on both sides of a projector batch boundary."""
    positions: dict[object, list[int]] = {}
    for notification in app.recorder.select_notifications(start=1, limit=10_000):
        positions.setdefault(notification.originator_id, []).append(notification.id)
    return any(
        min(ids) <= boundary < max(ids)
        for ids in positions.values()
        for boundary in range(BATCH, max(ids), BATCH)
    )


def test_after_waiting_for_a_commands_position_another_replicas_view_shows_it(
    lifecycle: Lifecycle,
    open_app: Callable[[], TrainingJobs],
    open_views: Callable[[TrainingJobs], Replica],
) -> None:
    projector, queries = open_views(open_app())  # a replica that did not write
    job_id = lifecycle.submit("resnet-50")
    steps = [
        (lambda: lifecycle.app.begin_scheduling(job_id), "scheduling"),
        (lambda: lifecycle.app.assign(job_id, lifecycle.node_id, "gpu-node-1"), "building"),
        (lambda: lifecycle.report(job_id, "built", commit="c0ffee"), "in progress"),
        (lambda: lifecycle.app.request_stop(job_id, by=user("alice")), "stop in progress"),
        (lambda: lifecycle.report(job_id, "stopped"), "stopped"),
    ]  # fmt: skip
    for command, status in steps:
        outcome = command()
        projector.wait(outcome.position, timeout=10)
        [row] = queries.list_jobs("alice")
        assert row["status"] == status
    projector.wait(None)  # nothing recorded: nothing to wait for


def test_two_replicas_catching_up_at_once_apply_each_event_exactly_once(
    lifecycle: Lifecycle,
    open_app: Callable[[], TrainingJobs],
    open_views: Callable[[TrainingJobs], Replica],
) -> None:
    replicas = [open_views(open_app()), open_views(open_app())]
    job_ids = [lifecycle.submit("waiting")]
    job_ids += [lifecycle.succeeded(f"job-{n}") for n in range(60)]
    assert a_job_straddles_a_batch_boundary(lifecycle.app)  # or a replay would hide doubles
    start, stop = threading.Barrier(len(replicas)), threading.Event()
    errors: list[Exception] = []

    def follow(projector: Projector) -> None:
        try:
            start.wait()
            while not stop.is_set():
                projector.catch_up()
        except Exception as error:  # surfaced by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=follow, args=(p,)) for p, _ in replicas]
    for thread in threads:
        thread.start()
    job_ids += [lifecycle.succeeded(f"late-{n}") for n in range(10)]  # written meanwhile
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    for projector, _ in replicas:
        projector.catch_up()

    end = lifecycle.app.recorder.max_notification_id()
    for projector, queries in replicas:
        assert projector.position() == end
        assert len(queries.list_jobs("alice")) == len(job_ids)
        for job_id in job_ids:
            ledger = [type(event).__name__ for event in lifecycle.app.history(job_id)]
            document = queries.job(str(job_id))
            assert document is not None
            assert [entry["event"] for entry in document["history"]] == ledger


def heard_by(projector: Projector) -> list[tuple[str, int]]:
    """What the projector's listeners are told, as (job or node id, version), in order."""
    heard: list[tuple[str, int]] = []
    projector.listeners.append(
        lambda events: heard.extend((str(e.originator_id), e.originator_version) for e in events)
    )
    return heard


def ledger_after(app: TrainingJobs, position: int) -> list[tuple[str, int]]:
    return [(str(n.originator_id), n.originator_version)
            for n in app.recorder.select_notifications(start=position + 1, limit=100_000)]


def test_a_replica_hears_of_events_another_replica_applied_to_the_shared_views(
    lifecycle: Lifecycle,
    open_app: Callable[[], TrainingJobs],
    open_views: Callable[[TrainingJobs], Replica],
) -> None:
    (first, _), (second, _) = open_views(open_app()), open_views(open_app())
    heard = heard_by(second)
    first.catch_up(), second.catch_up()
    heard.clear()
    start = lifecycle.app.recorder.max_notification_id() or 0
    job_id = lifecycle.succeeded("ends-elsewhere")
    first.catch_up()  # the other replica applies every event to the views first
    assert second.catch_up() == first.position()
    # ... and this one's listeners (its log followers, its waiting agents) hear of them.
    assert heard == ledger_after(lifecycle.app, start)
    assert (str(job_id), len(lifecycle.app.history(job_id))) in heard
    second.catch_up()
    assert heard == ledger_after(lifecycle.app, start)  # once each


def test_racing_replicas_each_hear_every_event_once_in_ledger_order(
    lifecycle: Lifecycle,
    open_app: Callable[[], TrainingJobs],
    open_views: Callable[[TrainingJobs], Replica],
) -> None:
    replicas = [open_views(open_app())[0] for _ in range(2)]
    heard = [heard_by(projector) for projector in replicas]
    for projector, theirs in zip(replicas, heard, strict=True):
        projector.catch_up()
        theirs.clear()
    start = lifecycle.app.recorder.max_notification_id() or 0
    stop = threading.Event()

    def follow(projector: Projector) -> None:
        while not stop.is_set():
            projector.catch_up()

    threads = [threading.Thread(target=follow, args=(p,)) for p in replicas]
    for thread in threads:
        thread.start()
    for n in range(40):
        lifecycle.succeeded(f"race-{n}")
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    for projector in replicas:
        projector.catch_up()
    expected = ledger_after(lifecycle.app, start)
    assert len(expected) > BATCH
    assert heard[0] == expected and heard[1] == expected
