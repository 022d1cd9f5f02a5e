"""Opaque page cursors for keyset pagination: the last row's (created_at, id), URL-safe.

A cursor carries a short checksum so that a truncated, hand-edited or mangled one is refused
rather than silently read as another position. It is no secret and no authorization: every
page is filtered by its owner anyway, so a forged cursor can only start a list elsewhere in
the caller's own jobs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from datetime import datetime
from uuid import UUID

_PERSON = b"flexai-jobs-v1"
_DIGEST_BYTES = 8


class InvalidCursor(ValueError):
    """A cursor this server did not hand out (or no longer understands)."""


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=_DIGEST_BYTES, person=_PERSON).digest()


def encode_cursor(created_at: str, job_id: str) -> str:
    payload = json.dumps([created_at, job_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(payload + _digest(payload)).rstrip(b"=").decode()


def decode_cursor(cursor: str) -> tuple[str, str]:
    """The (created_at, id) a cursor stands for; :class:`InvalidCursor` if it is not one."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (binascii.Error, ValueError) as error:
        raise InvalidCursor("not a cursor") from error
    payload, digest = raw[:-_DIGEST_BYTES], raw[-_DIGEST_BYTES:]
    if len(raw) <= _DIGEST_BYTES or _digest(payload) != digest:
        raise InvalidCursor("not a cursor this server handed out")
    try:
        created_at, job_id = json.loads(payload)
        datetime.fromisoformat(created_at)
        UUID(job_id)
    except (ValueError, TypeError) as error:
        raise InvalidCursor("not a cursor this server handed out") from error
    return str(created_at), str(job_id)
