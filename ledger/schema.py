"""How servers make their tables: in turn when they start together (:func:`schema_lock`), and
without the locks that would hold up, or deadlock with, a live replica's writes
(:func:`create_schema`)."""

from __future__ import annotations

import fcntl
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from ledger.database import SCHEMA_LOCK_KEY, Cursor, Database, PostgresDatabase, SQLiteDatabase

_INDEX = re.compile(r"\s*CREATE (?:UNIQUE )?INDEX IF NOT EXISTS (\w+)", re.IGNORECASE)


def create_schema(cursor: Cursor, statements: Iterable[str]) -> None:
    """Run ``statements`` (``CREATE ... IF NOT EXISTS``), passing over each index PostgreSQL
    holds already: even then, ``CREATE INDEX IF NOT EXISTS`` takes a SHARE lock on its table,
    which waits for every write to it and holds up the next ones, and two of them in one
    transaction deadlock with another replica's writes to both tables (a replica restarted
    under load exited so, 'deadlock detected', in the soak)."""
    postgres = getattr(cursor, "dialect", "sqlite") == "postgresql"
    for statement in statements:
        index = _INDEX.match(statement)
        if postgres and index is not None:
            cursor.execute("SELECT to_regclass(?) IS NOT NULL AS found", (index.group(1),))
            if (cursor.fetchone() or {}).get("found"):
                continue
        cursor.execute(statement)



@contextmanager
def schema_lock(database: Database) -> Iterator[None]:
    """Servers that start together on one database make their tables one at a time. On
    PostgreSQL, ``CREATE TABLE IF NOT EXISTS`` (and a type) racing its twin fails with a unique
    violation rather than finding it there; on SQLite, a fresh file's first connections turn it
    to WAL and the ledger's recorder makes its tables in deferred transactions, and two that
    meet are refused at once ('database is locked': SQLite gives up rather than deadlock,
    whatever the busy timeout), so the starters take turns on a lock file beside it."""
    if isinstance(database, SQLiteDatabase):
        if database.path in ("", ":memory:") or database.path.startswith("file:"):
            yield
            return
        with open(f"{database.path}.start-lock", "a") as turn:
            fcntl.flock(turn, fcntl.LOCK_EX)  # let go of when the file closes
            yield
        return
    if not isinstance(database, PostgresDatabase):
        yield
        return
    with database.dedicated_connection() as connection:  # its close lets go of the lock
        connection.execute("SELECT pg_advisory_lock(%s)", (SCHEMA_LOCK_KEY,))
        yield
