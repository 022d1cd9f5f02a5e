"""How the ledger's events are stored: encrypted (AES-GCM) and compressed (zlib), or not.

``flexai server --ledger-key-file PATH`` encrypts every stored event's state with the key in
that file (the library's ``eventsourcing.cryptography:AESCipher``, from the ``cryptography``
package); ``--compress-events`` compresses it first (``ZlibCompressor``). Both are properties of
the ledger, not of one server run: the first server to write a ledger records its format (and a
fingerprint of its key, never the key) in the ``ledger_format`` table, and every later start
(every replica) must match it, or it refuses to start with what to do. A ledger written before
this table existed is plain.

A key file holds 16, 24 or 32 random bytes in base64 (``head -c 32 /dev/urandom | base64``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from eventsourcing.application import Application

from ledger.database import Database

CIPHER_TOPIC = "eventsourcing.cryptography:AESCipher"
COMPRESSOR_TOPIC = "eventsourcing.compressor:ZlibCompressor"
KEY_SIZES = (16, 24, 32)

SCHEMA = """CREATE TABLE IF NOT EXISTS ledger_format (
    id INTEGER PRIMARY KEY CHECK (id = 1), encrypted INTEGER NOT NULL,
    key_fingerprint TEXT, compressed INTEGER NOT NULL, since TEXT NOT NULL)"""


class LedgerKeyError(ValueError):
    """The key file cannot be used; the message says why and what to do."""


class LedgerFormatMismatch(Exception):
    """The server's settings do not match how the ledger was written."""


@dataclass(frozen=True)
class LedgerFormat:
    encrypted: bool
    key_fingerprint: str | None
    compressed: bool

    def describe(self) -> str:
        how = "encrypted" if self.encrypted else "not encrypted"
        if self.key_fingerprint:
            how += f" (key fingerprint {self.key_fingerprint})"
        return f"{how}, {'compressed' if self.compressed else 'not compressed'}"


def read_key_file(path: Path) -> str:
    """The base64 key held by ``path``, checked; :class:`LedgerKeyError` says what is wrong."""
    try:
        status = path.stat()
        text = path.read_text().strip()
    except OSError as error:
        raise LedgerKeyError(
            f"cannot read the ledger key file {path}: {error.strerror or error}; create it with "
            f"`head -c 32 /dev/urandom | base64 > {path} && chmod 600 {path}`"
        ) from None
    if status.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise LedgerKeyError(
            f"the ledger key file {path} may be read by other users; `chmod 600 {path}`"
        )
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) not in KEY_SIZES:
        raise LedgerKeyError(
            f"the ledger key file {path} must hold 16, 24 or 32 bytes in base64 (one line); "
            f"create one with `head -c 32 /dev/urandom | base64 > {path}`"
        )
    return text


def fingerprint(key: str) -> str:
    """A short digest that names a key without revealing it."""
    raw = base64.b64decode(key)
    return hmac.new(raw, b"flexai ledger key fingerprint", hashlib.sha256).hexdigest()[:16]


def store_env(key: str | None, compress: bool) -> dict[str, str]:
    """The eventsourcing settings for this format."""
    env = {}
    if key:
        env["CIPHER_TOPIC"] = CIPHER_TOPIC
        env["CIPHER_KEY"] = key
    if compress:
        env["COMPRESSOR_TOPIC"] = COMPRESSOR_TOPIC
    return env


def check_ledger_format(
    database: Database, application: Application, key: str | None, compress: bool
) -> LedgerFormat:
    """Record the ledger's format on its first write, or check the settings against it."""
    wanted = LedgerFormat(key is not None, fingerprint(key) if key else None, compress)
    with database.transaction(write=True) as cursor:
        cursor.execute(SCHEMA)
    with database.transaction(write=True) as cursor:
        cursor.execute(
            "SELECT encrypted, key_fingerprint, compressed FROM ledger_format WHERE id = 1"
        )
        row = cursor.fetchone()
        if row is None:
            has_events = bool(application.recorder.max_notification_id())  # type: ignore[attr-defined]
            recorded = wanted if not has_events else LedgerFormat(False, None, False)
            cursor.execute(
                "INSERT INTO ledger_format (id, encrypted, key_fingerprint, compressed, since) "
                "VALUES (1, ?, ?, ?, CURRENT_TIMESTAMP) ON CONFLICT (id) DO NOTHING",
                (int(recorded.encrypted), recorded.key_fingerprint, int(recorded.compressed)),
            )
            cursor.execute(
                "SELECT encrypted, key_fingerprint, compressed FROM ledger_format WHERE id = 1"
            )
            row = cursor.fetchone()
    assert row is not None
    stored = LedgerFormat(bool(row["encrypted"]), row["key_fingerprint"], bool(row["compressed"]))
    if stored != wanted:
        raise LedgerFormatMismatch(_advice(stored, wanted))
    return stored


def _advice(stored: LedgerFormat, wanted: LedgerFormat) -> str:
    said = f"the ledger is {stored.describe()}, but this server was started {wanted.describe()}"
    if stored.encrypted and not wanted.encrypted:
        todo = "start it with --ledger-key-file pointing at the ledger's key"
    elif stored.encrypted and stored.key_fingerprint != wanted.key_fingerprint:
        todo = (
            f"pass the key whose fingerprint is {stored.key_fingerprint} with --ledger-key-file"
        )
    elif wanted.encrypted and not stored.encrypted:
        todo = "a ledger cannot be encrypted after it was written: drop --ledger-key-file"
    elif stored.compressed:
        todo = "start it with --compress-events"
    else:
        todo = "a ledger cannot be compressed after it was written: drop --compress-events"
    return f"{said}; {todo}"


def key_file_from_env() -> Path | None:
    """``FLEXAI_LEDGER_KEY_FILE``, the default of ``--ledger-key-file``."""
    value = os.environ.get("FLEXAI_LEDGER_KEY_FILE")
    return Path(value) if value else None
