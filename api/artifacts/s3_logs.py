"""Logs of the S3 store: each stream's newest bytes in the operational database, the rest in
the bucket in parts.

Three tables, shared by every replica on the database:

- ``log_streams(job_id, node_index, size, flushed)``: one row per stream (a job's node; a
  later attempt's under its ``attempt_key`` in place of the job's id), the
  bytes it holds in all and how many of them are in parts. Every write to a stream locks its
  row first (``FOR UPDATE`` on PostgreSQL; SQLite's writers take turns anyway).
- ``log_chunks(job_id, node_index, start, size, data, created_at)``: the bytes not yet in a
  part, one row per append, keyed by where they start.
- ``log_parts(job_id, node_index, start, size, object_key)``: what is in the bucket, one object
  per part at ``jobs/<id>/logs/<k>/<start:020d>-<end:020d>``.

An append is idempotent by offset exactly as the local store's: bytes before the stream's size
are acknowledged, not written twice; an offset past its end is :class:`LogOffsetMismatch`.

A flush writes the held rows from ``flushed`` on to the bucket as one object, then, in one
transaction, records the part, drops those rows and moves ``flushed`` on. It happens when a
stream holds a part's worth, when its oldest row has waited long enough, and for ended jobs
(:meth:`DatabaseLogs.settle`). Whatever dies between the steps, no byte is lost or served twice:
rows stay until their part is recorded, and a part is recorded only if ``flushed`` still is
where it starts (two flushers of one stream, in two replicas, write different objects, or the
same bytes to the same key; the one that records second finds ``flushed`` moved, and drops its
object unless it is the recorded one). An object written but not recorded is never read, and
goes with its job. While the bucket is away the rows wait; once a stream holds
``max_held_bytes``, appends are :class:`StorageUnavailable` and the agent keeps its chunks on
the node until the store takes them.

A read takes rows, then parts (each statement sees what is committed when it runs, so a flush
in between only makes them overlap), then reads the parts' ranges from the bucket.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from api.artifacts.store import (
    LogOffsetMismatch,
    StorageUnavailable,
    job_prefix,
)
from common.attempts import later_attempts_prefix
from ledger.database import Cursor, Database
from ledger.schema import create_schema

log = logging.getLogger(__name__)

PART_BYTES = 8 * 2**20
MAX_HELD_BYTES = 64 * 2**20
MAX_WAIT_S = 300.0
"""A stream's oldest held row goes to the bucket after this long, even short of a part."""
RETRY_S = 5.0
"""After a failed flush, appends to that stream in this process try again only this late."""


def schema(dialect: str) -> list[str]:
    blob = "BYTEA" if dialect == "postgres" else "BLOB"
    return [
        """CREATE TABLE IF NOT EXISTS log_streams (
            job_id TEXT NOT NULL, node_index BIGINT NOT NULL, size BIGINT NOT NULL,
            flushed BIGINT NOT NULL, PRIMARY KEY (job_id, node_index))""",
        f"""CREATE TABLE IF NOT EXISTS log_chunks (
            job_id TEXT NOT NULL, node_index BIGINT NOT NULL, start BIGINT NOT NULL,
            size BIGINT NOT NULL, data {blob} NOT NULL, created_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (job_id, node_index, start))""",
        """CREATE TABLE IF NOT EXISTS log_parts (
            job_id TEXT NOT NULL, node_index BIGINT NOT NULL, start BIGINT NOT NULL,
            size BIGINT NOT NULL, object_key TEXT NOT NULL,
            PRIMARY KEY (job_id, node_index, start))""",
    ]


class PartBucket(Protocol):
    where: str

    def put(self, key: str, data: bytes) -> None: ...
    def get_range(self, key: str, start: int, end: int) -> bytes: ...
    def delete(self, key: str) -> None: ...


@dataclass(frozen=True)
class Stream:
    job_id: str
    node_index: int

    @property
    def params(self) -> tuple[str, int]:
        return (self.job_id, self.node_index)

    def part_key(self, start: int, end: int) -> str:
        return f"{job_prefix(self.job_id)}logs/{self.node_index}/{start:020d}-{end:020d}"


@dataclass(frozen=True)
class Piece:
    start: int
    size: int
    data: bytes | None = None
    """A held row's bytes; None for a part (read from the bucket)."""
    key: str = ""


class DatabaseLogs:
    def __init__(
        self, database: Database, bucket: PartBucket, *, part_bytes: int = PART_BYTES,
        max_held_bytes: int = MAX_HELD_BYTES, max_wait_s: float = MAX_WAIT_S,
    ) -> None:  # fmt: skip
        self.database = database
        self.bucket = bucket
        self.part_bytes = part_bytes
        self.max_held_bytes = max(max_held_bytes, part_bytes)
        self.max_wait_s = max_wait_s
        self._for_update = " FOR UPDATE" if database.dialect == "postgres" else ""
        self._locks: defaultdict[Stream, threading.Lock] = defaultdict(threading.Lock)
        self._flushing: defaultdict[Stream, threading.Lock] = defaultdict(threading.Lock)
        self._retry_at: dict[Stream, float] = {}
        with database.transaction(write=True) as cursor:
            create_schema(cursor, schema(database.dialect))

    # -- appends --------------------------------------------------------------------------

    def size(self, job_id: str, node_index: int) -> int:
        with self.database.transaction() as cursor:
            cursor.execute("SELECT size FROM log_streams WHERE job_id = ? AND node_index = ?",
                           (job_id, node_index))  # fmt: skip
            row = cursor.fetchone()
        return int(row["size"]) if row else 0

    def append(self, job_id: str, offset: int, data: bytes, node_index: int) -> int:
        stream = Stream(job_id, node_index)
        try:
            size, held, oldest = self._append(stream, offset, data)
        except HeldTooLong:
            self._try_flush(stream, everything=False, now=True)  # the bucket may be back
            size, held, oldest = self._append(stream, offset, data, refuse=True)
        if held >= self.part_bytes or (held and time.time() - oldest >= self.max_wait_s):
            self._try_flush(stream, everything=False)
        return size

    def _append(
        self, stream: Stream, offset: int, data: bytes, *, refuse: bool = False
    ) -> tuple[int, int, float]:
        """The stream's size, held bytes and oldest held row's time after the append."""
        with self._locks[stream], self.database.transaction(write=True) as cursor:
            size, flushed = self._locked_stream(cursor, stream)
            if offset > size:
                raise LogOffsetMismatch(size)
            fresh = data[size - offset :]
            if fresh and size - flushed + len(fresh) > self.max_held_bytes:
                if refuse:
                    raise StorageUnavailable(
                        "log bytes", self.bucket.where,
                        f"the bucket has not taken this log's last {size - flushed} bytes yet; "
                        "the node keeps the rest until it does",
                    )  # fmt: skip
                raise HeldTooLong
            if fresh:
                cursor.execute(
                    "INSERT INTO log_chunks (job_id, node_index, start, size, data, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (*stream.params, size, len(fresh), fresh, time.time()),
                )
                cursor.execute(
                    "UPDATE log_streams SET size = ? WHERE job_id = ? AND node_index = ?",
                    (size + len(fresh), *stream.params),
                )
            cursor.execute(
                "SELECT MIN(created_at) AS oldest FROM log_chunks "
                "WHERE job_id = ? AND node_index = ?",
                stream.params,
            )
            row = cursor.fetchone()
            oldest = float(row["oldest"]) if row and row["oldest"] is not None else time.time()
        return size + len(fresh), size + len(fresh) - flushed, oldest

    def _locked_stream(self, cursor: Cursor, stream: Stream) -> tuple[int, int]:
        """The stream's size and flushed bytes, its row locked (made when new)."""
        query = ("SELECT size, flushed FROM log_streams WHERE job_id = ? AND node_index = ?"
                 + self._for_update)  # fmt: skip
        cursor.execute(query, stream.params)
        row = cursor.fetchone()
        if row is None:
            cursor.execute(
                "INSERT INTO log_streams (job_id, node_index, size, flushed) VALUES (?, ?, 0, 0) "
                "ON CONFLICT (job_id, node_index) DO NOTHING",
                stream.params,
            )
            cursor.execute(query, stream.params)
            row = cursor.fetchone()
            assert row is not None
        return int(row["size"]), int(row["flushed"])

    # -- flushes --------------------------------------------------------------------------

    def _try_flush(self, stream: Stream, *, everything: bool, now: bool = False) -> None:
        """Flush unless this process just failed to (``now``: even so); a failure is logged,
        the rows stay. An append that succeeds anyway need not wait on a bucket that is away
        each time."""
        if not now and time.monotonic() < self._retry_at.get(stream, 0.0):
            return
        try:
            self.flush(stream, everything=everything)
        except StorageUnavailable as error:
            self._retry_at[stream] = time.monotonic() + RETRY_S
            log.warning("log of job %s node %d stays in the database for now: %s",
                        stream.job_id, stream.node_index, error)  # fmt: skip

    def flush(self, stream: Stream, *, everything: bool) -> int:
        """Write held rows to the bucket, a part at a time: the rows due, then every whole
        part's worth behind them (``everything``: all of them, after any other thread of this
        process flushing the stream); how many bytes went. For an append (not
        ``everything``), another thread's flush is enough."""
        lock = self._flushing[stream]
        if not lock.acquire(blocking=everything):
            return 0
        try:
            moved = 0
            while went := self._flush_part(stream, whole=bool(moved) and not everything):
                moved += went
            self._retry_at.pop(stream, None)
            return moved
        finally:
            lock.release()

    def _flush_part(self, stream: Stream, *, whole: bool) -> int:
        start, end, data = self._next_part(stream, whole=whole)
        if not data:
            return 0
        key = stream.part_key(start, end)
        self.bucket.put(key, data)
        with self.database.transaction(write=True) as cursor:
            _, flushed = self._locked_stream(cursor, stream)
            if flushed == start:
                cursor.execute(
                    "INSERT INTO log_parts (job_id, node_index, start, size, object_key) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (*stream.params, start, end - start, key),
                )
                cursor.execute(
                    "DELETE FROM log_chunks WHERE job_id = ? AND node_index = ? AND start < ?",
                    (*stream.params, end),
                )
                cursor.execute(
                    "UPDATE log_streams SET flushed = ? WHERE job_id = ? AND node_index = ?",
                    (end, *stream.params),
                )
                return end - start
            cursor.execute("SELECT 1 FROM log_parts WHERE object_key = ?", (key,))
            recorded = cursor.fetchone() is not None
        if not recorded:  # another replica flushed these bytes first: this copy is not read
            self.bucket.delete(key)
        return 0

    def _next_part(self, stream: Stream, *, whole: bool = False) -> tuple[int, int, bytes]:
        """The held bytes from ``flushed`` on, whole rows up to a part's worth (``whole``:
        none short of a part's worth)."""
        with self.database.transaction() as cursor:
            cursor.execute("SELECT flushed FROM log_streams WHERE job_id = ? AND node_index = ?",
                           stream.params)  # fmt: skip
            row = cursor.fetchone()
            if row is None:
                return 0, 0, b""
            start = int(row["flushed"])
            cursor.execute(
                "SELECT start, size FROM log_chunks "
                "WHERE job_id = ? AND node_index = ? AND start >= ? ORDER BY start",
                (*stream.params, start),
            )
            end = start
            for chunk in cursor.fetchall():
                if int(chunk["start"]) != end or end - start >= self.part_bytes:
                    break  # a part is whole rows, contiguous from ``flushed``
                end += int(chunk["size"])
            if end == start or (whole and end - start < self.part_bytes):
                return 0, 0, b""
            cursor.execute(
                "SELECT data FROM log_chunks WHERE job_id = ? AND node_index = ? "
                "AND start >= ? AND start < ? ORDER BY start",
                (*stream.params, start, end),
            )
            data = b"".join(bytes(chunk["data"]) for chunk in cursor.fetchall())
        if len(data) != end - start:  # the rows went meanwhile: another replica flushed them
            return 0, 0, b""
        return start, end, data

    def settle(self, job_ids: Iterable[str]) -> None:
        """Every held byte of these jobs' streams, every attempt's, to the bucket
        (StorageUnavailable when it is away: the rows stay, try again later)."""
        for job_id in job_ids:
            with self.database.transaction() as cursor:
                cursor.execute(f"SELECT job_id, node_index FROM log_streams WHERE {_OF_JOB} "
                               "AND size > flushed", _of_job(job_id))  # fmt: skip
                streams = [Stream(row["job_id"], int(row["node_index"]))
                           for row in cursor.fetchall()]  # fmt: skip
            for stream in streams:
                self.flush(stream, everything=True)

    def flush_waiting(self) -> int:
        """Flush every stream whose oldest held row has waited ``max_wait_s`` (quiet logs of
        running jobs, ended jobs' last lines); how many streams went. For a periodic sweep."""
        with self.database.transaction() as cursor:
            cursor.execute(
                "SELECT job_id, node_index FROM log_chunks GROUP BY job_id, node_index "
                "HAVING MIN(created_at) <= ?",
                (time.time() - self.max_wait_s,),
            )
            streams = [Stream(row["job_id"], int(row["node_index"])) for row in cursor.fetchall()]
        for stream in streams:
            self.flush(stream, everything=True)
        return len(streams)

    # -- reads ----------------------------------------------------------------------------

    def read(self, job_id: str, offset: int, limit: int, node_index: int) -> bytes:
        stream = Stream(job_id, node_index)
        end = offset + max(0, limit)
        if end <= offset:
            return b""
        pieces = self._pieces(stream, offset, end)
        out = bytearray()
        position = offset
        while position < end:
            piece = next((p for p in pieces if p.start <= position < p.start + p.size), None)
            if piece is None:
                break
            stop = min(end, piece.start + piece.size)
            if piece.data is not None:
                out += piece.data[position - piece.start : stop - piece.start]
            else:
                out += self.bucket.get_range(piece.key, position - piece.start,
                                             stop - piece.start)  # fmt: skip
            position = stop
        return bytes(out)

    def _pieces(self, stream: Stream, offset: int, end: int) -> list[Piece]:
        """Held rows first, then parts: a flush that commits in between only makes them
        overlap. Rows come before parts where both hold a byte (no request to the bucket)."""
        with self.database.transaction() as cursor:
            cursor.execute(
                "SELECT start, data FROM log_chunks WHERE job_id = ? AND node_index = ? "
                "AND start < ? AND start + size > ? ORDER BY start",
                (*stream.params, end, offset),
            )
            rows = [Piece(int(row["start"]), len(row["data"]), bytes(row["data"]))
                    for row in cursor.fetchall()]  # fmt: skip
            cursor.execute(
                "SELECT start, size, object_key FROM log_parts WHERE job_id = ? "
                "AND node_index = ? AND start < ? AND start >= COALESCE((SELECT MAX(start) "
                "FROM log_parts WHERE job_id = ? AND node_index = ? AND start <= ?), 0) "
                "ORDER BY start",
                (*stream.params, end, *stream.params, offset),
            )
            parts = [Piece(int(row["start"]), int(row["size"]), key=row["object_key"])
                     for row in cursor.fetchall()]  # fmt: skip
        return rows + parts

    # -- purge ----------------------------------------------------------------------------

    def forget(self, job_id: str) -> None:
        """Drop a job's rows, every attempt's (its objects go with the job's prefix)."""
        with self.database.transaction(write=True) as cursor:
            for table in ("log_chunks", "log_parts", "log_streams"):
                cursor.execute(f"DELETE FROM {table} WHERE {_OF_JOB}", _of_job(job_id))


_OF_JOB = "(job_id = ? OR job_id LIKE ? ESCAPE '!')"
"""The streams of a job's every attempt (its first under its id, the later ones under
:func:`~common.attempts.attempt_key`), with the parameters of :func:`_of_job`."""


def _of_job(job_id: str) -> tuple[str, str]:
    escaped = "".join(f"!{c}" if c in "!%_" else c for c in later_attempts_prefix(job_id))
    return job_id, escaped + "%"


class HeldTooLong(Exception):
    """The stream holds ``max_held_bytes`` the bucket has not taken yet."""
