"""Operational state beside the ledger: API tokens and node heartbeats."""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path

from projections.db import Database

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS api_tokens (
        token_hash TEXT PRIMARY KEY, user_id TEXT NOT NULL, created_at TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS node_heartbeats (
        node_id TEXT PRIMARY KEY, last_seen TEXT NOT NULL)""",
]


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def now() -> datetime:
    return datetime.now(UTC)


class OperationalState:
    def __init__(self, database: Database) -> None:
        self.database = database
        with database.transaction(write=True) as cursor:
            for statement in SCHEMA:
                cursor.execute(statement)

    def add_token(self, token: str, user_id: str) -> None:
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                "INSERT INTO api_tokens (token_hash, user_id, created_at) VALUES (?, ?, ?) "
                "ON CONFLICT (token_hash) DO NOTHING",
                (_hash(token), user_id, now().isoformat()),
            )

    def user_for(self, token: str) -> str | None:
        with self.database.transaction() as cursor:
            cursor.execute("SELECT user_id FROM api_tokens WHERE token_hash = ?", (_hash(token),))
            row = cursor.fetchone()
        return str(row["user_id"]) if row else None

    def heartbeat(self, node_id: str) -> None:
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                "INSERT INTO node_heartbeats (node_id, last_seen) VALUES (?, ?) "
                "ON CONFLICT (node_id) DO UPDATE SET last_seen = excluded.last_seen",
                (node_id, now().isoformat()),
            )

    def live_nodes(self, timeout_s: float) -> set[str]:
        since = (now() - timedelta(seconds=timeout_s)).isoformat()
        with self.database.transaction() as cursor:
            cursor.execute("SELECT node_id FROM node_heartbeats WHERE last_seen >= ?", (since,))
            return {str(row["node_id"]) for row in cursor.fetchall()}


def ensure_admin_token(state: OperationalState, data_dir: Path) -> tuple[str, bool]:
    """The admin token kept in ``data_dir/admin.token``; made on first start.

    Returns the token and whether it was just created.
    """
    path = data_dir / "admin.token"
    created = not path.exists()
    if created:
        token = secrets.token_urlsafe(32)
        path.write_text(token + "\n")
        path.chmod(0o600)
    token = path.read_text().strip()
    state.add_token(token, "admin")
    return token, created
