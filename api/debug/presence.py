"""Which server processes are alive: each holds a presence for its life, and any server can
test another's without taking it.

A server process has an instance id, fresh at every start. The debug sessions it relays name
it in the ledger (``DebugSessionOpened``'s ``relay``), so that once it is gone another server
closes them (:mod:`api.debug.orphans`).

- On PostgreSQL the presence is a session-level advisory lock keyed by the instance, held on a
  connection of its own (as the scheduler lock, :mod:`api.scheduling.leadership`): PostgreSQL
  releases it when the process dies (at once on ``kill -9``: the kernel closes the socket).
  Others read ``pg_locks``; they never take it.
- On SQLite it is an exclusive ``flock`` on ``<database>.servers/<instance id>.lock``, released
  by the kernel when the process dies. Others try it for a moment: a file whose lock is free
  is a dead server's, and is removed.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import suppress
from pathlib import Path
from typing import IO, Any, Protocol
from uuid import uuid4

import psycopg

from ledger.pool import DatabaseUnavailable, connection_lost

INSTANCE_ID = re.compile(r"[0-9a-f]{32}")
"""What instance ids look like; a relay named otherwise is no server of ours (never alive)."""
LOCK_CLASS = int.from_bytes(b"fxrl", "big")
"""The first key of every presence's advisory lock (the two-key form): theirs alone."""
HELD_LOCKS = (
    "SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 "
    "AND classid::bigint = %s AND database = "
    "(SELECT oid FROM pg_database WHERE datname = current_database())"
)
"""The presences held in this database (the two-key form's second key), read, never taken."""
KEEP_EVERY_S = 1.0
"""How often a server sees whether it lost its presence on PostgreSQL (no round trip)."""
LOCK_SUFFIX = ".lock"
SCRATCH_STALE_S = 60.0
"""A presence file not yet named (made and locked in the same instant) that is older than this
and whose lock is free was left by a server that died as it started."""


def new_instance_id() -> str:
    return uuid4().hex


def lock_key(instance_id: str) -> int:
    """The second key of the instance's advisory lock: 31 bits of its digest."""
    return int.from_bytes(hashlib.sha256(instance_id.encode()).digest()[:4], "big") >> 1


class Presence(Protocol):
    instance_id: str

    def hold(self) -> None:
        """Hold this process's presence, again if the hold was lost; raises
        :class:`DatabaseUnavailable` when it cannot."""

    def alive(self, instance_ids: Iterable[str]) -> set[str]:
        """Those of ``instance_ids`` whose server process holds its presence now."""

    def release(self) -> None: ...


class LocalPresence:
    """This process alone is known (services that share no store with another server)."""

    def __init__(self, instance_id: str | None = None) -> None:
        self.instance_id = instance_id or new_instance_id()

    def hold(self) -> None:
        pass

    def alive(self, instance_ids: Iterable[str]) -> set[str]:
        return {self.instance_id} & set(instance_ids)

    def release(self) -> None:
        pass


class PostgresPresence:
    """An advisory lock on a connection that ``connect`` makes (not a pool's). Once held, a
    thread takes it again within about a second of losing it (the database restarted, the
    connection broke), so that this server is not taken for dead for longer."""

    def __init__(
        self, connect: Callable[[], psycopg.Connection[Any]], instance_id: str | None = None
    ) -> None:
        self._connect = connect
        self.instance_id = instance_id or new_instance_id()
        self._connection: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._keeper: threading.Thread | None = None

    def hold(self) -> None:
        with self._lock:
            self._held()
            if self._keeper is None and not self._released.is_set():
                self._keeper = threading.Thread(target=self._keep, name="presence", daemon=True)
                self._keeper.start()

    def _keep(self) -> None:
        while not self._released.wait(KEEP_EVERY_S):
            with self._lock, suppress(DatabaseUnavailable):
                if not self._released.is_set():
                    self._held()

    def _held(self) -> psycopg.Connection[Any]:
        connection = self._connection
        if connection is not None and not connection_lost(connection):
            return connection
        self._close()
        try:
            connection = self._connect()
            row = connection.execute(
                "SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, lock_key(self.instance_id))
            ).fetchone()
        except psycopg.Error as error:
            raise DatabaseUnavailable(f"this server's presence cannot be held: {error}") from error
        if not (row and row[0]):  # the session of a broken connection, not yet ended
            connection.close()
            raise DatabaseUnavailable("this server's presence is still held by its previous "
                                      "database session; try again in a moment")  # fmt: skip
        self._connection = connection
        return connection

    def alive(self, instance_ids: Iterable[str]) -> set[str]:
        wanted = {i for i in instance_ids if INSTANCE_ID.fullmatch(i)}
        if not wanted:
            return set()
        with self._lock:
            try:
                connection = self._held()
                rows = connection.execute(HELD_LOCKS, (LOCK_CLASS,)).fetchall()
            except psycopg.Error as error:
                self._close()
                raise DatabaseUnavailable(f"servers' presence cannot be read: {error}") from error
        held = {int(row[0]) for row in rows}
        return {i for i in wanted if lock_key(i) in held}

    def release(self) -> None:
        """Unlock, then close the connection. PostgreSQL would release the lock with the session,
        but only once its backend has read the closed socket: a moment in which other servers
        still see this one alive. The unlock is answered only once the lock is free."""
        self._released.set()
        with self._lock:
            connection = self._connection
            if connection is not None and not connection_lost(connection):
                with suppress(psycopg.Error):
                    connection.execute(
                        "SELECT pg_advisory_unlock(%s, %s)",
                        (LOCK_CLASS, lock_key(self.instance_id)),
                    )
            self._close()

    def _close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with suppress(psycopg.Error):
                connection.close()


class FilePresence:
    """An exclusive ``flock`` on a file of ``directory`` named after the instance."""

    def __init__(self, directory: Path, instance_id: str | None = None) -> None:
        self.directory = directory
        self.instance_id = instance_id or new_instance_id()
        self._file: IO[bytes] | None = None
        self._lock = threading.Lock()

    def _path(self, instance_id: str) -> Path:
        return self.directory / f"{instance_id}{LOCK_SUFFIX}"

    def hold(self) -> None:
        with self._lock:
            if self._file is not None:
                return
            self.directory.mkdir(parents=True, exist_ok=True)
            self._remove_stale()
            scratch = self.directory / f".{self.instance_id}.new"
            file = scratch.open("wb")
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.replace(scratch, self._path(self.instance_id))  # named once locked, never free
            self._file = file

    def alive(self, instance_ids: Iterable[str]) -> set[str]:
        return {i for i in set(instance_ids)
                if INSTANCE_ID.fullmatch(i) and _locked(self._path(i))}  # fmt: skip

    def release(self) -> None:
        with self._lock:
            file, self._file = self._file, None
            if file is not None:
                with suppress(FileNotFoundError):
                    self._path(self.instance_id).unlink()
                file.close()

    def _remove_stale(self) -> None:
        """Dead servers' files go (a presence file whose lock is free is removed as read)."""
        for path in self.directory.glob(f"*{LOCK_SUFFIX}"):
            _locked(path)
        for path in self.directory.glob(".*.new"):
            with suppress(FileNotFoundError):
                if time.time() - path.stat().st_mtime > SCRATCH_STALE_S:
                    _locked(path)


def _locked(path: Path) -> bool:
    """Whether a live process holds the file's lock; a free lock's file is removed."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)
    with suppress(FileNotFoundError):
        path.unlink()
    return False
