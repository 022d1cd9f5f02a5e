"""The web console's sign-in sessions, kept server-side in the operational database.

Signing in with an API token makes a session: a random id, sent to the browser once in an
``HttpOnly`` cookie and stored here only as its SHA-256 (like tokens), with the id of the token
that opened it. Every request resolves the session back through that token, so the session acts
exactly as its token does (the same user, admin or not) and ends the moment the token is
revoked. The table lives beside ``access_tokens``, so every replica of one PostgreSQL knows a
session whichever replica made it; signing out deletes the row.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import UTC, datetime, timedelta

from api.identity.identities import Caller
from ledger.database import Database
from ledger.schema import create_schema

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS console_sessions (
        session_hash TEXT PRIMARY KEY, token_id TEXT NOT NULL, user_name TEXT NOT NULL,
        created_at TEXT NOT NULL, expires_at TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS console_sessions_expiry ON console_sessions (expires_at)",
]
SESSION_COOKIE = "flexai_session"
"""The cookie that carries a session's id (``HttpOnly``, ``SameSite=Strict``)."""
SESSION_LIFETIME_S = 12 * 3600
"""A session ends this long after sign-in, used or not; sign in again with the token."""


def _hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(moment: datetime) -> str:
    """Always to the microsecond: stored moments compare as text."""
    return moment.isoformat(timespec="microseconds")


def csrf_token(session_id: str) -> str:
    """The session's CSRF token: forms of its pages carry it, and only its pages know it (it
    is derived from the session id, which scripts cannot read from the HttpOnly cookie)."""
    return hmac.new(session_id.encode(), b"flexai-console-csrf", hashlib.sha256).hexdigest()


class Sessions:
    def __init__(self, database: Database, lifetime_s: float = SESSION_LIFETIME_S) -> None:
        self.database = database
        self.lifetime_s = lifetime_s
        with database.transaction(write=True) as cursor:
            create_schema(cursor, SCHEMA)

    def open(self, caller: Caller) -> str:
        """A new session acting as the user's token ``caller``; its id (the cookie's value).
        Sessions past their end are dropped meanwhile."""
        if caller.user is None:
            raise ValueError("a console session acts for a user, not a node")
        session_id = secrets.token_urlsafe(32)
        moment = _now()
        expires = moment + timedelta(seconds=self.lifetime_s)
        with self.database.transaction(write=True) as cursor:
            cursor.execute("DELETE FROM console_sessions WHERE expires_at <= ?",
                           (_iso(moment),))  # fmt: skip
            cursor.execute(
                "INSERT INTO console_sessions (session_hash, token_id, user_name, created_at, "
                "expires_at) VALUES (?, ?, ?, ?, ?)",
                (_hash(session_id), caller.token_id, caller.user, _iso(moment), _iso(expires)),
            )  # fmt: skip
        return session_id

    def resolve(self, session_id: str) -> Caller | None:
        """The caller a live session acts as; None for an unknown or ended session, and for
        one whose token was revoked since."""
        with self.database.transaction() as cursor:
            cursor.execute(
                "SELECT t.token_id, t.user_name, t.revoked_at, u.admin "
                "FROM console_sessions s JOIN access_tokens t ON t.token_id = s.token_id "
                "JOIN users u ON u.name = t.user_name "
                "WHERE s.session_hash = ? AND s.expires_at > ?",
                (_hash(session_id), _iso(_now())),
            )
            row = cursor.fetchone()
        if row is None or row["revoked_at"] is not None:
            return None
        return Caller(token_id=str(row["token_id"]), user=str(row["user_name"]),
                      admin=bool(row["admin"]))  # fmt: skip

    def end(self, session_id: str) -> None:
        """Sign out: the session is gone, for every replica."""
        with self.database.transaction(write=True) as cursor:
            cursor.execute("DELETE FROM console_sessions WHERE session_hash = ?",
                           (_hash(session_id),))  # fmt: skip
