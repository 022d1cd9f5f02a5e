"""Which server schedules: several replicas may serve one PostgreSQL, one of them schedules.

The scheduler runs on the replica that holds a lock; the others try to take it about once a
second (:data:`RETRY_S`), so one takes over within seconds of the holder's death.

- On PostgreSQL the lock is a session-level advisory lock (``pg_try_advisory_lock``) held on a
  connection of its own, outside the request pool: when the holder dies its connection closes
  (at once on ``kill -9``, the kernel closes the socket) and PostgreSQL releases the lock. When
  that connection breaks, the holder stops scheduling at once and tries to lead again.
- On SQLite (one server per file) it is an exclusive ``flock`` on a file beside the database,
  so a second server started on the same file does not schedule too.
"""

from __future__ import annotations

import fcntl
import logging
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import IO, Any, Protocol

import psycopg

from ledger.pool import connection_lost

log = logging.getLogger(__name__)

RETRY_S = 1.0
"""How often a standby replica tries to take the lock."""
CHECK_EVERY_S = 1.0
"""How often the leader asks PostgreSQL whether its lock connection still answers (a hang-up
the server sent is seen before every round, without a round trip)."""
ADVISORY_KEY = int.from_bytes(b"flexai\x00\x01", "big")
"""The advisory lock's key (advisory locks are per database)."""


class LeaderLock(Protocol):
    def acquire(self) -> bool:
        """Take the lock if it is free; whether this server holds it now."""

    def held(self) -> bool:
        """Whether this server still holds the lock it took (cheap: checked before rounds)."""

    def release(self) -> None: ...


class AlwaysLeader:
    """No lock: this server is the only one (tests that build their own services)."""

    def acquire(self) -> bool:
        return True

    def held(self) -> bool:
        return True

    def release(self) -> None:
        pass


class PostgresLeaderLock:
    """A session-level advisory lock on a connection that ``connect`` makes (not a pool's)."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], key: int = ADVISORY_KEY):
        self._connect = connect
        self.key = key
        self._connection: psycopg.Connection[Any] | None = None
        self._checked_at = 0.0

    def acquire(self) -> bool:
        if self._connection is None:
            try:
                self._connection = self._connect()
            except psycopg.Error as error:
                log.debug("the scheduler lock waits for the database: %s", error)
                return False
        try:
            row = self._connection.execute(
                "SELECT pg_try_advisory_lock(%s)", (self.key,)
            ).fetchone()
        except psycopg.Error as error:
            log.debug("the scheduler lock waits for the database: %s", error)
            self.release()
            return False
        self._checked_at = time.monotonic()
        return bool(row and row[0])

    def held(self) -> bool:
        connection = self._connection
        if connection is None or connection_lost(connection):
            self.release()
            return False
        if time.monotonic() - self._checked_at >= CHECK_EVERY_S:
            try:
                connection.execute("SELECT 1")
            except psycopg.Error:
                self.release()
                return False
            self._checked_at = time.monotonic()
        return True

    def release(self) -> None:
        """Unlock, then close the connection: the next server takes the lock at once (the
        session's end would release it too, but a moment after the close returns)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            with suppress(psycopg.Error):
                connection.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
            with suppress(psycopg.Error):
                connection.close()


class FileLeaderLock:
    """An exclusive ``flock`` on ``path``, released by the kernel when this process ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None

    def acquire(self) -> bool:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def held(self) -> bool:
        return self._file is not None

    def release(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()  # closing the last descriptor releases the lock
