"""Connections for the view tables: one SQLite file, or PostgreSQL through psycopg 3.

SQL is written once with ``?`` placeholders and portable types (TEXT, BIGINT, DOUBLE
PRECISION); the PostgreSQL side turns ``?`` into ``%s``.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

Row = dict[str, Any]


class Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...
    def fetchone(self) -> Row | None: ...
    def fetchall(self) -> list[Row]: ...


class Database(Protocol):
    dialect: str

    def transaction(self, *, write: bool = False) -> Any:
        """A context manager giving a Cursor inside one transaction."""

    def close(self) -> None: ...


class _Cursor:
    """A DB-API cursor that takes ``?`` placeholders and returns rows as dicts."""

    def __init__(self, cursor: Any, placeholder: str = "?") -> None:
        self._cursor = cursor
        self._placeholder = placeholder

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._cursor.execute(sql.replace("?", self._placeholder), tuple(params))

    def fetchone(self) -> Row | None:
        row = self._cursor.fetchone()
        return dict(row) if row is not None else None

    def fetchall(self) -> list[Row]:
        return [dict(row) for row in self._cursor.fetchall()]


class SQLiteDatabase:
    """One connection per thread; writers take the lock up front (BEGIN IMMEDIATE)."""

    dialect = "sqlite"

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()

    def _connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            connection.row_factory = sqlite3.Row
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA busy_timeout=30000")
            self._local.connection = connection
        return connection

    @contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[Cursor]:
        connection = self._connection()
        connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield _Cursor(connection.cursor())
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")

    def close(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None


class PostgresDatabase:
    dialect = "postgres"

    def __init__(self, conninfo: str, max_size: int = 10) -> None:
        import psycopg
        from psycopg.rows import dict_row
        from psycopg_pool import ConnectionPool

        # Fail fast with the server's own reason (unknown role, missing database, refused):
        # the pool would only say that it timed out.
        psycopg.connect(conninfo, connect_timeout=5).close()
        self._pool = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=max_size,
            kwargs={"row_factory": dict_row, "autocommit": False},
            open=True,
        )

    @contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[Cursor]:
        with self._pool.connection() as connection, connection.transaction():
            yield _Cursor(connection.cursor(), placeholder="%s")

    def close(self) -> None:
        self._pool.close()


class DatabaseUnavailable(Exception):
    """The database cannot be reached (down, restarting, out of connections) right now."""


_UNAVAILABLE_SQLITE = ("locked", "disk i/o", "unable to open", "readonly", "disk is full")


def is_unavailable(error: BaseException) -> bool:
    """Whether ``error`` says the database is away for now, not that a statement is wrong.

    Such errors pass by themselves (a retry later works); any other error applying an event
    is the event's or the view's and would fail again.
    """
    if isinstance(error, DatabaseUnavailable):
        return True
    if isinstance(error, sqlite3.OperationalError):
        return any(part in str(error).lower() for part in _UNAVAILABLE_SQLITE)
    import sys

    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(error, psycopg.OperationalError | psycopg.InterfaceError):
        return True
    persistence = sys.modules.get("eventsourcing.persistence")
    if persistence is not None and isinstance(
        error, persistence.OperationalError | persistence.InterfaceError
    ):
        return True
    cause = error.__cause__  # our wrappers and eventsourcing's raise theirs ``from`` the driver's
    return cause is not None and cause is not error and is_unavailable(cause)


def open_database(url: str) -> SQLiteDatabase | PostgresDatabase:
    """``sqlite:///path/file.db`` or ``postgresql://user@host:port/dbname``."""
    if url.startswith("sqlite:///"):
        return SQLiteDatabase(url.removeprefix("sqlite:///"))
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresDatabase(url)
    raise ValueError(f"unsupported database URL {url!r}: use sqlite:///PATH or postgresql://...")
