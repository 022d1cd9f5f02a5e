"""Runtimes: the images that admins name for jobs to run in (``--runtime NAME``), kept in the
operational database's ``runtimes`` table beside users and secrets, not in the ledger.

A runtime is configuration, like a user's quota: what the ledger must keep for good is what
each job ran with, and it does: a job's spec pins the runtime's image and registry secret at
submission (:mod:`api.job_specs`), and its ``Built`` event records the image's digest. So a
runtime may be changed or deleted at any time without rewriting history, and listing the
runtimes reads one small table. A registry secret is stored by its owner and name only: its
value stays sealed in ``user_secrets`` (:mod:`api.identity.secrets`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ledger.database import Database
from ledger.schema import create_schema

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS runtimes (
        name TEXT PRIMARY KEY, image TEXT NOT NULL, registry_secret TEXT,
        registry_secret_owner TEXT, created_by TEXT NOT NULL, created_at TEXT NOT NULL)""",
]
_COLUMNS = "name, image, registry_secret, registry_secret_owner, created_by, created_at"


class RuntimeExists(Exception):
    """A runtime of that name is there already."""


@dataclass(frozen=True)
class Runtime:
    name: str
    image: str
    """``docker://HOST[:PORT]/PATH[:TAG][@sha256:DIGEST]``."""
    registry_secret: str | None
    """The name of the secret the registry is logged in to with (``USER:PASSWORD``)..."""
    registry_secret_owner: str | None
    """...of this user's (the admin who made the runtime)."""
    created_by: str
    created_at: str


def _runtime(row: Any) -> Runtime:
    return Runtime(
        name=str(row["name"]), image=str(row["image"]),
        registry_secret=row["registry_secret"], registry_secret_owner=row["registry_secret_owner"],
        created_by=str(row["created_by"]), created_at=str(row["created_at"]),
    )  # fmt: skip


class Runtimes:
    """The ``runtimes`` table: by name, for every user to read and admins to change."""

    def __init__(self, database: Database) -> None:
        self.database = database
        with database.transaction(write=True) as cursor:
            create_schema(cursor, SCHEMA)

    def create(self, name: str, image: str, registry_secret: tuple[str, str] | None,
               by: str) -> Runtime:  # fmt: skip
        """A new runtime; :class:`RuntimeExists` if the name is taken. ``registry_secret``:
        its owner and name."""
        owner, secret = registry_secret or (None, None)
        made = Runtime(name, image, secret, owner, by, datetime.now(UTC).isoformat())
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                f"INSERT INTO runtimes ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (name) DO NOTHING RETURNING name",
                (made.name, made.image, made.registry_secret, made.registry_secret_owner,
                 made.created_by, made.created_at),
            )  # fmt: skip
            if cursor.fetchone() is None:
                raise RuntimeExists(name)
        return made

    def listed(self) -> list[Runtime]:
        with self.database.transaction() as cursor:
            cursor.execute(f"SELECT {_COLUMNS} FROM runtimes ORDER BY name")
            return [_runtime(row) for row in cursor.fetchall()]

    def get(self, name: str) -> Runtime | None:
        with self.database.transaction() as cursor:
            cursor.execute(f"SELECT {_COLUMNS} FROM runtimes WHERE name = ?", (name,))
            row = cursor.fetchone()
        return None if row is None else _runtime(row)

    def delete(self, name: str) -> bool:
        with self.database.transaction(write=True) as cursor:
            cursor.execute("DELETE FROM runtimes WHERE name = ? RETURNING name", (name,))
            return cursor.fetchone() is not None
