"""Why each waiting job waits: written by the scheduler every round, read by list and inspect.

This is not a lifecycle change, so it is not in the ledger: it changes with every job that
starts or ends elsewhere. It is kept beside the views, one row per waiting job.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from ledger.database import Database

SCHEMA = """CREATE TABLE IF NOT EXISTS job_waits (
    job_id TEXT PRIMARY KEY, reason TEXT NOT NULL, detail TEXT NOT NULL,
    updated_at TEXT NOT NULL)"""
LINE_SCHEMA = """CREATE TABLE IF NOT EXISTS scheduling_line (
    id INTEGER PRIMARY KEY CHECK (id = 1), waiting INTEGER NOT NULL, updated_at TEXT NOT NULL)"""

LINE_KEY = "of"
"""How many jobs wait in ``scheduling`` (the "of 40" of "place in line: 3 of 40"): the same
for every job there, so it is kept once, not in each job's row. A job joining the end of the
line then rewrites no one else's row."""
WRITE_WAIT = ("INSERT INTO job_waits (job_id, reason, detail, updated_at) VALUES (?, ?, ?, ?) "
              "ON CONFLICT (job_id) DO UPDATE SET reason = excluded.reason, "
              "detail = excluded.detail, updated_at = excluded.updated_at")  # fmt: skip
WRITE_LINE = ("INSERT INTO scheduling_line (id, waiting, updated_at) VALUES (1, ?, ?) "
              "ON CONFLICT (id) DO UPDATE SET waiting = excluded.waiting, "
              "updated_at = excluded.updated_at")  # fmt: skip


class Waits:
    def __init__(self, database: Database) -> None:
        self.database = database
        self._written: dict[str, dict[str, Any]] | None = None
        self._line: int | None = None
        self.version = 0
        """Counts the rounds of this process's scheduler that changed a reason: a page that
        shows reasons reads them again when it moves (another replica's are polled)."""
        with database.transaction(write=True) as cursor:
            cursor.execute(SCHEMA)
            cursor.execute(LINE_SCHEMA)

    def replace(self, waits: Mapping[str, dict[str, Any]], line: int = 0) -> None:
        """The waiting jobs now, each ``{"reason": one line, ...detail}``, and how many wait to
        be placed (``line``); others are dropped. The detail is not changed afterwards.

        Only the rows that changed are written, all in one statement (a round that finds what
        the last one wrote writes nothing: no write transaction every round of an idle
        scheduler). A detail that is the very object written last time is not even compared
        (the scheduler hands the same object while nothing in it changed)."""
        rows = dict(waits)
        if rows == self._written and line == self._line:
            return
        at = datetime.now(UTC).isoformat()
        written = self._written or {}
        with self.database.transaction(write=True) as cursor:
            if self._written is None:  # first round of this server: other rows may be stale
                cursor.execute("SELECT job_id FROM job_waits")
                written = {row["job_id"]: {} for row in cursor.fetchall()}
            gone = [(job_id,) for job_id in written if job_id not in rows]
            if gone:
                cursor.executemany("DELETE FROM job_waits WHERE job_id = ?", gone)
            changed = [(job_id, wait["reason"], json.dumps(wait), at)
                       for job_id, wait in rows.items()
                       if written.get(job_id) is not wait
                       and written.get(job_id) != wait]  # fmt: skip
            if changed:
                cursor.executemany(WRITE_WAIT, changed)
            if line != self._line:
                cursor.execute(WRITE_LINE, (line, at))
        self._written, self._line = rows, line
        self.version += 1

    def add(self, waits: Mapping[str, dict[str, Any]], line: int) -> None:
        """More waiting jobs (none of them written before), and how many wait now."""
        if self._written is None:
            self.replace(waits, line)
            return
        at = datetime.now(UTC).isoformat()
        with self.database.transaction(write=True) as cursor:
            cursor.executemany(WRITE_WAIT, [(job_id, wait["reason"], json.dumps(wait), at)
                                            for job_id, wait in waits.items()])  # fmt: skip
            cursor.execute(WRITE_LINE, (line, at))
        self._written.update(waits)
        self._line = line
        self.version += 1

    def reasons(self, job_ids: Iterable[str]) -> dict[str, str]:
        wanted = list(job_ids)
        if not wanted:
            return {}
        marks = ", ".join("?" * len(wanted))
        with self.database.transaction() as cursor:
            cursor.execute(
                f"SELECT job_id, reason FROM job_waits WHERE job_id IN ({marks})", wanted
            )
            return {str(row["job_id"]): str(row["reason"]) for row in cursor.fetchall()}

    def detail(self, job_id: str) -> dict[str, Any] | None:
        with self.database.transaction() as cursor:
            cursor.execute("SELECT detail, updated_at FROM job_waits WHERE job_id = ?", (job_id,))
            row = cursor.fetchone()
            detail: dict[str, Any] = json.loads(row["detail"]) if row is not None else {}
            if "order" in detail:  # a place in the scheduling line: of how many
                cursor.execute("SELECT waiting FROM scheduling_line WHERE id = 1")
                line = cursor.fetchone()
                detail[LINE_KEY] = int(line["waiting"]) if line is not None else 0
            heard = [node for node in detail.get("nodes", ()) if "node_id" in node]
            if heard:  # when each candidate node was last heard of, as of now
                marks = ", ".join("?" * len(heard))
                cursor.execute(f"SELECT node_id, last_seen FROM node_heartbeats "
                               f"WHERE node_id IN ({marks})",
                               [node["node_id"] for node in heard])  # fmt: skip
                seen = {str(r["node_id"]): str(r["last_seen"]) for r in cursor.fetchall()}
                for node in heard:
                    node["last_heard"] = seen.get(node.pop("node_id"))
        if row is None:
            return None
        return {**detail, "updated_at": row["updated_at"]}
