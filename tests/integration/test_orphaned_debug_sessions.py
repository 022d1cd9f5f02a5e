"""Debug sessions a dead server left open in the ledger (each store): a server that starts, and
the scheduling server every few seconds, closes those whose relay is not alive, or whose job
ended a while ago; `inspect` and `history` then show them closed, saying why."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from eventsourcing.persistence import StoredEvent
from fastapi.testclient import TestClient

from api.debug.orphans import ENDED_GRACE_S, OrphanSweep, close_orphaned_sessions
from api.http.app import create_app
from api.scheduling.scheduler import Scheduler
from api.services import Services, build_services
from api.settings import Settings
from cli.output.jobs import history_lines
from domain.actors import scheduler, user
from domain.events import event_facts, event_name
from projections.views import VIEW_TABLES
from tests.integration.conftest import Lifecycle
from tests.integration.test_server_presence import ServerProcess

FINGERPRINT = "SHA256:abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"
Servers = Callable[[], Services]


def session_id(number: int) -> str:
    return f"{number:032x}"


@pytest.fixture
def servers(database_url: str, tmp_path: Path) -> Iterator[Servers]:
    """Server processes' services on one database, each with its presence held."""
    built: list[Services] = []

    def server() -> Services:
        services = build_services(
            Settings(data_dir=tmp_path / f"data-{len(built)}", database_url=database_url)
        )
        services.presence.hold()
        built.append(services)
        return services

    yield server
    for services in built:
        services.close()


@pytest.fixture
def killed_relay(database_url: str, tmp_path: Path) -> str:
    """The instance id of a server process that held its presence, then was killed with -9."""
    server = ServerProcess(tmp_path / "killed", database_url)
    server.kill_9()
    return server.instance_id


def start(services: Services) -> None:
    """The server starts (its lifespan's start), then stops at once."""
    with TestClient(create_app(services, background=False)):
        pass


def sessions_of(services: Services, job_id: UUID) -> tuple[list[dict[str, Any]], list[str]]:
    """The job's closed sessions as `inspect` serves them, and the ids of those still open."""
    services.projector.catch_up()
    document = services.queries.job(str(job_id))
    assert document is not None
    closed = [entry for entry in document["history"] if entry["event"] == "DebugSessionClosed"]
    still_open = [row["id"] for row in services.queries.open_debug_sessions()
                  if row["job_id"] == str(job_id)]  # fmt: skip
    return closed, still_open


def test_a_session_whose_relay_was_killed_is_closed_when_a_server_starts(
    servers: Servers, killed_relay: str
) -> None:
    services = servers()
    job_id = Lifecycle(services.jobs).in_progress("debugged")
    services.jobs.open_debug_session(job_id, session_id(1), 0, FINGERPRINT, user("alice"),
                                     relay=killed_relay)  # fmt: skip
    start(services)

    [closed], still_open = sessions_of(services, job_id)
    assert still_open == []
    assert closed["facts"]["session_id"] == session_id(1)
    assert closed["facts"]["reason"].startswith("server_restarted: the server that relayed")
    assert closed["facts"]["seconds"] >= 0
    assert closed["by"] == scheduler() and closed["status"] == "in progress"
    shown = "\n".join(history_lines(services.queries.job(str(job_id))["history"]))  # type: ignore[index]
    assert "DebugSessionClosed  by scheduler" in shown and "reason=server_restarted:" in shown


def test_a_session_whose_relay_lives_stays_open(servers: Servers) -> None:
    relay = servers()  # another replica, alive, relays it
    job_id = Lifecycle(relay.jobs).in_progress("debugged")
    relay.jobs.open_debug_session(job_id, session_id(2), 0, FINGERPRINT, user("alice"),
                                  relay=relay.presence.instance_id)  # fmt: skip
    starting = servers()
    start(starting)
    assert close_orphaned_sessions(starting.orphans()) == 0
    assert sessions_of(starting, job_id) == ([], [session_id(2)])


@pytest.mark.parametrize("then", ["succeeded", "deleted"])
def test_a_session_of_a_job_that_ended_is_closed(
    servers: Servers, killed_relay: str, then: str
) -> None:
    services = servers()
    lifecycle = Lifecycle(services.jobs)
    job_id = lifecycle.in_progress("ended")
    services.jobs.open_debug_session(job_id, session_id(3), 0, FINGERPRINT, user("alice"),
                                     relay=killed_relay)  # fmt: skip
    lifecycle.report(job_id, "exited", exit_code=0)
    if then == "deleted":
        services.jobs.delete(job_id, by=user("alice"))
    start(services)
    [closed], still_open = sessions_of(services, job_id)
    assert still_open == []
    assert closed["status"] == "succeeded"
    assert closed["facts"]["reason"].startswith("server_restarted")
    assert not services.jobs.job(job_id).open_debug_sessions


def test_a_live_relays_session_of_a_job_ended_a_while_ago_is_closed_too(
    servers: Servers,
) -> None:
    services = servers()
    lifecycle = Lifecycle(services.jobs)
    job_id = lifecycle.in_progress("ended")
    services.jobs.open_debug_session(job_id, session_id(4), 0, FINGERPRINT, user("alice"),
                                     relay=services.presence.instance_id)  # fmt: skip
    lifecycle.report(job_id, "exited", exit_code=0)
    services.projector.catch_up()
    ended_at = datetime.fromisoformat(services.queries.job(str(job_id))["ended_at"])  # type: ignore[index]
    # its node ends it with the job: a moment later it may still be open
    assert close_orphaned_sessions(services.orphans(), now=ended_at + timedelta(seconds=1)) == 0
    later = ended_at + timedelta(seconds=ENDED_GRACE_S + 1)
    assert close_orphaned_sessions(services.orphans(), now=later) == 1
    [closed], still_open = sessions_of(services, job_id)
    assert still_open == []
    assert closed["facts"]["reason"] == ("job_ended: the job ended (succeeded) and its node did "
                                         "not end the session")  # fmt: skip


def test_the_scheduling_server_closes_the_sessions_of_a_replica_that_died(
    servers: Servers, killed_relay: str
) -> None:
    services = servers()
    job_id = Lifecycle(services.jobs).in_progress("debugged")
    services.jobs.open_debug_session(job_id, session_id(5), 0, FINGERPRINT, user("alice"),
                                     relay=killed_relay)  # fmt: skip
    services.projector.catch_up()
    assert [row["id"] for row in services.queries.open_debug_sessions()] == [session_id(5)]
    sweep = OrphanSweep(services.orphans(), every_s=0.0)
    leader = Scheduler(services.scheduling(), chores=[sweep.run_if_due])
    leader.run_once()  # the relay is found dead once: it may be taking its presence again
    assert sessions_of(services, job_id) == ([], [session_id(5)])
    leader.run_once()  # dead again: its sessions are closed
    [closed], still_open = sessions_of(services, job_id)
    assert still_open == [] and closed["facts"]["reason"].startswith("server_restarted")


def test_a_relay_that_was_away_for_one_check_only_keeps_its_sessions(servers: Servers) -> None:
    services, relay = servers(), servers()
    job_id = Lifecycle(services.jobs).in_progress("debugged")
    services.jobs.open_debug_session(job_id, session_id(7), 0, FINGERPRINT, user("alice"),
                                     relay=relay.presence.instance_id)  # fmt: skip
    sweep = OrphanSweep(services.orphans(), every_s=0.0)
    leader = Scheduler(services.scheduling(), chores=[sweep.run_if_due])
    relay.presence.release()  # its database connection broke, say
    leader.run_once()
    relay.presence.hold()  # and it took its presence again
    leader.run_once()
    leader.run_once()
    assert sessions_of(services, job_id) == ([], [session_id(7)])


def test_a_session_opened_before_relays_were_recorded_loads_and_is_closed(
    servers: Servers,
) -> None:
    """A ``DebugSessionOpened`` stored without ``relay`` (as older servers wrote it) loads with
    none, shows in the views, and is closed when a server starts."""
    writer = servers()
    job_id = Lifecycle(writer.jobs).in_progress("old-session")
    job = writer.jobs.job(job_id)
    job.open_debug_session(session_id(6), 0, FINGERPRINT, by=user("alice"))
    [pending] = job.collect_events()
    stored = writer.jobs.mapper.to_stored_event(pending)
    state = json.loads(stored.state)
    del state["relay"]
    writer.jobs.recorder.insert_events([StoredEvent(
        originator_id=stored.originator_id, originator_version=stored.originator_version,
        topic=stored.topic, state=json.dumps(state).encode())])  # fmt: skip

    restarted = servers()  # no aggregate cache of the writer's
    assert restarted.jobs.job(job_id).open_debug_sessions == {session_id(6)}
    history = restarted.jobs.history(job_id)
    [opened] = [e for e in history if event_name(e) == "DebugSessionOpened"]
    assert "relay" not in event_facts(opened)
    restarted.projector.catch_up()
    assert [(row["id"], row["relay"]) for row in restarted.queries.open_debug_sessions()] == [
        (session_id(6), None)
    ]
    start(restarted)
    [closed], still_open = sessions_of(restarted, job_id)
    assert still_open == [] and closed["facts"]["reason"].startswith("server_restarted")


def dump_sessions(services: Services) -> list[dict[str, Any]]:
    with services.database.transaction() as cursor:
        cursor.execute("SELECT * FROM debug_sessions ORDER BY job_id, id")
        return [dict(row) for row in cursor.fetchall()]


def test_the_sessions_view_is_rebuilt_from_the_ledger(servers: Servers) -> None:
    services = servers()
    lifecycle = Lifecycle(services.jobs)
    job_id = lifecycle.in_progress("many")
    relay = services.presence.instance_id
    for number in range(3):
        services.jobs.open_debug_session(job_id, session_id(10 + number), 0, FINGERPRINT,
                                         user("alice"), relay=relay)  # fmt: skip
    services.jobs.close_debug_session(job_id, session_id(10), "done", 1.5, by=user("alice"))
    services.projector.catch_up()
    before = dump_sessions(services)
    assert "debug_sessions" in VIEW_TABLES
    assert [(row["id"], row["relay"], row["closed_at"] is None) for row in before] == [
        (session_id(10), relay, False), (session_id(11), relay, True),
        (session_id(12), relay, True),
    ]  # fmt: skip
    assert services.rebuilder is not None
    progress = services.rebuilder.run()
    assert progress.state == "done", progress.error
    assert progress.rows["debug_sessions"] == 3
    assert dump_sessions(services) == before


def test_views_of_the_shape_before_sessions_are_rebuilt_with_them_on_start(
    database_url: str, tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    services = build_services(settings)
    job_id = Lifecycle(services.jobs).in_progress("upgraded")
    services.jobs.open_debug_session(job_id, session_id(20), 0, FINGERPRINT, user("alice"))
    services.projector.catch_up()
    with services.database.transaction(write=True) as cursor:  # as the previous version left
        cursor.execute("DROP TABLE debug_sessions")
        cursor.execute("UPDATE view_schema SET version = 2")
    services.close()

    upgraded = build_services(settings)
    try:
        upgraded.projector.catch_up()
        assert [row["id"] for row in upgraded.queries.open_debug_sessions()] == [session_id(20)]
        assert upgraded.queries.job(str(job_id))["status"] == "in progress"  # type: ignore[index]
    finally:
        upgraded.close()
