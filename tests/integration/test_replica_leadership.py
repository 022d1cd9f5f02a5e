"""Replicas on one database: one scheduler at a time (an advisory lock on PostgreSQL, a file
lock on SQLite), and views that follow another replica's writes by LISTEN/NOTIFY."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.scheduling.leadership import FileLeaderLock, PostgresLeaderLock
from api.scheduling.scheduler import Scheduler
from api.services import Services, build_services
from api.settings import Settings
from domain.actors import user
from ledger.database import LedgerListener, dedicated_connection
from tests.integration.conftest import job_spec
from tests.support import wait_until

Replicas = Callable[[], Services]


@pytest.fixture
def replicas(database_url: str, tmp_path: Path) -> Iterator[Replicas]:
    """Builds services on one database (each store), each with a data dir of its own (as
    replicas on different hosts would have); closes them afterwards."""
    yield from _replicas(database_url, tmp_path)


@pytest.fixture
def pg_replicas(postgres_url: str, tmp_path: Path) -> Iterator[Replicas]:
    """As ``replicas``, on PostgreSQL only."""
    yield from _replicas(postgres_url, tmp_path)


def _replicas(database_url: str, tmp_path: Path) -> Iterator[Replicas]:
    built: list[Services] = []

    def replica() -> Services:
        settings = Settings(data_dir=tmp_path / f"data-{len(built)}", database_url=database_url)
        services = build_services(settings)
        built.append(services)
        return services

    yield replica
    for services in built:
        services.close()


def connector(url: str) -> Callable[[], psycopg.Connection]:  # type: ignore[type-arg]
    return lambda: dedicated_connection(url, 2)


def test_one_advisory_lock_holder_at_a_time_and_the_lock_goes_with_its_connection(
    postgres_url: str,
) -> None:
    first, second = PostgresLeaderLock(connector(postgres_url)), PostgresLeaderLock(
        connector(postgres_url)
    )
    assert first.acquire()
    assert not second.acquire()
    assert first.held()
    first.release()
    assert second.acquire()
    # The holder's connection is cut (an administrator, a restart): it no longer leads...
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        # Only this test's database (other tests' servers run beside it), and wait until the
        # backend is gone: it lets go of its locks as it exits, after its client sees it end.
        admin.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_locks "
            "WHERE locktype = 'advisory' AND pid <> pg_backend_pid() AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        )
    wait_until(lambda: not second.held(), timeout=5)
    # ...and the lock is free for whoever asks first.
    assert first.acquire()
    first.release()
    second.release()


def test_a_file_lock_lets_one_server_schedule_on_an_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "flexai.sqlite3.scheduler-lock"
    first, second = FileLeaderLock(path), FileLeaderLock(path)
    assert first.acquire()
    assert not second.acquire()
    first.release()
    assert second.acquire()
    second.release()


def test_exactly_one_scheduler_leads_and_another_takes_over_when_it_stops(
    replicas: Replicas,
) -> None:
    one, two = replicas(), replicas()
    schedulers = {id(one): Scheduler(one.scheduling()), id(two): Scheduler(two.scheduling())}
    for scheduler in schedulers.values():
        scheduler.start()
    try:
        wait_until(lambda: one.scheduler_leader.is_set() or two.scheduler_leader.is_set(), 10)
        time.sleep(1.5)  # the standby has tried again at least once
        assert one.scheduler_leader.is_set() != two.scheduler_leader.is_set()
        leader, standby = (one, two) if one.scheduler_leader.is_set() else (two, one)
        with TestClient(create_app(leader, background=False)) as client:
            assert client.get("/health").json()["scheduler"] == "leader"
            assert "flexai_scheduler_leader 1.0" in client.get("/metrics").text
        with TestClient(create_app(standby, background=False)) as client:
            assert client.get("/health").json()["scheduler"] == "standby"
            assert "flexai_scheduler_leader 0.0" in client.get("/metrics").text
        started = time.monotonic()
        schedulers[id(leader)].stop()
        assert not leader.scheduler_leader.is_set()
        wait_until(standby.scheduler_leader.is_set, timeout=5)
        print(f"took over in {time.monotonic() - started:.2f} s")
    finally:
        for scheduler in schedulers.values():
            scheduler.stop()


def test_the_standby_schedules_nothing(replicas: Replicas) -> None:
    one, two = replicas(), replicas()
    leader = Scheduler(one.scheduling())
    leader.start()
    wait_until(one.scheduler_leader.is_set, timeout=10)
    leader.stop()  # the lock is free again, then held by a scheduler that never runs rounds
    assert one.leader_lock.acquire()
    standby = Scheduler(two.scheduling())
    standby.start()
    try:
        job_id = two.jobs.submit("alice", "waits", job_spec(), by=user("alice")).job_id
        two.projector.catch_up()
        two.scheduler_wakeup.set()
        time.sleep(1.5)
        two.projector.catch_up()
        document = two.queries.job(str(job_id))
        assert document is not None and document["status"] == "pending"
        assert not two.scheduler_leader.is_set()
    finally:
        standby.stop()
        one.leader_lock.release()


def test_views_follow_another_replicas_write_by_notification(pg_replicas: Replicas) -> None:
    writer, reader = pg_replicas(), pg_replicas()
    reader.projector.start()
    try:
        time.sleep(0.3)  # the reader's projector listens
        figures = []
        for index in range(5):
            started = time.monotonic()
            job_id = writer.jobs.submit("alice", f"seen-{index}", job_spec(),
                                        by=user("alice")).job_id  # fmt: skip
            wait_until(lambda: reader.queries.job(str(job_id)) is not None, timeout=5)  # noqa: B023
            figures.append(time.monotonic() - started)
        print("seen on the other replica after " + ", ".join(f"{s * 1000:.0f} ms" for s in figures))
        assert max(figures) < 0.5  # the safety poll alone would take up to 1 s
    finally:
        reader.projector.stop()


def test_a_listener_hears_commits_and_listens_again_after_its_connection_breaks(
    postgres_url: str, pg_replicas: Replicas
) -> None:
    writer = pg_replicas()
    listener = LedgerListener(connector(postgres_url))
    try:
        assert listener.wait(0.1)  # listening started: the caller reads what it missed
        assert not listener.wait(0.1)
        writer.jobs.submit("alice", "heard", job_spec(), by=user("alice"))
        assert listener.wait(2)
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'"
            )
        wait_until(lambda: listener.wait(0.1), timeout=5)
        writer.jobs.submit("alice", "heard-again", job_spec(), by=user("alice"))
        assert listener.wait(2)
    finally:
        listener.close()


def test_servers_started_together_on_a_fresh_database_all_come_up(
    database_url: str, tmp_path: Path
) -> None:
    """Each makes the tables it needs; on PostgreSQL two `CREATE ... IF NOT EXISTS` racing each
    other fail rather than find the other's, so the servers take turns (an advisory lock)."""
    starting = threading.Barrier(3)
    started: list[Services | Exception] = []

    def start(index: int) -> None:
        starting.wait()
        try:
            started.append(build_services(Settings(data_dir=tmp_path / f"server-{index}",
                                                   database_url=database_url)))  # fmt: skip
        except Exception as error:  # the test says which
            started.append(error)

    threads = [threading.Thread(target=start, args=(index,)) for index in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    services = [s for s in started if isinstance(s, Services)]
    try:
        assert len(services) == 3, "".join(
            line for s in started if isinstance(s, Exception)
            for line in traceback.format_exception(s)
        )  # fmt: skip
        job_id = services[0].jobs.submit("alice", "first", job_spec(), by=user("alice")).job_id
        for server in services:
            server.projector.catch_up()
            assert server.queries.job(str(job_id)) is not None
    finally:
        for server in services:
            server.close()


def test_a_replica_starts_while_another_writes_the_views_and_holds_their_locks(
    pg_replicas: Replicas, postgres_url: str
) -> None:
    """Its tables and indexes are there already: a restarted replica takes none of the SHARE
    locks that `CREATE INDEX IF NOT EXISTS` takes, which wait for the live replicas' writes
    (and deadlocked with them under load: the restarted replica exited)."""
    first = pg_replicas()
    url = first.settings.resolved_database_url
    with psycopg.connect(url) as writer:  # a live replica's write, left open
        writer.execute("LOCK TABLE job_list, checkpoints, job_nodes IN ROW EXCLUSIVE MODE")
        started: list[Services | BaseException] = []

        def start() -> None:
            try:
                started.append(pg_replicas())
            except BaseException as error:  # the test says which
                started.append(error)

        thread = threading.Thread(target=start, daemon=True)
        thread.start()
        thread.join(20)
        assert started and isinstance(started[0], Services), started or "still waiting"
        writer.rollback()
