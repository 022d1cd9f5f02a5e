"""Group commit: the saves that arrive together go to the ledger in one transaction.

A commit is the dear part of a save (the database flushes its log to disk), so under load the
ledger's recorders (:mod:`ledger.chain`) hand each save to a :class:`GroupCommit` rather
than commit it alone. The first caller to find no commit under way leads: it takes every save
waiting, and writes them in one transaction (on PostgreSQL, under one lock of the events
table), each in a savepoint of its own. A save that fails there (an optimistic-concurrency
conflict: another command saved that aggregate's version first) is rolled back to its savepoint
and its caller alone gets the error; its neighbours go on. One commit, then each caller gets its
own notification ids. Saves that arrive while the leader writes wait for its commit, then the
first of them leads the next group, so a group is as large as the load makes it and a lone
save waits for nobody (nor takes a savepoint: its failure is its transaction's).

Each save is still its own events, its own version check, its own answer; the positions of a
group follow one another in the order the saves were written, and the hash chain runs through
them in that order as through any other.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from typing import Any

import psycopg
from eventsourcing import persistence
from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresAggregateRecorder
from psycopg.sql import SQL, Identifier

from ledger.database import sqlite_write_lock

INSERT_ATTEMPTS = 10
"""Tries of a PostgreSQL save whose connection broke (eventsourcing's recorders try ten)."""
INSERT_RETRY_S = 0.2


class Save:
    """One caller's save waiting in a group: its events, and then its answer."""

    __slots__ = ("events", "kwargs", "ids", "error", "written", "leads")

    def __init__(self, events: Sequence[StoredEvent], kwargs: dict[str, Any]) -> None:
        self.events = events
        self.kwargs = kwargs
        self.ids: Sequence[int] | None = None
        self.error: BaseException | None = None
        self.written = threading.Event()
        """Set once the save's group committed (or failed), or once it leads the next one."""
        self.leads = False


Savepoint = Callable[[], AbstractContextManager[None]]
"""Opens a savepoint in the group's transaction; leaving it with an error rolls back to it
and raises the error as the caller should get it, leaving it without one releases it."""
WriteOne = Callable[[Sequence[StoredEvent], dict[str, Any]], Sequence[int] | None]
"""Inserts one save's events (and their chain rows) in the group's transaction."""
Transaction = Callable[[], AbstractContextManager[tuple[Savepoint, WriteOne]]]
"""Opens the group's transaction (committed when left without an error)."""


class GroupCommit:
    """Saves from many threads, committed together (see the module's docstring)."""

    def __init__(self, transaction: Transaction) -> None:
        self._transaction = transaction
        self._mutex = threading.Lock()
        self._waiting: list[Save] = []
        self._leading = False
        self.groups = 0
        """Transactions committed (or tried) so far; saves / groups is the mean group size."""

    def save(self, events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        """Write ``events`` in the next group; their notification ids once it committed. Raises
        the error of this save alone (its conflict), or of its whole group (a lost connection)."""
        save = Save(events, kwargs)
        with self._mutex:
            self._waiting.append(save)
            save.leads = not self._leading
            self._leading = True
        if not save.leads:
            save.written.wait()
        if save.leads:
            self._lead()
        if save.error is not None:
            raise save.error
        return save.ids

    def _lead(self) -> None:
        with self._mutex:
            group, self._waiting = self._waiting, []
        try:
            self._write(group)
        finally:
            for save in group:
                save.written.set()
            with self._mutex:
                if self._waiting:  # they came while this group was written: the first leads
                    follower = self._waiting[0]
                    follower.leads = True
                    follower.written.set()
                else:
                    self._leading = False

    def _write(self, group: list[Save]) -> None:
        self.groups += 1
        alone = len(group) == 1  # its failure is the transaction's: no savepoint needed
        try:
            with self._transaction() as (savepoint, write_one):
                for save in group:
                    if alone:
                        save.ids = write_one(save.events, save.kwargs)
                        continue
                    try:
                        with savepoint():
                            save.ids = write_one(save.events, save.kwargs)
                    except GroupBroken:
                        raise
                    except Exception as error:  # rolled back to its savepoint: its own
                        save.error = error
        except BaseException as error:  # nothing of the group was committed
            cause = error.__cause__ if isinstance(error, GroupBroken) else error
            if isinstance(cause, Exception):
                cause = _translated(cause)  # as a savepoint gives it (a lone save has none)
            for save in group:
                if save.error is None:
                    save.ids, save.error = None, cause or error
            if not isinstance(error, Exception):
                raise


class GroupBroken(Exception):
    """Raised from a savepoint whose save failed in a way that breaks the whole transaction
    (a lost connection, a locked database): every save of the group gets its cause."""


# -- the recorders' side -----------------------------------------------------------------


class SQLiteGroupCommit:
    """Mixed into an SQLite application recorder: its saves are committed in groups."""

    datastore: Any
    _insert_events: Callable[..., Sequence[int] | None]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group_commit = GroupCommit(self._group_transaction)
        self._write_lock = sqlite_write_lock(self.datastore.pool.db_name)
        """Shared with this process's views on the file: writers queue there, not in SQLite."""

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        if not stored_events:
            return super().insert_events(stored_events, **kwargs)  # type: ignore[misc]
        return self.group_commit.save(stored_events, **kwargs)

    @contextmanager
    def _group_transaction(self) -> Iterator[tuple[Savepoint, WriteOne]]:
        with self._write_lock, self.datastore.transaction(commit=True) as cursor:

            def write_one(events: Sequence[StoredEvent], kwargs: dict[str, Any]) -> Any:
                return self._insert_events(cursor, events, **kwargs)

            yield partial(_sqlite_savepoint, cursor), write_one


class PostgresGroupCommit:
    """Mixed into a PostgreSQL application recorder: its saves are committed in groups, each
    group under one lock of the events table. ``ledger_channel``, when set, is told the
    group's last position (``NOTIFY``, delivered as it commits)."""

    datastore: Any
    _insert_events: Callable[..., None]
    _fetch_ids_after_insert_events: Callable[..., Sequence[int] | None]
    _lock_table: Callable[[Any], None]
    _notify_channel: Callable[[Any], None]
    events_table_name: str
    ledger_channel: str | None = None
    group_open = False
    """True while a group's transaction is open (in the leader's thread: groups take turns)."""
    chain_head: str | None = None
    """In a group, the ledger digest after its last save written (the chain goes on from it
    rather than read it again); None: read it."""
    hashes_written: list[tuple[tuple[str, int], str]]
    """In a group, each event's hash by ``(aggregate, version)``, for :meth:`hashes_committed`
    once the group committed (set by the chain)."""

    def hashes_committed(self) -> None:
        """The group committed: what ``hashes_written`` holds is in the ledger for good."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group_commit = GroupCommit(self._group_transaction)

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Tried again on a lost connection (as eventsourcing's recorders are). The answer to
        a ``COMMIT`` can be lost with the connection after the commit was made: when the next
        try then meets events with the same aggregates and versions, and they are these very
        events, this save was committed (its positions are returned), not refused."""
        uncertain = False
        for attempt in range(1, INSERT_ATTEMPTS + 1):
            try:
                if not stored_events or self.datastore.enable_db_functions:
                    return super().insert_events(stored_events, **kwargs)  # type: ignore[misc]
                return self.group_commit.save(stored_events, **kwargs)
            except (persistence.InterfaceError, persistence.OperationalError):
                if attempt == INSERT_ATTEMPTS:
                    raise
                uncertain = True
                time.sleep(INSERT_RETRY_S)
            except persistence.IntegrityError:
                committed = self._committed(stored_events) if uncertain else None
                if committed is None:
                    raise
                return committed
        raise AssertionError("unreachable")  # pragma: no cover

    def _committed(self, stored_events: Sequence[StoredEvent]) -> list[int] | None:
        """The positions of these very events (same topic and state) if the ledger holds
        them all; None if it does not (another save took their versions)."""
        table = SQL("{0}.{1}").format(Identifier(self.datastore.schema),
                                      Identifier(self.events_table_name))  # fmt: skip
        statement = SQL("SELECT notification_id, topic, state FROM {0} WHERE originator_id = %s "
                        "AND originator_version = %s").format(table)  # fmt: skip
        positions = []
        with self.datastore.get_connection() as connection, connection.cursor() as curs:
            for event in stored_events:
                curs.execute(statement, (event.originator_id, event.originator_version))
                row = curs.fetchone()
                if row is None or (row["topic"], bytes(row["state"])) != (
                    event.topic, bytes(event.state)
                ):  # fmt: skip
                    return None
                positions.append(int(row["notification_id"]))
        return positions

    @contextmanager
    def _group_transaction(self) -> Iterator[tuple[Savepoint, WriteOne]]:
        written: list[int] = []

        def write_one(events: Sequence[StoredEvent], kwargs: dict[str, Any]) -> Any:
            head, hashed = self.chain_head, len(self.hashes_written)
            try:
                self._insert_events(curs, events, **kwargs)
                # the aggregate recorder's insert: this one locked and notified for the group
                PostgresAggregateRecorder._insert_stored_events(self, curs, events)  # type: ignore[arg-type]
                positions = self._fetch_ids_after_insert_events(curs, events, **kwargs)
            except BaseException:
                self.chain_head = head  # its chain rows are rolled back with it
                del self.hashes_written[hashed:]
                raise
            written.extend(positions or ())
            return positions

        self.chain_head, self.group_open, self.hashes_written = None, True, []
        try:
            with (self.datastore.get_connection() as conn, conn.transaction(),
                  conn.cursor() as curs):  # fmt: skip
                self._lock_table(curs)
                self._notify_channel(curs)
                yield partial(_postgres_savepoint, conn), write_one
                if written and self.ledger_channel:
                    curs.execute("SELECT pg_notify(%s, %s)",
                                 (self.ledger_channel, str(max(written))))  # fmt: skip
            self.hashes_committed()
        finally:
            self.chain_head, self.group_open, self.hashes_written = None, False, []


@contextmanager
def _sqlite_savepoint(cursor: Any) -> Iterator[None]:
    cursor.execute("SAVEPOINT group_save")
    try:
        yield
    except Exception as error:
        if isinstance(error, sqlite3.OperationalError | sqlite3.InterfaceError):
            raise GroupBroken() from _translated(error)
        try:
            cursor.execute("ROLLBACK TO group_save")
            cursor.execute("RELEASE group_save")
        except Exception as broken:
            raise GroupBroken() from _translated(broken)
        raise _translated(error) from error
    cursor.execute("RELEASE group_save")


@contextmanager
def _postgres_savepoint(conn: psycopg.Connection[Any]) -> Iterator[None]:
    try:
        with conn.transaction():  # SAVEPOINT, then RELEASE, or ROLLBACK TO on an error
            yield
    except (psycopg.OperationalError, psycopg.InterfaceError) as error:
        raise GroupBroken() from _translated(error)
    except Exception as error:
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
            raise GroupBroken() from _translated(error)  # not rolled back to the savepoint
        raise _translated(error) from error


_TRANSLATED: tuple[tuple[tuple[type[Exception], ...], type[Exception]], ...] = (
    ((sqlite3.IntegrityError, psycopg.IntegrityError), persistence.IntegrityError),
    ((sqlite3.OperationalError, psycopg.OperationalError), persistence.OperationalError),
    ((sqlite3.InterfaceError, psycopg.InterfaceError), persistence.InterfaceError),
    ((sqlite3.DataError, psycopg.DataError), persistence.DataError),
    ((sqlite3.ProgrammingError, psycopg.ProgrammingError), persistence.ProgrammingError),
    ((sqlite3.InternalError, psycopg.InternalError), persistence.InternalError),
    ((sqlite3.NotSupportedError, psycopg.NotSupportedError), persistence.NotSupportedError),
    ((sqlite3.DatabaseError, psycopg.DatabaseError), persistence.DatabaseError),
)


def _translated(error: Exception) -> Exception:
    """A driver's error as eventsourcing's (an ``IntegrityError`` is what the application
    turns into a conflict), as its recorders raise them."""
    for raw, ours in _TRANSLATED:
        if isinstance(error, raw):
            return ours(str(error))
    return error
