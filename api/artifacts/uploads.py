"""Upload sessions: a node's multipart upload of one checkpoint or output archive, kept in the
operational database's ``artifact_uploads`` table so that any replica continues it.

A session is opened by the agent (the store's upload begun), fed parts (straight to the store,
or through this server for the local store), then completed: the store makes the object (the
session is then ``made``), the server checks it and records it in the ledger (the session then
keeps its ``answer``, so a second complete answers the same). A new session for the same key
replaces an unfinished one: an agent restarted mid-upload starts again.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from api.artifacts.store import StartedUpload
from ledger.database import Cursor, Database, Row
from ledger.schema import create_schema

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS artifact_uploads (
        id TEXT PRIMARY KEY, job_id TEXT NOT NULL, kind TEXT NOT NULL, name TEXT,
        node_id TEXT NOT NULL, node_index BIGINT NOT NULL, key TEXT NOT NULL,
        store_upload_id TEXT NOT NULL, part_size BIGINT NOT NULL, created_at TEXT NOT NULL,
        completed_at TEXT, answer TEXT)""",
    "CREATE INDEX IF NOT EXISTS artifact_uploads_key ON artifact_uploads (key)",
]
_COLUMNS = ("id", "job_id", "kind", "name", "node_id", "node_index", "key", "store_upload_id",
            "part_size", "created_at", "completed_at", "answer")  # fmt: skip


@dataclass(frozen=True)
class UploadSession:
    id: str
    job_id: str
    kind: str
    """``checkpoint`` or ``output``."""
    name: str | None
    """A checkpoint's name; None for an output."""
    node_id: str
    node_index: int
    key: str
    store_upload_id: str
    part_size: int
    created_at: str
    completed_at: str | None = None
    """When the store made the object from the parts."""
    answer: dict[str, Any] | None = None
    """What complete answered, once the ledger recorded the artifact."""

    @property
    def started(self) -> StartedUpload:
        return StartedUpload(self.store_upload_id, self.part_size)

    @classmethod
    def from_row(cls, row: Row) -> UploadSession:
        answer = json.loads(row["answer"]) if row["answer"] else None
        return cls(**{**row, "node_index": int(row["node_index"]),
                      "part_size": int(row["part_size"]), "answer": answer})  # fmt: skip


def new_upload_id() -> str:
    return secrets.token_hex(16)


def now() -> str:
    return datetime.now(UTC).isoformat()


class UploadSessions:
    """The ``artifact_uploads`` table."""

    def __init__(self, database: Database) -> None:
        self.database = database
        with database.transaction(write=True) as cursor:
            create_schema(cursor, SCHEMA)

    def open(self, session: UploadSession) -> list[UploadSession]:
        """Keep a new session; the unfinished sessions of its key it replaces go (returned)."""
        with self.database.transaction(write=True) as cursor:
            replaced = self._unfinished(cursor, session.key)
            cursor.execute("DELETE FROM artifact_uploads WHERE key = ? AND completed_at IS NULL",
                           (session.key,))  # fmt: skip
            values = [getattr(session, column) for column in _COLUMNS[:-1]] + [None]
            cursor.execute(
                f"INSERT INTO artifact_uploads ({', '.join(_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(_COLUMNS))})",
                values,
            )
        return replaced

    def get(self, upload_id: str) -> UploadSession | None:
        with self.database.transaction() as cursor:
            cursor.execute(f"SELECT {', '.join(_COLUMNS)} FROM artifact_uploads WHERE id = ?",
                           (upload_id,))  # fmt: skip
            row = cursor.fetchone()
        return UploadSession.from_row(row) if row is not None else None

    def made(self, upload_id: str) -> None:
        """The store made the object from the session's parts."""
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                "UPDATE artifact_uploads SET completed_at = ? "
                "WHERE id = ? AND completed_at IS NULL",
                (now(), upload_id),
            )

    def answered(self, upload_id: str, answer: dict[str, Any]) -> None:
        """The ledger recorded the artifact: ``answer`` is what every later complete gets."""
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                "UPDATE artifact_uploads SET completed_at = COALESCE(completed_at, ?), "
                "answer = ? WHERE id = ?",
                (now(), json.dumps(answer), upload_id),
            )

    def drop(self, upload_id: str) -> None:
        with self.database.transaction(write=True) as cursor:
            cursor.execute("DELETE FROM artifact_uploads WHERE id = ?", (upload_id,))

    @staticmethod
    def _unfinished(cursor: Cursor, key: str) -> list[UploadSession]:
        cursor.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM artifact_uploads "
            "WHERE key = ? AND completed_at IS NULL",
            (key,),
        )
        return [UploadSession.from_row(row) for row in cursor.fetchall()]
