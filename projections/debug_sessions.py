"""The ``debug_sessions`` view: every debug session recorded on a job, which server process
relays it, and whether it is still open in the ledger.

Servers read the open ones to close those whose relay is gone (:mod:`api.debug.orphans`).
"""

from __future__ import annotations

from typing import Any

from ledger.database import Cursor

DEBUG_SESSION_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS debug_sessions (
        job_id TEXT NOT NULL, id TEXT NOT NULL, node TEXT, relay TEXT,
        opened_at TEXT NOT NULL, closed_at TEXT, position BIGINT NOT NULL,
        PRIMARY KEY (job_id, id))""",
    # The open ones are few among all that ever were: read every few seconds by the leader.
    """CREATE INDEX IF NOT EXISTS debug_sessions_open ON debug_sessions (job_id)
        WHERE closed_at IS NULL""",
]
DEBUG_SESSION_EVENTS = frozenset({"DebugSessionOpened", "DebugSessionClosed"})


def apply_debug_session_event(cursor: Cursor, name: str, domain_event: Any, position: int) -> None:
    """``DebugSessionOpened`` adds the session's row; ``DebugSessionClosed`` closes it."""
    job_id = str(domain_event.originator_id)
    at = domain_event.timestamp.isoformat()
    if name == "DebugSessionOpened":
        cursor.execute(
            "INSERT INTO debug_sessions (job_id, id, node, relay, opened_at, position) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (job_id, id) DO NOTHING",
            (job_id, domain_event.session_id, domain_event.node,
             getattr(domain_event, "relay", None), at, position),
        )  # fmt: skip
    elif name == "DebugSessionClosed":
        cursor.execute(
            "UPDATE debug_sessions SET closed_at = ?, position = ? WHERE job_id = ? AND id = ?",
            (at, position, job_id, domain_event.session_id),
        )
