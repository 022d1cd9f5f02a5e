"""Users' secrets, encrypted at rest in the operational database (never in the ledger).

Each value is sealed with AES-GCM (the ``cryptography`` package) under the server's secret key,
with a fresh 96-bit nonce and the owner and name as associated data, so that a sealed value
moved to another row (another user's, another name) fails to open instead of being served.

The key is 32 random bytes in base64: ``FLEXAI_SECRET_KEY``, else the file
``<data-dir>/secrets.key``, created (mode 0600) on the first start that needs it. Replicas that
share one database must share the key (set ``FLEXAI_SECRET_KEY`` on each): every row records the
fingerprint of the key that sealed it, and a server with another key says so rather than
failing to open it. Neither values nor the key are ever logged or put in an error message.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ledger.database import Database

KEY_VARIABLE = "FLEXAI_SECRET_KEY"
KEY_FILE = "secrets.key"
KEY_BYTES = 32
NONCE_BYTES = 12
MAX_VALUE_BYTES = 64 * 1024

SCHEMA = """CREATE TABLE IF NOT EXISTS user_secrets (
    owner TEXT NOT NULL, name TEXT NOT NULL, sealed TEXT NOT NULL, key_id TEXT NOT NULL,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL, PRIMARY KEY (owner, name))"""


class SecretKeyError(ValueError):
    """The secret key cannot be used; the message says why and what to do (never the key)."""


class SecretExists(Exception):
    """The owner already has a secret of that name."""


class SecretUnreadable(Exception):
    """A stored value cannot be opened with this server's key."""


@dataclass(frozen=True)
class StoredSecret:
    name: str
    created_at: str
    updated_at: str


def decode_key(text: str, source: str) -> bytes:
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise SecretKeyError(
            f"{source} must hold {KEY_BYTES} random bytes in base64 "
            f"(`head -c {KEY_BYTES} /dev/urandom | base64`)"
        )
    return key


def load_key(data_dir: Path, environ: Mapping[str, str]) -> bytes:
    """``FLEXAI_SECRET_KEY``, else ``<data-dir>/secrets.key`` (made 0600 if missing)."""
    if environ.get(KEY_VARIABLE):
        return decode_key(environ[KEY_VARIABLE], KEY_VARIABLE)
    path = data_dir / KEY_FILE
    try:
        # Created 0600 and exclusively: never readable by others, never two keys raced.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as handle:
            handle.write(base64.b64encode(os.urandom(KEY_BYTES)).decode() + "\n")
    return decode_key(path.read_text(), str(path))


def key_id(key: bytes) -> str:
    """A fingerprint that tells keys apart and reveals nothing of the key."""
    return hashlib.sha256(b"flexai-secret-key:" + key).hexdigest()[:16]


def _now() -> str:
    return datetime.now(UTC).isoformat()


class SecretStore:
    """The ``user_secrets`` table: sealed values by owner and name."""

    def __init__(self, database: Database, key: bytes) -> None:
        self.database = database
        self._cipher = AESGCM(key)
        self.key_id = key_id(key)
        with database.transaction(write=True) as cursor:
            cursor.execute(SCHEMA)

    def _seal(self, owner: str, name: str, value: str) -> str:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._cipher.encrypt(nonce, value.encode(), _context(owner, name))
        return base64.b64encode(nonce + sealed).decode()

    def _open(self, owner: str, name: str, sealed: str, sealed_by: str) -> str:
        if sealed_by != self.key_id:
            raise SecretUnreadable(
                f"secret '{name}' was stored by a server with another secret key (fingerprint "
                f"{sealed_by}, this server's is {self.key_id}): give every server of this "
                "database the same FLEXAI_SECRET_KEY, or create the secret again"
            )
        raw = base64.b64decode(sealed)
        try:
            plain = self._cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:],
                                         _context(owner, name))  # fmt: skip
        except InvalidTag:
            raise SecretUnreadable(
                f"secret '{name}' does not open with this server's key: it was altered in the "
                "database; delete it and create it again"
            ) from None
        return plain.decode()

    def create(self, owner: str, name: str, value: str) -> StoredSecret:
        """A new secret; :class:`SecretExists` if the owner has one of that name."""
        moment = _now()
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                "INSERT INTO user_secrets (owner, name, sealed, key_id, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (owner, name) DO NOTHING RETURNING name",
                (owner, name, self._seal(owner, name, value), self.key_id, moment, moment),
            )
            if cursor.fetchone() is None:
                raise SecretExists(name)
        return StoredSecret(name, moment, moment)

    def put(self, owner: str, name: str, value: str) -> tuple[StoredSecret, bool]:
        """Create or replace a secret; whether it was created."""
        moment = _now()
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                "INSERT INTO user_secrets (owner, name, sealed, key_id, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (owner, name) DO UPDATE SET "
                "sealed = excluded.sealed, key_id = excluded.key_id, "
                "updated_at = excluded.updated_at",
                (owner, name, self._seal(owner, name, value), self.key_id, moment, moment),
            )
            cursor.execute(
                "SELECT created_at FROM user_secrets WHERE owner = ? AND name = ?", (owner, name)
            )
            row = cursor.fetchone()
        created_at = str(row["created_at"]) if row is not None else moment
        return StoredSecret(name, created_at, moment), created_at == moment

    def listed(self, owner: str) -> list[StoredSecret]:
        with self.database.transaction() as cursor:
            cursor.execute(
                "SELECT name, created_at, updated_at FROM user_secrets WHERE owner = ? "
                "ORDER BY name",
                (owner,),
            )
            rows = cursor.fetchall()
        return [StoredSecret(str(r["name"]), str(r["created_at"]), str(r["updated_at"]))
                for r in rows]  # fmt: skip

    def delete(self, owner: str, name: str) -> bool:
        with self.database.transaction(write=True) as cursor:
            cursor.execute(
                "DELETE FROM user_secrets WHERE owner = ? AND name = ? RETURNING name",
                (owner, name),
            )
            return cursor.fetchone() is not None

    def values(self, owner: str, names: Iterable[str]) -> tuple[dict[str, str], list[str]]:
        """The owner's values of ``names``, and the names that owner has no secret for."""
        wanted = sorted(set(names))
        if not wanted:
            return {}, []
        marks = ", ".join("?" for _ in wanted)
        with self.database.transaction() as cursor:
            cursor.execute(
                f"SELECT name, sealed, key_id FROM user_secrets WHERE owner = ? "
                f"AND name IN ({marks})",
                (owner, *wanted),
            )
            rows = cursor.fetchall()
        found = {str(row["name"]): self._open(owner, str(row["name"]), str(row["sealed"]),
                                              str(row["key_id"]))
                 for row in rows}  # fmt: skip
        return found, [name for name in wanted if name not in found]


def _context(owner: str, name: str) -> bytes:
    """The associated data: a length-prefixed owner, then the name (no two pairs alike)."""
    owner_bytes = owner.encode()
    return len(owner_bytes).to_bytes(4, "big") + owner_bytes + name.encode()


def open_secret_store(
    database: Database, data_dir: Path, environ: Mapping[str, str] | None = None
) -> SecretStore:
    return SecretStore(database, load_key(data_dir, os.environ if environ is None else environ))
