"""Which errors say "the database is away for now" (503, retry later) and which do not."""

from __future__ import annotations

import sqlite3

import psycopg
import psycopg_pool
import pytest
from eventsourcing import persistence

from ledger.database import is_unavailable
from ledger.pool import DatabaseUnavailable


def raised_from(error: BaseException, cause: BaseException) -> BaseException:
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    "error",
    [
        raised_from(DatabaseUnavailable("no connection"), psycopg_pool.PoolTimeout("1.5 s")),
        psycopg_pool.PoolTimeout("couldn't get a connection after 1.50 sec"),
        psycopg_pool.TooManyRequests("the pool has 10 requests waiting"),
        psycopg.OperationalError("connection refused"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.CannotConnectNow("the database system is starting up"),
        psycopg.InterfaceError("the connection is closed"),
        raised_from(persistence.OperationalError("x"), psycopg_pool.PoolTimeout("x")),
        raised_from(persistence.InterfaceError("x"), psycopg.InterfaceError("closed")),
        raised_from(persistence.PersistenceError("x"), psycopg.OperationalError("EOF")),
        raised_from(RuntimeError("wrapped"), psycopg.OperationalError("server closed")),
        sqlite3.OperationalError("database is locked"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_an_unreachable_or_restarting_database_is_unavailable(error: BaseException) -> None:
    assert is_unavailable(error)


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.UniqueViolation("duplicate key"),
        psycopg.errors.UndefinedTable('relation "jobs" does not exist'),
        raised_from(persistence.ProgrammingError("x"), psycopg.errors.SyntaxError("x")),
        persistence.IntegrityError("conflict"),
        sqlite3.OperationalError("no such table: jobs"),
        ValueError("bad value"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_wrong_statement_or_value_is_not_unavailable(error: BaseException) -> None:
    assert not is_unavailable(error)
