"""What waiting for the views costs, on each store: a wait for what they hold asks the database
nothing; reads on PostgreSQL run outside a transaction and writes stay atomic; a ledger
notification says which position woke it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import psycopg
import pytest

from domain.actors import user
from ledger.database import Database, LedgerListener, PostgresDatabase, open_database
from projections.projector import Projector
from projections.queries import Queries
from tests.integration.conftest import Lifecycle, job_spec
from tests.integration.test_replica_leadership import connector
from tests.support import wait_until


class Counting:
    """The store's database, counting the transactions asked of it."""

    def __init__(self, database: Database) -> None:
        self.database, self.dialect = database, database.dialect
        self.transactions = 0

    def transaction(self, *, write: bool = False) -> AbstractContextManager[Any]:
        self.transactions += 1
        return self.database.transaction(write=write)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.database.close()


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    opened = open_database(database_url)
    yield opened
    opened.close()


def test_a_wait_for_what_the_views_hold_asks_the_database_nothing(
    lifecycle: Lifecycle, database: Database
) -> None:
    counting = Counting(database)
    projector = Projector(lifecycle.app, counting)
    heard: list[Any] = []
    projector.listeners.append(heard.extend)
    projector.catch_up()
    submitted = lifecycle.app.submit("alice", "resnet-50", job_spec(), by=user("alice"))
    projector.wait(submitted.position)
    assert "Submitted" in [type(event).__name__ for event in heard]
    asked = counting.transactions
    assert submitted.position is not None
    projector.wait(submitted.position)
    projector.wait(submitted.position - 1)
    assert counting.transactions == asked  # held, and its listeners told: nothing to ask
    scheduling = lifecycle.app.begin_scheduling(submitted.job_id)
    projector.wait(scheduling.position)  # not held yet: the views catch up
    assert counting.transactions > asked
    assert Queries(database).list_jobs("alice")[0]["status"] == "scheduling"
    assert [type(event).__name__ for event in heard][-1] == "SchedulingStarted"


def test_a_catch_up_until_what_another_applied_meanwhile_asks_the_database_nothing(
    lifecycle: Lifecycle, database: Database
) -> None:
    """The waits of one group commit's submissions queue for the same catch-up: the first one
    applies the group, and the others, once they hold the lock, find their positions known."""
    counting = Counting(database)
    projector = Projector(lifecycle.app, counting)
    projector.catch_up()
    first = lifecycle.app.submit("alice", "resnet-50", job_spec(), by=user("alice"))
    second = lifecycle.app.submit("alice", "resnet-51", job_spec(), by=user("alice"))
    assert first.position is not None and second.position is not None
    assert projector.catch_up(until=first.position) == second.position  # applied both
    asked = counting.transactions
    assert projector.catch_up(until=first.position) == second.position
    assert projector.catch_up(until=second.position) == second.position
    assert counting.transactions == asked
    projector.catch_up()  # without a position: it looks at the ledger
    assert counting.transactions > asked


def test_a_read_that_fails_leaves_its_connection_fit_and_a_failed_write_leaves_nothing(
    database: Database,
) -> None:
    with pytest.raises(Exception, match="no_such_table"), database.transaction() as cursor:
        cursor.execute("SELECT n FROM no_such_table")
    with database.transaction() as cursor:
        cursor.execute("SELECT 1 AS one")
        assert cursor.fetchone() == {"one": 1}
    with database.transaction(write=True) as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS atomic_writes (n BIGINT)")
    with pytest.raises(RuntimeError), database.transaction(write=True) as cursor:
        cursor.execute("INSERT INTO atomic_writes (n) VALUES (1)")
        cursor.execute("INSERT INTO atomic_writes (n) VALUES (2)")
        raise RuntimeError("the command failed half-way")
    with database.transaction() as cursor:
        cursor.execute("SELECT COUNT(*) AS n FROM atomic_writes")
        assert cursor.fetchone() == {"n": 0}


def test_a_ledger_notification_says_the_position_it_tells_of(postgres_url: str) -> None:
    database = open_database(postgres_url)
    assert isinstance(database, PostgresDatabase)
    listener = LedgerListener(connector(postgres_url))
    try:
        assert listener.wait(0.1) and listener.told is None  # started: anything may be new
        database.notify_ledger(41)
        database.notify_ledger(42)
        assert listener.wait(2)
        while listener.told != 42:  # both came at once, or one after the other
            assert listener.told == 41 and listener.wait(2)
        database.notify("flexai_ledger", "not a position")
        assert listener.wait(2) and listener.told is None
    finally:
        listener.close()
        database.close()


def test_a_listener_whose_connection_broke_says_no_position(postgres_url: str) -> None:
    listener = LedgerListener(connector(postgres_url))
    try:
        assert listener.wait(0.1)
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                          "query LIKE 'LISTEN%' AND datname = current_database()")  # fmt: skip
        wait_until(lambda: listener.wait(0.1), timeout=5)  # it listens again...
        assert listener.told is None  # what came meanwhile is unknown: read it all
    finally:
        listener.close()
