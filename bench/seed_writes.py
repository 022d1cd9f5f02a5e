"""Where the bulk seeder (:mod:`bench.seed`) writes: one transaction per batch of jobs,
holding the ledger's write lock as the recorders do (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL:
``LOCK TABLE ... IN EXCLUSIVE MODE``), with the events, their chain rows and the views' rows
(SQLite: ``executemany``; PostgreSQL: ``COPY``) and the views' tracking position."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from eventsourcing.application import Application
from psycopg.sql import SQL, Identifier

from ledger.chain import GENESIS, chain_table
from ledger.database import SQLITE_BUSY_S, Database, PostgresDatabase, SQLiteDatabase
from projections.views import JOB_DETAILS_COLUMNS, JOB_LIST_COLUMNS

VIEWS = "views"
"""The views' tracking name (the server's projector's)."""
CACHE_KIB = 256 * 1024
"""SQLite's page cache while seeding: the indexes of a million jobs' rows stay in memory."""


class Batch:
    """The rows of one transaction, after ledger position ``after`` and its ``digest``, up to
    position ``last`` and digest ``head``. An event's aggregate id is a UUID (PostgreSQL) or its
    32 hex digits (SQLite)."""

    def __init__(self, after: int, digest: str) -> None:
        self.after, self.digest = after, digest
        self.last, self.head = after, digest
        self.events: list[tuple[Any, ...]] = []
        self.chain: list[tuple[Any, ...]] = []
        self.listed: list[tuple[Any, ...]] = []
        self.details: list[tuple[str, str]] = []


class Writer:
    def begin(self) -> tuple[int, str]:
        """Lock the ledger; its last position and digest."""
        raise NotImplementedError

    def write(self, batch: Batch) -> None:
        """Write the batch, move the views' tracking to its last position, commit."""
        raise NotImplementedError

    def rollback(self) -> None:
        raise NotImplementedError

    def analyze(self) -> None:
        """Once every batch is in."""

    def close(self) -> None:
        raise NotImplementedError

    def peek(self) -> tuple[int, str]:
        """The ledger's last position and digest (the views must have caught up)."""
        try:
            return self.begin()
        finally:
            self.rollback()

    def append(self, batch: Batch) -> None:
        """Write the batch in one transaction, if the ledger is still where it was."""
        if self.begin() != (batch.after, batch.digest):
            self.rollback()
            raise RuntimeError("the ledger grew while seeding: no server may write meanwhile")
        self.write(batch)


@contextmanager
def open_writer(app: Application[Any], database: Database) -> Iterator[Writer]:
    """The writer to the ledger of ``app`` and the views of ``database``: one database, as a
    server has them."""
    recorder: Any = app.recorder
    if isinstance(database, SQLiteDatabase):
        if recorder.datastore.pool.db_name != database.path:
            raise ValueError("the seeder writes the ledger and the views in one SQLite file")
        writer: Writer = _SQLiteWriter(database.path, recorder.events_table_name)
    else:
        assert isinstance(database, PostgresDatabase)
        writer = _PostgresWriter(database.conninfo, recorder.datastore.schema,
                                 recorder.events_table_name)  # fmt: skip
    try:
        yield writer
    finally:
        writer.close()


def _views_behind(tracked: int | None, head: int) -> None:
    if (tracked or 0) != head:
        raise RuntimeError(f"the views are at position {tracked or 0}, the ledger at {head}: "
                           "catch them up (no server may write while seeding)")  # fmt: skip


def _insert(table: str, columns: Sequence[str]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


class _SQLiteWriter(Writer):
    def __init__(self, path: str, events: str) -> None:
        self.connection = sqlite3.connect(path, timeout=SQLITE_BUSY_S, isolation_level=None,
                                          check_same_thread=False)  # fmt: skip
        self.connection.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        # As the views' connections: in WAL mode a commit writes the log without waiting for
        # the disk, which the checkpoint then syncs (15,100 to 15,800 jobs/s with FULL against
        # 16,500 to 17,100, 100,000 jobs). A crash of the machine may lose the last batches,
        # never the file's soundness.
        self.connection.execute("PRAGMA synchronous=NORMAL")
        self.events, self.chain = events, chain_table(events)

    def begin(self) -> tuple[int, str]:
        self.connection.execute("BEGIN IMMEDIATE")
        head = self.connection.execute(f"SELECT MAX(rowid) FROM {self.events}").fetchone()[0]
        last = self.connection.execute(
            f"SELECT ledger_digest FROM {self.chain} ORDER BY notification_id DESC LIMIT 1"
        ).fetchone()
        tracked = self.connection.execute("SELECT position FROM projection_tracking WHERE "
                                          "name = ?", (VIEWS,)).fetchone()  # fmt: skip
        _views_behind(tracked[0] if tracked else None, head or 0)
        return head or 0, last[0] if last else GENESIS

    def write(self, batch: Batch) -> None:
        c = self.connection
        c.executemany(f"INSERT INTO {self.events} (originator_id, originator_version, topic, "
                      "state, rowid) VALUES (?, ?, ?, ?, ?)", batch.events)  # fmt: skip
        c.executemany(f"INSERT INTO {self.chain} VALUES (?, ?, ?, ?, ?)", batch.chain)
        c.executemany(_insert("job_list", JOB_LIST_COLUMNS), batch.listed)
        c.executemany(_insert("job_details", JOB_DETAILS_COLUMNS), batch.details)
        c.execute("UPDATE projection_tracking SET position = ? WHERE name = ?",
                  (batch.last, VIEWS))  # fmt: skip
        c.execute("COMMIT")

    def rollback(self) -> None:
        if self.connection.in_transaction:
            self.connection.execute("ROLLBACK")

    def close(self) -> None:
        self.rollback()
        self.connection.close()


class _PostgresWriter(Writer):
    def __init__(self, conninfo: str, schema: str, events: str) -> None:
        self.connection = psycopg.connect(conninfo)
        self.events = SQL("{0}.{1}").format(Identifier(schema), Identifier(events))
        self.chain = SQL("{0}.{1}").format(Identifier(schema), Identifier(chain_table(events)))
        self.sequence = f"{schema}.{events}"
        self._column_types: dict[tuple[str, tuple[str, ...]], list[int]] = {}

    def begin(self) -> tuple[int, str]:
        c = self.connection
        c.execute(SQL("LOCK TABLE {0} IN EXCLUSIVE MODE").format(self.events))
        head = c.execute(SQL("SELECT MAX(notification_id) FROM {0}").format(self.events)
                         ).fetchone()  # fmt: skip
        last = c.execute(SQL("SELECT ledger_digest FROM {0} ORDER BY notification_id DESC "
                             "LIMIT 1").format(self.chain)).fetchone()  # fmt: skip
        tracked = c.execute("SELECT position FROM projection_tracking WHERE name = %s "
                            "FOR UPDATE", (VIEWS,)).fetchone()  # fmt: skip
        position = int(head[0] or 0) if head else 0
        _views_behind(tracked[0] if tracked else None, position)
        return position, str(last[0]) if last else GENESIS

    def _copy(self, table: Any, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """``COPY`` in binary: no value is printed here and parsed there (a text ``COPY``
        sends each event's state as hex)."""
        statement = SQL("COPY {0} ({1}) FROM STDIN (FORMAT BINARY)").format(
            table, SQL(", ").join(Identifier(column) for column in columns)
        )
        types = self._types(table, columns)  # before the copy: it holds the connection
        with self.connection.cursor().copy(statement) as copy:
            copy.set_types(types)
            for row in rows:
                copy.write_row(row)

    def _types(self, table: Any, columns: Sequence[str]) -> list[int]:
        """The type of each of the table's ``columns``, as the binary format needs them."""
        key = (table.as_string(self.connection), tuple(columns))
        if key not in self._column_types:
            found: dict[str, int] = dict(self.connection.execute(
                "SELECT attname, atttypid FROM pg_attribute WHERE attrelid = %s::regclass "
                "AND attnum > 0 AND NOT attisdropped", (key[0],)).fetchall())  # fmt: skip
            self._column_types[key] = [int(found[column]) for column in columns]
        return self._column_types[key]

    def write(self, batch: Batch) -> None:
        self._copy(self.events, ("originator_id", "originator_version", "topic", "state",
                                 "notification_id"), batch.events)  # fmt: skip
        self._copy(self.chain, ("notification_id", "originator_id", "originator_version",
                                "event_hash", "ledger_digest"), batch.chain)  # fmt: skip
        self._copy(SQL("job_list"), JOB_LIST_COLUMNS, batch.listed)
        self._copy(SQL("job_details"), JOB_DETAILS_COLUMNS, batch.details)
        self.connection.execute("SELECT setval(pg_get_serial_sequence(%s, 'notification_id'), "
                                "%s)", (self.sequence, batch.last))  # fmt: skip
        self.connection.execute("UPDATE projection_tracking SET position = %s WHERE name = %s",
                                (batch.last, VIEWS))  # fmt: skip
        self.connection.commit()

    def rollback(self) -> None:
        self.connection.rollback()

    def analyze(self) -> None:
        """Fresh statistics for the planner (as autovacuum would gather soon)."""
        self.connection.rollback()
        self.connection.autocommit = True
        for table in (self.events, self.chain, SQL("job_list"), SQL("job_details")):
            self.connection.execute(SQL("ANALYZE {0}").format(table))

    def close(self) -> None:
        self.connection.close()
