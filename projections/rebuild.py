"""Rebuild every view from the first event into fresh tables, then swap them in at once.

A second :class:`Projector` folds the whole ledger into shadow tables (SQLite: a file of their
own beside the database; PostgreSQL: the schema ``flexai_rebuild`` of the same database) while
the live views keep serving and following the ledger. Then, in one transaction on the live
views, with their tracking row locked (so no projector of any replica applies an event
meanwhile): the shadow catches up to at least where the live views are, the shadow's tables
take the live ones' place (SQLite: the rows that differ are written in, the others left as they
are; PostgreSQL: the tables themselves move from schema to schema, with their indexes and
statistics, no row copied), and the tracking position becomes the shadow's. Readers see the
old views until that commit and the rebuilt ones after it: never an empty moment.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import closing, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlparse, urlunparse

from eventsourcing.application import Application

from ledger.database import Cursor, Database, PostgresDatabase, SQLiteDatabase
from projections.bulk import BulkFold, Sink, collector_paused, ledger_events
from projections.projector import Projector
from projections.views import SCHEMA, VIEW_TABLES

log = logging.getLogger(__name__)
SHADOW_SCHEMA = "flexai_rebuild"
SHADOW_ALIAS = "rebuild"
RETIRED_SCHEMA = "flexai_retired_views"
"""PostgreSQL: where the swap moves the views it replaced, until they are dropped."""
CACHE_KIB = 256 * 1024
"""SQLite's page cache for the fold's writes into the shadow file (the default 2 MiB spills a
big transaction's pages to the disk and reads them back)."""
PROGRESS_EVERY = 1000
"""Events folded between two updates of :attr:`RebuildProgress.position`."""
LIST_INDEXES = tuple(
    match[1]
    for statement in SCHEMA
    if (match := re.match(r"CREATE INDEX IF NOT EXISTS (job_list_\w+)", statement))
)
"""``job_list``'s indexes for the list queries: the SQLite file a rebuild folds into has none
(no fold reads by them, and its rows go to the live views' tables or PostgreSQL's shadow ones,
which have them): 8 index entries fewer a job written (2,000 jobs: 198 -> 193 ms)."""
FOLD_PAGE_BYTES = 16 * 1024
"""The page size of the SQLite file a rebuild folds into, four times SQLite's default: with
each job's document (2.3 KB) in a 4 KiB page, the fold's inserts split pages all the time (its
writes at 2,000 jobs: 34 ms, 26 with these pages)."""


class RebuildRunning(Exception):
    """Another rebuild of these views has not finished."""


@dataclass
class RebuildProgress:
    state: str = "idle"
    """``idle``, ``running``, ``done`` or ``failed``."""
    started_at: str | None = None
    finished_at: str | None = None
    position: int = 0
    """Events the shadow views have folded so far."""
    head: int = 0
    """The ledger's last position when the rebuild began."""
    rows: dict[str, int] = field(default_factory=dict)
    """Rows of each view table once swapped in."""
    seconds: float | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def _now() -> str:
    return datetime.now(UTC).isoformat()


class Rebuilder:
    """Rebuilds the views of ``live`` (one rebuild at a time per server)."""

    def __init__(
        self,
        app: Application[Any],
        live: Projector,
        database: Database,
        *,
        shadow_sqlite_path: Path | None = None,
    ) -> None:
        self.app = app
        self.live = live
        self.database = database
        self.shadow_sqlite_path = shadow_sqlite_path
        self.progress = RebuildProgress()
        self._running = threading.Lock()

    def start(self) -> RebuildProgress:
        """Begin a rebuild in a thread of its own; :class:`RebuildRunning` if one runs."""
        self._begin()
        threading.Thread(target=self._run_and_release, name="views-rebuild", daemon=True).start()
        return self.progress

    def run(self) -> RebuildProgress:
        """Rebuild now, in this thread."""
        self._begin()
        self._run_and_release()
        return self.progress

    def _run_and_release(self) -> None:
        began = time.monotonic()
        try:
            self._rebuild()
            self.progress.state = "done"
        except Exception as error:
            log.exception("views rebuild failed")
            self.progress.state = "failed"
            self.progress.error = f"{type(error).__name__}: {error}"
        finally:
            self.progress.finished_at = _now()
            self.progress.seconds = round(time.monotonic() - began, 3)
            self._running.release()

    # -- the rebuild -------------------------------------------------------------------

    def _begin(self) -> None:
        """Take the lock and start the progress at the ledger's last position (what the rebuild
        folds up to, and what its answer tells), read first: a read that fails holds nothing."""
        head = int(self.app.recorder.max_notification_id() or 0)  # type: ignore[attr-defined]
        if not self._running.acquire(blocking=False):
            raise RebuildRunning()
        self.progress = RebuildProgress(state="running", started_at=_now(), head=head)

    def _rebuild(self) -> None:
        shadow_db, attach, detach = self._shadow()
        try:
            shadow = Projector(self.app, shadow_db)
            if isinstance(shadow_db, PostgresDatabase):
                self._fold_in_a_file_then_copy(shadow_db)
            else:
                assert isinstance(shadow_db, SQLiteDatabase)
                self._fold_in_bulk(shadow_db, shadow.name)
            self._fold(shadow)
            if isinstance(shadow_db, PostgresDatabase):
                with shadow_db.transaction(write=True) as cursor:
                    for table in VIEW_TABLES:  # the planner's statistics move with them
                        cursor.execute(f"ANALYZE {table}")
            attach()
            try:
                with self.live.held(), self.database.transaction(write=True) as cursor:
                    live_position = self._lock_tracking(cursor)
                    while self._fold(shadow) < live_position:
                        time.sleep(0.01)  # the ledger's head, already written, is readable
                    self.progress.rows = self._swap(cursor, shadow.position())
                log.info("views rebuilt from the ledger up to position %d and swapped in "
                         "(%s)", self.progress.position, self.progress.rows)  # fmt: skip
            finally:
                detach()
        finally:
            shadow_db.close()
            self._drop_shadow()

    def _fold_in_a_file_then_copy(self, shadow_db: PostgresDatabase) -> None:
        """PostgreSQL: fold the ledger into views in a local SQLite file first (see
        :meth:`_fold_in_bulk`), then bulk-load them into the shadow schema with COPY and set
        its tracking to where the file got; the shadow projector goes on from there. The jobs'
        rows still held in memory at the end (all of them, up to ``MAX_DOCUMENTS`` jobs) are
        copied straight from memory, not written to the file and read back. The same
        view code writes both (their tables' columns are TEXT, BIGINT and DOUBLE in both
        dialects)."""
        with tempfile.TemporaryDirectory(prefix="flexai-rebuild-") as scratch:
            local = _fresh_sqlite(Path(scratch) / "views.sqlite3")
            try:
                Projector(self.app, local, self.live.name)  # the tables
                position = self._fold_in_bulk(local, self.live.name, shadow_db.copy_rows)
                for table in VIEW_TABLES:
                    with local.transaction() as cursor:
                        columns = self._sqlite_columns(cursor, table)
                    rows = local._connection().execute(f"SELECT {', '.join(columns)} "
                                                       f"FROM {table}")  # fmt: skip
                    shadow_db.copy_rows(table, columns, rows)
                with shadow_db.transaction(write=True) as cursor:
                    cursor.execute("UPDATE projection_tracking SET position = ? WHERE name = ?",
                                   (position, self.live.name))  # fmt: skip
            finally:
                local.close()

    def _fold_in_bulk(self, views: SQLiteDatabase, name: str, sink: Sink | None = None) -> int:
        """Fold the ledger up to its head (when the rebuild began) into the empty views of a
        SQLite file in one transaction: each job's document in memory, its rows written once
        (:class:`projections.bulk.BulkFold`), rather than read and written back per event;
        the jobs' last rows to ``sink`` if given."""
        connection = views._connection()
        connection.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        # A scratch file, dropped if the rebuild fails: its pages go straight into it (no
        # write-ahead log to copy back at the checkpoint), with no fsync; the rollback
        # journal stays in memory, so a batch of the catch-up that fails still rolls back.
        connection.execute("PRAGMA journal_mode = MEMORY")
        connection.execute("PRAGMA synchronous = OFF")
        for index in LIST_INDEXES:  # see there
            connection.execute(f"DROP INDEX IF EXISTS {index}")
        with collector_paused(), views.transaction(write=True) as cursor:
            fold = BulkFold(cursor, connection)
            for domain_event, position, at in ledger_events(self.app, 0, self.progress.head):
                fold.apply(domain_event, position, at)
                if position % PROGRESS_EVERY == 0:
                    self.progress.position = position
            fold.flush(sink)
            cursor.execute("UPDATE projection_tracking SET position = ? WHERE name = ?",
                           (fold.position, name))  # fmt: skip
        self.progress.position = fold.position
        return fold.position

    @staticmethod
    def _sqlite_columns(cursor: Cursor, table: str) -> list[str]:
        cursor.execute(f"SELECT name FROM pragma_table_info('{table}')")
        return [str(row["name"]) for row in cursor.fetchall()]

    def _fold(self, shadow: Projector) -> int:
        position = shadow.catch_up()
        self.progress.position = position
        return position

    def _lock_tracking(self, cursor: Cursor) -> int:
        lock = " FOR UPDATE" if self.database.dialect == "postgres" else ""
        cursor.execute(f"SELECT position FROM projection_tracking WHERE name = ?{lock}",
                       (self.live.name,))  # fmt: skip
        row = cursor.fetchone()
        return int(row["position"]) if row else 0

    def _swap(self, cursor: Cursor, position: int) -> dict[str, int]:
        rows = {}
        if self.database.dialect == "postgres":
            self._move_tables(cursor)
        for table in VIEW_TABLES:
            if self.database.dialect == "sqlite":
                self._copy_table(cursor, table)
            cursor.execute(f"SELECT COUNT(*) AS n FROM {table}")
            row = cursor.fetchone()
            rows[table] = int(row["n"]) if row else 0
        cursor.execute("UPDATE projection_tracking SET position = ? WHERE name = ?",
                       (position, self.live.name))  # fmt: skip
        return rows

    def _copy_table(self, cursor: Cursor, table: str) -> None:
        """SQLite: the live table made equal to the shadow file's, writing only the rows that
        differ where most are right: the live rows with no equal row in the shadow go, then the
        shadow's rows with no equal row left in the live table come in, unless as many rows
        are left as the shadow holds (every view table has a primary key: no two rows are
        equal). Views that were right take one read and no write: no page to the write-ahead
        log, none for its checkpoint to copy back, and the live views' write lock held that
        much less. Where most rows differ, all are replaced, as checking each would cost more
        than it spares."""
        columns = self._sqlite_columns(cursor, table)
        names = ", ".join(columns)

        def equal(this: str, that: str) -> str:
            return " AND ".join(f"{this}.{column} IS {that}.{column}" for column in columns)

        shadow = f"{SHADOW_ALIAS}.{table}"
        stale = (f"FROM main.{table} AS live WHERE NOT EXISTS (SELECT 1 FROM {shadow} AS new "
                 f"WHERE {equal('new', 'live')})")  # fmt: skip
        cursor.execute(f"SELECT (SELECT COUNT(*) {stale}) AS stale, (SELECT COUNT(*) FROM "
                       f"main.{table}) AS live, (SELECT COUNT(*) FROM {shadow}) AS new")
        row = cursor.fetchone()
        assert row is not None
        stale_rows, live, new = int(row["stale"]), int(row["live"]), int(row["new"])
        if stale_rows * 2 > live:
            cursor.execute(f"DELETE FROM main.{table}")
            cursor.execute(f"INSERT INTO main.{table} ({names}) SELECT {names} FROM {shadow}")
            return
        if stale_rows:
            cursor.execute(f"DELETE FROM main.{table} WHERE rowid IN (SELECT live.rowid {stale})")
        if live - stale_rows == new:  # each row left has its equal in the shadow: all are there
            return
        cursor.execute(f"INSERT INTO main.{table} ({names}) SELECT {names} FROM {shadow} AS new "
                       f"WHERE NOT EXISTS (SELECT 1 FROM main.{table} AS live "
                       f"WHERE {equal('live', 'new')})")  # fmt: skip

    def _move_tables(self, cursor: Cursor) -> None:
        """PostgreSQL: the shadow tables, with their indexes, take the live ones' place in
        their schema, and the live ones go to :data:`RETIRED_SCHEMA`, dropped after the commit;
        no row is copied. Each move waits for the table's readers of the moment (a statement
        each: reads run outside transactions) and holds new ones until the commit."""
        cursor.execute("SELECT current_schema() AS name")
        row = cursor.fetchone()
        live = '"' + str(row["name"] if row else "public").replace('"', '""') + '"'
        cursor.execute(f"CREATE SCHEMA {RETIRED_SCHEMA}")
        for table in VIEW_TABLES:
            cursor.execute(f"ALTER TABLE {live}.{table} SET SCHEMA {RETIRED_SCHEMA}")
            cursor.execute(f"ALTER TABLE {SHADOW_SCHEMA}.{table} SET SCHEMA {live}")

    # -- where the shadow views live ---------------------------------------------------

    def _shadow(self) -> tuple[Database, Callable[[], None], Callable[[], None]]:
        """A fresh, empty shadow database; how to make it readable from the live views'
        transaction (SQLite: ATTACH on this thread's connection), and how to undo that."""
        self._drop_shadow()
        if isinstance(self.database, SQLiteDatabase):
            path = self.shadow_sqlite_path or Path(f"{self.database.path}.views-rebuild")
            live = self.database

            def attach() -> None:
                live._connection().execute(f"ATTACH DATABASE ? AS {SHADOW_ALIAS}", (str(path),))

            def detach() -> None:
                with suppress(Exception):
                    live._connection().execute(f"DETACH DATABASE {SHADOW_ALIAS}")

            return _fresh_sqlite(path), attach, detach
        assert isinstance(self.database, PostgresDatabase)
        with self.database.transaction(write=True) as cursor:
            cursor.execute(f"CREATE SCHEMA IF NOT EXISTS {SHADOW_SCHEMA}")
        return PostgresDatabase(_with_search_path(self.database.conninfo, SHADOW_SCHEMA),
                                max_size=2), (lambda: None), (lambda: None)  # fmt: skip

    def _drop_shadow(self) -> None:
        if isinstance(self.database, SQLiteDatabase):
            path = self.shadow_sqlite_path or Path(f"{self.database.path}.views-rebuild")
            for suffix in ("", "-wal", "-shm"):
                with suppress(FileNotFoundError):
                    os.unlink(f"{path}{suffix}")
            return
        with self.database.transaction(write=True) as cursor:
            cursor.execute(f"DROP SCHEMA IF EXISTS {SHADOW_SCHEMA} CASCADE")
            cursor.execute(f"DROP SCHEMA IF EXISTS {RETIRED_SCHEMA} CASCADE")


def _fresh_sqlite(path: Path) -> SQLiteDatabase:
    """A new SQLite file for a rebuild to fold into, of :data:`FOLD_PAGE_BYTES` pages."""
    with closing(sqlite3.connect(path)) as made:
        made.execute(f"PRAGMA page_size = {FOLD_PAGE_BYTES}")
        made.execute("PRAGMA journal_mode = WAL")  # the file's header written: its page size set
    return SQLiteDatabase(str(path))


def _with_search_path(conninfo: str, schema: str) -> str:
    """The URL with ``options=-csearch_path=SCHEMA`` (libpq's way to set it per session)."""
    parts = urlparse(conninfo)
    query = [(key, value) for key, value in parse_qsl(parts.query) if key != "options"]
    query.append(("options", f"-csearch_path={schema}"))
    return urlunparse(parts._replace(query=urlencode(query)))
