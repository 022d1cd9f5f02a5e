"""Who calls: users (admins among them), their API tokens, and the nodes' tokens.

A token is stored only as its SHA-256 (tokens are 256 random bits: no slow hash is needed).
Its public id (``flx_<id>_<secret>``) names it in lists and revocations without revealing it.
A user's token reaches the user routes, acting for that user; a node token reaches only the
agent routes, for that one node. A revoked token stops working at once: this server forgets
what it remembered of tokens when one is revoked, and on PostgreSQL every replica hears it
(``NOTIFY flexai_tokens``). Several servers sharing one SQLite file have no such channel: there
another server may accept a revoked token for :data:`TOKEN_MEMORY_S` more seconds. The first
admin's token lives in ``<data-dir>/admin.token`` (:func:`ensure_admin_token`).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ledger.database import Cursor, Database
from ledger.schema import create_schema

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS users (
        name TEXT PRIMARY KEY, admin INTEGER NOT NULL, created_at TEXT NOT NULL,
        created_by TEXT)""",
    """CREATE TABLE IF NOT EXISTS access_tokens (
        token_hash TEXT PRIMARY KEY, token_id TEXT NOT NULL UNIQUE, user_name TEXT,
        node_name TEXT, label TEXT NOT NULL, created_at TEXT NOT NULL, created_by TEXT,
        revoked_at TEXT, revoked_by TEXT,
        CHECK ((user_name IS NULL) <> (node_name IS NULL)))""",
    "CREATE INDEX IF NOT EXISTS access_tokens_user ON access_tokens (user_name)",
    "CREATE INDEX IF NOT EXISTS access_tokens_node ON access_tokens (node_name)",
]
USER_COLUMNS = {
    "quota_accels": "BIGINT", "high_priority": "INTEGER NOT NULL DEFAULT 0",
    "limits_set_by": "TEXT", "limits_set_at": "TEXT",
}  # fmt: skip
"""Columns ``users`` gained after its first release, added to a database made before them."""
ADMIN_USER = "admin"
"""The first user, made with the server: its token is ``<data-dir>/admin.token``."""
USER_NAME = re.compile(r"[a-z][a-z0-9_-]{0,62}")
USER_NAME_RULE = "1 to 63 lower-case letters, digits, '-' and '_', starting with a letter"
TOKEN_ID = re.compile(r"[a-z0-9]{12}")
TOKEN_MEMORY_S = 5.0
"""How long a server remembers a token it looked up (revocation makes it forget at once)."""
MAX_LABEL = 200


class IdentityError(Exception):
    """A user or token operation that cannot be done; the message says why and what to do,
    ``title`` what went wrong in a few words (how HTTP answers it is the API's business)."""

    title = "Refused"

    def __init__(self, detail: str, title: str | None = None) -> None:
        super().__init__(detail)
        self.detail, self.title = detail, title or self.title


class InvalidIdentityValue(IdentityError):
    """A user name or a quota that is not valid."""


class UserNotFound(IdentityError):
    title = "User not found"


class UserExists(IdentityError):
    title = "User exists"


class TokenNotFound(IdentityError):
    title = "Token not found"


@dataclass(frozen=True)
class Caller:
    """What a valid token may do: act as a user (an admin or not), or as one node's agent."""

    token_id: str
    user: str | None = None
    admin: bool = False
    node: str | None = None

    @property
    def kind(self) -> str:
        return "node" if self.node is not None else "user"


@dataclass(frozen=True)
class Revoked:
    """A token that was valid and is no more."""

    token_id: str
    revoked_at: str


@dataclass(frozen=True)
class IssuedToken:
    """A token just made: the only moment its value is known."""

    token: str
    token_id: str
    user: str | None
    node: str | None
    label: str
    created_at: str


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """A fresh token and its public id."""
    token_id = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12))
    return f"flx_{token_id}_{secrets.token_urlsafe(32)}", token_id


def legacy_token_id(token: str) -> str:
    """The id of a token made outside :func:`new_token` (the admin token file's)."""
    return token_hash(token)[:12]


def check_user_name(name: str) -> str:
    if not USER_NAME.fullmatch(name):
        raise InvalidIdentityValue(f"user name {name[:70]!r} is not valid: use {USER_NAME_RULE}",
                                   "Invalid user name")  # fmt: skip
    return name


def _user_not_found(name: str) -> IdentityError:
    return UserNotFound(
        f"there is no user {name}; `flexai admin user create {name}` makes one "
        "(with its first token)",
    )  # fmt: skip


def _count(value: Any) -> int | None:
    return None if value is None else int(value)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Identities:
    """Users and tokens, in the operational database beside the views."""

    def __init__(self, database: Database, memory_s: float = TOKEN_MEMORY_S) -> None:
        self.database = database
        self.memory_s = memory_s
        self._known: dict[str, tuple[Caller, float]] = {}
        self.revoked: list[Callable[[str], None]] = []
        """Told of each revocation this server makes (PostgreSQL: ``NOTIFY`` the replicas)."""
        with database.transaction(write=True) as cursor:
            create_schema(cursor, SCHEMA)
            self._add_user_columns(cursor)
            self._adopt_old_tokens(cursor)

    def _add_user_columns(self, cursor: Cursor) -> None:
        """The columns of :data:`USER_COLUMNS` that an older database's ``users`` lacks."""
        postgres = self.database.dialect == "postgres"
        cursor.execute(
            "SELECT column_name AS name FROM information_schema.columns WHERE "
            "table_schema = current_schema() AND table_name = 'users'"
            if postgres
            else "SELECT name FROM pragma_table_info('users')"
        )
        present = {str(row["name"]) for row in cursor.fetchall()}
        guard = "IF NOT EXISTS " if postgres else ""  # replicas may start at the same moment
        for column, kind in USER_COLUMNS.items():
            if column not in present:
                cursor.execute(f"ALTER TABLE users ADD COLUMN {guard}{column} {kind}")

    def _adopt_old_tokens(self, cursor: Cursor) -> None:
        """Tokens of a server from before users (one table of hashes, all the admin's)."""
        cursor.execute(
            "SELECT 1 AS found FROM information_schema.tables WHERE table_name = 'api_tokens'"
            if self.database.dialect == "postgres"
            else "SELECT 1 AS found FROM sqlite_master WHERE type = 'table' AND name = 'api_tokens'"
        )
        if cursor.fetchone() is None:
            return
        cursor.execute("SELECT token_hash, user_id, created_at FROM api_tokens")
        for row in cursor.fetchall():
            self._ensure_user(cursor, str(row["user_id"]), row["user_id"] == ADMIN_USER, None)
            cursor.execute(
                "INSERT INTO access_tokens (token_hash, token_id, user_name, label, created_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (token_hash) DO NOTHING",
                (row["token_hash"], str(row["token_hash"])[:12], row["user_id"], "",
                 row["created_at"]),
            )  # fmt: skip
        cursor.execute("DROP TABLE api_tokens")

    # -- users ---------------------------------------------------------------------------

    def ensure_admin(self, token: str) -> None:
        """The first admin and its token (``<data-dir>/admin.token``), on every start."""
        with self.database.transaction(write=True) as cursor:
            self._ensure_user(cursor, ADMIN_USER, True, None)
            cursor.execute(
                "INSERT INTO access_tokens (token_hash, token_id, user_name, label, created_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (token_hash) DO NOTHING",
                (token_hash(token), legacy_token_id(token), ADMIN_USER, "admin.token", _now()),
            )

    @staticmethod
    def _ensure_user(cursor: Cursor, name: str, admin: bool, by: str | None) -> bool:
        cursor.execute(
            "INSERT INTO users (name, admin, created_at, created_by) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (name) DO NOTHING RETURNING name",
            (name, int(admin), _now(), by),
        )
        return cursor.fetchone() is not None

    def create_user(self, name: str, *, admin: bool, by: str) -> IssuedToken:
        """A new user and its first token."""
        check_user_name(name)
        with self.database.transaction(write=True) as cursor:
            if not self._ensure_user(cursor, name, admin, by):
                raise UserExists(
                    f"there is a user {name} already; give it another token with `flexai admin "
                    f"token create --user {name}`, or choose another name",
                )  # fmt: skip
            return self._issue(cursor, user=name, node=None, label="first token", by=by)

    def users(self) -> list[dict[str, Any]]:
        with self.database.transaction() as cursor:
            cursor.execute(
                "SELECT u.name, u.admin, u.created_at, u.created_by, u.quota_accels, "
                "u.high_priority, u.limits_set_by, u.limits_set_at, (SELECT COUNT(*) FROM "
                "access_tokens t WHERE t.user_name = u.name AND t.revoked_at IS NULL) AS tokens "
                "FROM users u ORDER BY u.name"
            )
            return [
                {**row, "admin": bool(row["admin"]), "tokens": int(row["tokens"]),
                 "high_priority": bool(row["high_priority"]),
                 "quota_accels": _count(row["quota_accels"])}
                for row in cursor.fetchall()
            ]  # fmt: skip

    def user_exists(self, name: str) -> bool:
        with self.database.transaction() as cursor:
            cursor.execute("SELECT 1 AS found FROM users WHERE name = ?", (name,))
            return cursor.fetchone() is not None

    # -- what users may ask of the shared fleet ------------------------------------------

    def set_quota(self, name: str, accels: int | None, by: str) -> None:
        """At most ``accels`` accelerators of ``name``'s jobs running at once; None: no quota."""
        if accels is not None and accels < 0:
            raise InvalidIdentityValue(
                f"a quota of {accels} accelerators is not valid: give 0 or more, or none",
                "Invalid quota",
            )  # fmt: skip
        self._set_user(name, "quota_accels", accels, by)

    def set_high_priority(self, name: str, allowed: bool, by: str) -> None:
        """Whether ``name`` may submit ``priority: high`` jobs (admins always may)."""
        self._set_user(name, "high_priority", int(allowed), by)

    def _set_user(self, name: str, column: str, value: Any, by: str) -> None:
        """One of the user's limits set, and who set one last, and when."""
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                f"UPDATE users SET {column} = ?, limits_set_by = ?, limits_set_at = ? "
                "WHERE name = ? RETURNING name",
                (value, by, _now(), name),
            )
            if cursor.fetchone() is None:
                raise _user_not_found(name)

    def quotas(self) -> dict[str, int]:
        """Each user with a quota and its accelerators (the scheduler asks every round)."""
        with self.database.transaction() as cursor:
            cursor.execute("SELECT name, quota_accels FROM users WHERE quota_accels IS NOT NULL")
            return {str(row["name"]): int(row["quota_accels"]) for row in cursor.fetchall()}

    def may_use_high_priority(self, name: str) -> bool:
        """An admin, or a user an admin granted ``priority: high``."""
        with self.database.transaction() as cursor:
            cursor.execute("SELECT admin, high_priority FROM users WHERE name = ?", (name,))
            row = cursor.fetchone()
        return row is not None and bool(row["admin"] or row["high_priority"])

    # -- tokens --------------------------------------------------------------------------

    def issue_user_token(self, user: str, *, label: str, by: str) -> IssuedToken:
        with self.database.transaction(write=True) as cursor:
            cursor.execute("SELECT 1 AS found FROM users WHERE name = ?", (user,))
            if cursor.fetchone() is None:
                raise _user_not_found(user)
            return self._issue(cursor, user=user, node=None, label=label, by=by)

    def issue_node_token(self, node: str, *, label: str, by: str) -> IssuedToken:
        with self.database.transaction(write=True) as cursor:
            return self._issue(cursor, user=None, node=node, label=label, by=by)

    @staticmethod
    def _issue(
        cursor: Cursor, *, user: str | None, node: str | None, label: str, by: str
    ) -> IssuedToken:
        token, token_id = new_token()
        created_at = _now()
        cursor.execute(
            "INSERT INTO access_tokens (token_hash, token_id, user_name, node_name, label, "
            "created_at, created_by) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (token_hash(token), token_id, user, node, label[:MAX_LABEL], created_at, by),
        )
        return IssuedToken(token, token_id, user, node, label[:MAX_LABEL], created_at)

    def tokens(self, user: str | None = None, *, everyone: bool = False) -> list[dict[str, Any]]:
        """Tokens (never their values): a user's, or every user's and node's."""
        where, params = ("", ()) if everyone else ("WHERE user_name = ?", (user,))
        with self.database.transaction() as cursor:
            cursor.execute(
                "SELECT token_id, user_name, node_name, label, created_at, created_by, "
                f"revoked_at, revoked_by FROM access_tokens {where} ORDER BY created_at, token_id",
                params,
            )
            return [
                {"kind": "node" if row["node_name"] else "user", **row}
                for row in cursor.fetchall()
            ]

    def revoke(self, token_id: str, by: Caller) -> dict[str, Any]:
        """Revoke a token: one's own, or (an admin) anyone's. Another user's is not found."""
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                "SELECT token_id, user_name, node_name, revoked_at FROM access_tokens "
                "WHERE token_id = ?",
                (token_id,),
            )
            row = cursor.fetchone()
            if row is None or not (by.admin or (row["user_name"] == by.user and by.user)):
                raise TokenNotFound(
                    f"no token of yours has the id {token_id[:40]!r}; `flexai admin token list` "
                    "shows their ids",
                )  # fmt: skip
            if row["revoked_at"] is None:
                cursor.execute(
                    "UPDATE access_tokens SET revoked_at = ?, revoked_by = ? WHERE token_id = ?",
                    (_now(), by.user, token_id),
                )
        self.forget()
        for hook in self.revoked:
            hook(token_id)
        return {**row, "revoked": True}

    # -- who calls -----------------------------------------------------------------------

    def known_caller(self, token: str) -> Caller | None:
        """The caller of a token remembered from a recent :meth:`resolve`, without a query."""
        known = self._known.get(token_hash(token))
        return known[0] if known is not None and known[1] > time.monotonic() else None

    def resolve(self, token: str) -> Caller | Revoked | None:
        """What the token may do; :class:`Revoked` for a revoked one; None for an unknown
        one. Valid tokens are remembered a few seconds, unknown ones asked again each time."""
        digest = token_hash(token)
        known = self._known.get(digest)
        if known is not None and known[1] > time.monotonic():
            return known[0]
        with self.database.transaction() as cursor:
            cursor.execute(
                "SELECT t.token_id, t.user_name, t.node_name, t.revoked_at, u.admin "
                "FROM access_tokens t LEFT JOIN users u ON u.name = t.user_name "
                "WHERE t.token_hash = ?",
                (digest,),
            )
            row = cursor.fetchone()
        if row is None:
            return None
        if row["revoked_at"] is not None:
            return Revoked(str(row["token_id"]), str(row["revoked_at"]))
        caller = Caller(
            token_id=str(row["token_id"]), user=row["user_name"],
            admin=bool(row["admin"]), node=row["node_name"],
        )  # fmt: skip
        if self.memory_s > 0:
            if len(self._known) > 10_000:
                self._known.clear()
            self._known[digest] = (caller, time.monotonic() + self.memory_s)
        return caller

    def forget(self, *_: Any) -> None:
        """Drop every remembered token: one was revoked (here, or on another replica)."""
        self._known = {}


def ensure_admin_token(identities: Identities, data_dir: Path) -> tuple[str, bool]:
    """The admin token kept in ``data_dir/admin.token``; made on first start.

    Returns the token and whether it was just created.
    """
    path = data_dir / "admin.token"
    created = not path.exists()
    if created:
        token = secrets.token_urlsafe(32)
        # Created 0600: never readable by others, not even between a write and a chmod.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
    token = path.read_text().strip()
    identities.ensure_admin(token)
    return token, created
