"""Connections for the view tables: one SQLite file, or PostgreSQL through psycopg 3.

SQL is written once with ``?`` placeholders and portable types (TEXT, BIGINT, DOUBLE
PRECISION); the PostgreSQL side turns ``?`` into ``%s``.

While PostgreSQL is away (down, restarting, unreachable) no caller waits long: both the views'
pool and the ledger's (:class:`PostgresEventStore`) raise :class:`DatabaseUnavailable` once no
connection came within the wait, and recover by themselves once the server answers again.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import psycopg
from eventsourcing import persistence, postgres
from eventsourcing.utils import Environment, EnvType
from psycopg.rows import dict_row

from ledger.pool import RECONNECT_S, DatabaseUnavailable, FailFastPool

Row = dict[str, Any]
log = logging.getLogger(__name__)

DEFAULT_WAIT_S = 1.5
"""How long a caller waits for a PostgreSQL connection before hearing that it is unavailable."""
DEFAULT_CONNECT_TIMEOUT_S = 2
"""Each attempt to connect to PostgreSQL (libpq counts whole seconds, two at the least)."""


class Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...
    def fetchone(self) -> Row | None: ...
    def fetchall(self) -> list[Row]: ...


class Database(Protocol):
    dialect: str

    def transaction(self, *, write: bool = False) -> Any:
        """A context manager giving a Cursor inside one transaction (a read, ``write`` False,
        may see each statement's own moment: PostgreSQL's READ COMMITTED)."""

    def close(self) -> None: ...


class _Cursor:
    """A DB-API cursor that takes ``?`` placeholders and returns rows as dicts."""

    def __init__(self, cursor: Any, placeholder: str = "?") -> None:
        self._cursor = cursor
        self._placeholder = placeholder
        self.dialect = "postgresql" if placeholder == "%s" else "sqlite"

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._cursor.execute(sql.replace("?", self._placeholder), tuple(params))

    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> None:
        """One statement for many rows (psycopg pipelines them: one round trip, not one each)."""
        self._cursor.executemany(sql.replace("?", self._placeholder), [tuple(p) for p in params])

    def fetchone(self) -> Row | None:
        row = self._cursor.fetchone()
        return dict(row) if row is not None else None

    def fetchall(self) -> list[Row]:
        return [dict(row) for row in self._cursor.fetchall()]


SQLITE_BUSY_S = 30
"""How long a writer waits for an SQLite file's write lock (its ``busy_timeout``)."""


class SQLiteWriteLock:
    """The lock that this process's writers to one SQLite file (the views' and the ledger's)
    hold around each write transaction. They queue on it, and the next one goes the moment the
    last one commits, where SQLite's own wait for its write lock (the busy timeout) sleeps 1 to
    100 ms between tries: under 8 clients' submissions, half the views' write transactions
    waited over 1 ms for it (p99 18 ms), while every request that waited to read its own
    write waited too. Other processes on the file still meet the busy timeout; a writer
    that waits here longer than it fails as SQLite's wait would."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def __enter__(self) -> None:
        if not self._lock.acquire(timeout=SQLITE_BUSY_S):
            raise sqlite3.OperationalError(
                f"database is locked: another writer of this process held it {SQLITE_BUSY_S} s"
            )

    def __exit__(self, *_: object) -> None:
        self._lock.release()


_WRITE_LOCKS: dict[str, SQLiteWriteLock] = {}
_WRITE_LOCKS_GUARD = threading.Lock()


def sqlite_write_lock(path: str) -> SQLiteWriteLock:
    """The write lock of the SQLite file at ``path`` in this process. A private database
    (``:memory:``, or ``""`` for a temporary file) is no file that two connections share: each
    asker gets a lock of its own."""
    if path in ("", ":memory:"):
        return SQLiteWriteLock()
    key = path if path.startswith("file:") else os.path.realpath(path)
    with _WRITE_LOCKS_GUARD:
        return _WRITE_LOCKS.setdefault(key, SQLiteWriteLock())


class SQLiteDatabase:
    """One connection per thread; writers take the lock up front (BEGIN IMMEDIATE), after this
    process's other writers to the file (:func:`sqlite_write_lock`)."""

    dialect = "sqlite"

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()
        self._write_lock = sqlite_write_lock(path)

    def _connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(self.path, timeout=SQLITE_BUSY_S,  # its busy timeout
                                         isolation_level=None)  # fmt: skip
            connection.row_factory = sqlite3.Row
            connection.execute("PRAGMA journal_mode=WAL")
            # The views are rebuilt from the ledger, and their tracking position commits with
            # them: a commit need not wait for the disk (the ledger's own commits still do).
            connection.execute("PRAGMA synchronous=NORMAL")
            self._local.connection = connection
        return connection

    @contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[Cursor]:
        if not write:
            with self._transaction("BEGIN") as cursor:
                yield cursor
            return
        with self._write_lock, self._transaction("BEGIN IMMEDIATE") as cursor:
            yield cursor

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[Cursor]:
        connection = self._connection()
        connection.execute(begin)
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
    """A pool of connections in autocommit: a write is one transaction (``BEGIN`` ...
    ``COMMIT``); a read runs each statement alone, as READ COMMITTED would (each statement sees
    what was committed when it began), without the two round trips that open and close a
    transaction."""

    dialect = "postgres"

    def __init__(
        self,
        conninfo: str,
        max_size: int = 10,
        *,
        wait_s: float = DEFAULT_WAIT_S,
        connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S,
    ) -> None:
        # Fail fast with the server's own reason (unknown role, missing database, refused):
        # the pool would only say that it timed out.
        psycopg.connect(conninfo, connect_timeout=connect_timeout_s).close()
        self.conninfo = conninfo
        self.connect_timeout_s = connect_timeout_s
        options = {"row_factory": dict_row, "autocommit": True,
                   "connect_timeout": connect_timeout_s}  # fmt: skip
        self._pool = FailFastPool(
            conninfo,
            min_size=1,
            max_size=max_size,
            kwargs=options,
            timeout=wait_s,
            reconnect_timeout=RECONNECT_S,
            open=True,
        )

    @contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[Cursor]:
        with self._pool.connection() as connection:
            if not write:
                yield _Cursor(connection.cursor(), placeholder="%s")
                return
            with connection.transaction():
                yield _Cursor(connection.cursor(), placeholder="%s")

    def close(self) -> None:
        self._pool.close()

    def copy_rows(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
        """Append ``rows`` to ``table`` with ``COPY ... FROM STDIN`` in one transaction (bulk
        loads: a rebuild's shadow views); return how many."""
        count = 0
        statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
        with (
            self._pool.connection() as connection,
            connection.transaction(),
            connection.cursor().copy(statement) as copy,
        ):
            for row in rows:
                copy.write_row(row)
                count += 1
        return count

    def notify_ledger(self, position: int) -> None:
        """Tell every replica's views that the ledger grew (``NOTIFY flexai_ledger``, the
        position as its payload), once the write committed. Best effort: should it fail, the
        views' slow poll finds the events anyway."""
        try:
            self.notify(LEDGER_CHANNEL, str(position))
        except Exception as error:
            log.warning("could not tell the replicas of ledger position %d: %s", position, error)

    def notify(self, channel: str, payload: str) -> None:
        with self.transaction() as cursor:
            cursor.execute("SELECT pg_notify(?, ?)", (channel, payload))

    def dedicated_connection(self) -> psycopg.Connection[Any]:
        """A connection of its own, outside the pool (see :func:`dedicated_connection`)."""
        return dedicated_connection(self.conninfo, self.connect_timeout_s)


def dedicated_connection(conninfo: str, connect_timeout_s: int) -> psycopg.Connection[Any]:
    """A connection outside every pool, in autocommit, for what must live as long as the
    connection does (a LISTEN, a session-level advisory lock).

    TCP keepalives and a user timeout make a peer gone silent (a dropped network) show as a
    broken connection within about ten seconds rather than the kernel's two hours.
    """
    return psycopg.connect(
        conninfo, autocommit=True, connect_timeout=connect_timeout_s, keepalives=1,
        keepalives_idle=5, keepalives_interval=2, keepalives_count=2, tcp_user_timeout=10_000,
    )  # fmt: skip


SCHEMA_LOCK_KEY = int.from_bytes(b"flexai\x00\x02", "big")
"""The advisory lock of a server's start (the scheduler's is ``flexai\0\1``)."""


LEDGER_CHANNEL = "flexai_ledger"
"""The channel told of every commit to the ledger (:meth:`PostgresDatabase.notify_ledger`)."""
TOKENS_CHANNEL = "flexai_tokens"
"""The channel told of every revoked API token: replicas forget the tokens they remember."""
LISTEN_RETRY_S = 1.0
"""How often a listener whose connection broke tries to connect again."""


class LedgerListener:
    """LISTENs on :data:`LEDGER_CHANNEL` on a connection of its own, connecting again when it
    breaks."""

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        others: dict[str, Callable[[], None]] | None = None,
    ) -> None:
        self._connect = connect
        self._connection: psycopg.Connection[Any] | None = None
        self._retry_at = 0.0
        self.told: int | None = None
        """The last ledger position the notifications the last :meth:`wait` took named (their
        payload); None when one named none, or when listening (re)started."""
        self.others = others or {}
        """Other channels listened to on the same connection, and what each notification (or
        a fresh start of listening, when some may have been missed) calls."""

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a commit to the ledger; True when one came (all
        that came meanwhile are taken at once), or when listening (re)started: what was
        committed while nobody listened is to be read now."""
        self.told = None
        connection = self._connection
        if connection is None or connection.closed or connection.broken:
            self.close()
            if time.monotonic() < self._retry_at:
                time.sleep(timeout)  # the database is away: the caller's poll goes on
                return False
            try:
                connection = self._connect()
                for channel in (LEDGER_CHANNEL, *self.others):
                    connection.execute(f"LISTEN {channel}")
            except psycopg.Error:
                self._retry_at = time.monotonic() + LISTEN_RETRY_S
                time.sleep(timeout)
                return False
            self._connection = connection
            for told in self.others.values():
                told()
            return True
        try:
            heard = list(connection.notifies(timeout=timeout, stop_after=1))
        except psycopg.Error:
            self.close()
            return True
        for channel in {notice.channel for notice in heard} & set(self.others):
            self.others[channel]()
        ledger = [notice.payload for notice in heard if notice.channel == LEDGER_CHANNEL]
        if ledger and all(payload.isdigit() for payload in ledger):
            self.told = max(int(payload) for payload in ledger)
        return bool(ledger)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


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
    # psycopg's OperationalError covers refused and broken connections and the pool's timeouts;
    # eventsourcing wraps the driver's errors in its own of the same names.
    if isinstance(
        error,
        psycopg.OperationalError | psycopg.InterfaceError
        | persistence.OperationalError | persistence.InterfaceError,
    ):  # fmt: skip
        return True
    cause = error.__cause__  # our wrappers and eventsourcing's raise theirs ``from`` the driver's
    return cause is not None and cause is not error and is_unavailable(cause)


class PostgresEventStore(postgres.PostgresFactory):
    """eventsourcing's PostgreSQL infrastructure with a :class:`FailFastPool`.

    Its environment adds ``POSTGRES_POOL_WAIT`` (seconds, a float: how long a recorder call
    waits for a connection) to eventsourcing's own; ``POSTGRES_CONNECT_TIMEOUT`` bounds each
    attempt to connect (eventsourcing also took it as its pool's wait, in whole seconds).
    """

    POSTGRES_POOL_WAIT = "POSTGRES_POOL_WAIT"

    def __init__(self, env: Environment | EnvType | None) -> None:
        super().__init__(env)
        datastore = self.datastore
        unopened = datastore.pool  # built by eventsourcing, not yet connected: replaced whole
        assert isinstance(unopened.kwargs, dict)
        connect_timeout_s = self.env.get(self.POSTGRES_CONNECT_TIMEOUT)
        datastore.pool = FailFastPool(
            connection_class=unopened.connection_class,
            kwargs={**unopened.kwargs,
                    "connect_timeout": int(connect_timeout_s or DEFAULT_CONNECT_TIMEOUT_S)},
            min_size=unopened.min_size,
            max_size=unopened.max_size,
            open=False,
            configure=datastore.after_connect_func(),
            check=postgres.ConnectionPool.check_connection if datastore.pre_ping else None,
            timeout=float(self.env.get(self.POSTGRES_POOL_WAIT) or DEFAULT_WAIT_S),
            max_waiting=unopened.max_waiting,
            max_lifetime=unopened.max_lifetime,
            reconnect_timeout=RECONNECT_S,
            get_password_func=unopened.get_password_func,
        )  # fmt: skip


def open_database(
    url: str,
    *,
    wait_s: float = DEFAULT_WAIT_S,
    connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S,
) -> SQLiteDatabase | PostgresDatabase:
    """``sqlite:///path/file.db`` or ``postgresql://user@host:port/dbname``."""
    if url.startswith("sqlite:///"):
        return SQLiteDatabase(url.removeprefix("sqlite:///"))
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresDatabase(url, wait_s=wait_s, connect_timeout_s=connect_timeout_s)
    raise ValueError(f"unsupported database URL {url!r}: use sqlite:///PATH or postgresql://...")
