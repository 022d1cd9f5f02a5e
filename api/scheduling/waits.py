"""Why each waiting job waits: written by the scheduler every round, read by list and inspect.

This is not a lifecycle change, so it is not in the ledger: it changes with every job that
starts or ends elsewhere. It is kept beside the views, one row per waiting job.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from projections.db import Database

SCHEMA = """CREATE TABLE IF NOT EXISTS job_waits (
    job_id TEXT PRIMARY KEY, reason TEXT NOT NULL, detail TEXT NOT NULL,
    updated_at TEXT NOT NULL)"""


class Waits:
    def __init__(self, database: Database) -> None:
        self.database = database
        self._written: dict[str, dict[str, Any]] | None = None
        with database.transaction(write=True) as cursor:
            cursor.execute(SCHEMA)

    def replace(self, waits: Mapping[str, dict[str, Any]]) -> None:
        """The waiting jobs now, each ``{"reason": one line, ...detail}``; others are dropped.

        A round that finds what the last one wrote writes nothing (no write transaction every
        round of an idle scheduler)."""
        if waits == self._written:
            return
        at = datetime.now(UTC).isoformat()
        written = self._written or {}
        with self.database.transaction(write=True) as cursor:
            if self._written is None:  # first round of this server: other rows may be stale
                cursor.execute("SELECT job_id FROM job_waits")
                written = {row["job_id"]: {} for row in cursor.fetchall()}
            for job_id in set(written) - set(waits):
                cursor.execute("DELETE FROM job_waits WHERE job_id = ?", (job_id,))
            for job_id, wait in waits.items():
                if written.get(job_id) == wait:
                    continue
                cursor.execute(
                    "INSERT INTO job_waits (job_id, reason, detail, updated_at) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (job_id) DO UPDATE SET "
                    "reason = excluded.reason, detail = excluded.detail, "
                    "updated_at = excluded.updated_at",
                    (job_id, wait["reason"], json.dumps(wait), at),
                )
        self._written = dict(waits)

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
        if row is None:
            return None
        detail: dict[str, Any] = json.loads(row["detail"])
        return {**detail, "updated_at": row["updated_at"]}
