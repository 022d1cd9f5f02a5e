"""Ledgers written in December 2026 (``tests/fixtures/ledger-2026-12.json``: every kind of
event of that time; ``ledger-2026-12-07.json`` adds retries, preemption, outputs, debug sessions
and purges, when a job's attempts' events were stored as ``JobAttempts.*``) are read by today's
code on each store: every job folds to the status it had, the views show it, and events of an
older shape are upcast."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from eventsourcing.persistence import StoredEvent

from api.ledger.verify import verify_ledger
from api.services import Services, build_services
from api.settings import Settings
from domain.actors import user
from domain.job import TrainingJob
from domain.node import Node
from tests.integration.test_rebuild_views import dump

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE = FIXTURES / "ledger-2026-12.json"
JOBS = {"ledger-2026-12.json": 10, "ledger-2026-12-07.json": 13}
"""Each fixture, and how many jobs it holds."""


def load_fixture(name: str = FIXTURE.name) -> dict[str, Any]:
    fixture: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return fixture


def import_ledger(services: Services, events: list[dict[str, Any]]) -> None:
    """The fixture's stored events, inserted as they were stored, in their order."""
    services.jobs.recorder.insert_events([
        StoredEvent(originator_id=UUID(event["originator_id"]),
                    originator_version=event["originator_version"], topic=event["topic"],
                    state=event["state"].encode())
        for event in events
    ])  # fmt: skip
    services.projector.catch_up()


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Any:
    opened = build_services(Settings(data_dir=tmp_path, database_url=database_url))
    yield opened
    opened.close()


@pytest.mark.parametrize("name", sorted(JOBS))
def test_every_job_of_the_stored_ledger_folds_to_its_status(services: Services, name: str) -> None:
    fixture = load_fixture(name)
    import_ledger(services, fixture["events"])
    assert len(fixture["statuses"]) == JOBS[name]
    for job_id, status in fixture["statuses"].items():
        job = services.jobs.job(UUID(job_id))
        assert str(job.status) == status, job.name
        shown = services.queries.job(job_id)
        assert shown is not None and shown["status"] == status
    verified = verify_ledger(services.ledger_parts())
    assert verified["view_differences"] == [], verified
    assert verified["events"] == len(fixture["events"])


def test_commands_go_on_from_the_stored_ledger(services: Services) -> None:
    fixture = load_fixture()
    import_ledger(services, fixture["events"])
    running = next(UUID(job_id) for job_id, status in fixture["statuses"].items()
                   if status == "in progress")  # fmt: skip
    services.jobs.request_stop(running, by=user("alice"))
    assert str(services.jobs.job(running).status) == "stop in progress"
    fresh = services.jobs.submit("alice", "after-upgrade", {
        "repository_url": "https://example.com/r.git", "entry_point": ["t.py"], "accels": 1,
        "nodes": 1}, by=user("alice"))  # fmt: skip
    assert services.jobs.job(fresh.job_id).name == "after-upgrade"


def test_a_started_event_of_version_1_is_upcast(services: Services) -> None:
    """Before multi-node jobs, ``Started`` held node 0's accelerators only (no
    ``allocations``): read today, each node's indices come from it."""
    fixture = load_fixture()
    events = fixture["events"]
    started = next(event for event in events if event["topic"].endswith("TrainingJob.Started"))
    state = json.loads(started["state"])
    state.pop("allocations")
    state.pop("class_version", None)
    started["state"] = json.dumps(state, separators=(",", ":"))
    import_ledger(services, events)
    job: TrainingJob = services.jobs.job(UUID(started["originator_id"]))
    assert job.placements[0]["accelerators"] == state["accelerators"]
    history = services.jobs.history(UUID(started["originator_id"]))
    [upcast] = [event for event in history if isinstance(event, TrainingJob.Started)]
    assert upcast.allocations == [state["accelerators"]]  # type: ignore[attr-defined]


def test_new_started_events_are_stored_as_version_2(services: Services) -> None:
    fixture = load_fixture()
    import_ledger(services, fixture["events"])
    recorder = services.jobs.recorder
    before = recorder.max_notification_id() or 0  # type: ignore[attr-defined]
    queued = next(UUID(job_id) for job_id, status in fixture["statuses"].items()
                  if status == "in progress")  # fmt: skip
    node = services.jobs.job(queued).node_id
    assert node is not None
    services.jobs.report(queued, node, {"node_id": node, "type": "exited", "exit_code": 0})
    new = recorder.select_notifications(before + 1, 100)  # type: ignore[attr-defined]
    started = [n for n in new if n.topic.endswith("TrainingJob.Started")]
    assert started, [n.topic for n in new]  # the waiting job started on the freed accelerators
    assert json.loads(bytes(started[0].state))["class_version"] == 2


def test_attempts_stored_under_their_old_class_load_and_new_ones_get_the_jobs_topic(
    services: Services,
) -> None:
    fixture = load_fixture("ledger-2026-12-07.json")
    import_ledger(services, fixture["events"])
    stored = {event["topic"] for event in fixture["events"]}
    assert "domain.job_attempts:JobAttempts.Retried" in stored
    retried = next(UUID(event["originator_id"]) for event in fixture["events"]
                   if event["topic"].endswith("JobAttempts.Retried"))  # fmt: skip
    job = services.jobs.job(retried)
    assert (job.attempt, job.retries_spent, str(job.status)) == (2, 1, "scheduling")
    assert any(isinstance(event, TrainingJob.Retried) for event in services.jobs.history(retried))
    assert services.queries.job(str(retried))["attempt"] == 2  # type: ignore[index]

    recorder = services.jobs.recorder
    before = recorder.max_notification_id() or 0  # type: ignore[attr-defined]
    node = str(Node.create_id("gpu-2"))  # idle since its job was requeued
    services.jobs.assign(retried, node, "gpu-2")
    services.jobs.report(retried, node, {"node_id": node, "type": "built", "commit": "c0ffee"})
    assert str(services.jobs.job(retried).status) == "in progress"
    services.jobs.node_lost(retried, node, "node gpu-2 lost")  # its second retry
    notifications = recorder.select_notifications(before + 1, 100)  # type: ignore[attr-defined]
    new = [notification.topic for notification in notifications]
    assert "domain.job:TrainingJob.Retried" in new
    assert not any(topic.startswith("domain.job_attempts:") for topic in new)


@pytest.mark.parametrize("name", sorted(JOBS))
def test_views_rebuilt_from_the_stored_ledger_equal_the_live_ones(
    services: Services, name: str
) -> None:
    """Every stored spec, whatever fields its day wrote, projects alike live and rebuilt."""
    fixture = load_fixture(name)
    import_ledger(services, fixture["events"])
    before = dump(services)
    assert len(before["job_list"]) == JOBS[name]
    assert services.rebuilder is not None
    progress = services.rebuilder.run()
    assert progress.state == "done", progress.error
    assert dump(services) == before
    verified = verify_ledger(services.ledger_parts(), artifacts="none")
    assert verified["view_differences"] == [], verified
