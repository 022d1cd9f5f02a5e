"""Views folded in bulk: each job's document kept in memory while many events fold, and each
job's rows written once at the end, where the live projector reads and writes a job's rows back
for every event (:func:`projections.views.apply_event`).

A rebuild (:mod:`projections.rebuild`) folds the whole ledger so, into a SQLite file: the
shadow views themselves, or on PostgreSQL a scratch file that is then loaded with ``COPY``. The
same code folds every event (:func:`projections.views.fold_job_event`), so the rows are those the
live projector writes. Events other than a job's (nodes, datasets) are few, and are applied by
the per-event code into the same file.
"""

from __future__ import annotations

import gc
import json
import sqlite3
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, cast
from uuid import UUID

import orjson
from eventsourcing.application import Application
from eventsourcing.persistence import DatetimeAsISO, Mapper, StoredEvent, find_id_convertor
from eventsourcing.postgres import PostgresApplicationRecorder
from eventsourcing.sqlite import SQLiteApplicationRecorder
from eventsourcing.utils import resolve_topic
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier

from domain.job_attempts import is_job_event
from ledger.database import Cursor
from projections.views import (
    JOB_DETAILS_COLUMNS,
    JOB_LIST_COLUMNS,
    JOB_NODES_COLUMNS,
    apply_event,
    fold_job_event,
    is_viewed,
    job_rows,
)

Sink = Callable[[str, Sequence[str], list[tuple[Any, ...]]], object]
"""Where a table's rows go: ``(table, columns, rows)``."""
PAGE = 5000
"""Ledger events read at once."""
MAX_DOCUMENTS = 200_000
"""Jobs held in memory at once (a few KiB each); past it their rows are written and the
documents let go: a later event of one of them reads its document back."""


class BulkFold:
    """Folds events into the views of one SQLite file, inside the caller's transaction on
    ``connection`` (``cursor`` is that transaction's)."""

    def __init__(self, cursor: Cursor, connection: sqlite3.Connection) -> None:
        self.cursor = cursor
        self.connection = connection
        self.position = 0
        self._documents: dict[str, dict[str, Any]] = {}
        self._positions: dict[str, int] = {}
        self._written: set[str] = set()
        """Jobs whose rows a flush wrote, read back since: their rows are replaced."""

    def apply(self, domain_event: Any | None, position: int, at: str | None = None) -> None:
        """Fold one event (None: one the views pass over); ``at``: its time as ISO text, if
        the caller has it."""
        if domain_event is None:
            pass
        elif is_job_event(domain_event):
            job_id = str(domain_event.originator_id)
            document = self._documents.get(job_id)
            if document is None and type(domain_event).__name__ != "Submitted":
                document = self._read_back(job_id)
            document = fold_job_event(self.cursor, document, domain_event, position, at)
            if document is not None:
                self._documents[job_id] = document
                self._positions[job_id] = position
                if len(self._documents) > MAX_DOCUMENTS:
                    self.flush()
        else:
            apply_event(self.cursor, domain_event, position)
        self.position = position

    def _read_back(self, job_id: str) -> dict[str, Any] | None:
        self.cursor.execute("SELECT document FROM job_details WHERE id = ?", (job_id,))
        row = self.cursor.fetchone()
        if row is None:
            return None
        self._written.add(job_id)
        document: dict[str, Any] = json.loads(row["document"])
        return document

    def flush(self, sink: Sink | None = None) -> None:
        """Write the rows of every job held, once each, and let the documents go: into this
        file, or to ``sink`` (a rebuild on PostgreSQL copies its last ones straight into the
        shadow views, not through the file)."""
        again = [(job_id,) for job_id in self._written if job_id in self._documents]
        for table, key in (("job_list", "id"), ("job_details", "id"), ("job_nodes", "job_id")):
            self.connection.executemany(f"DELETE FROM {table} WHERE {key} = ?", again)
        listed, details, nodes = [], [], []
        for job_id, document in self._documents.items():
            row, detail, placed = job_rows(document, self._positions[job_id])
            listed.append(row)
            details.append(detail)
            nodes += placed
        for table, columns, rows in (("job_list", JOB_LIST_COLUMNS, listed),
                                     ("job_details", JOB_DETAILS_COLUMNS, details),
                                     ("job_nodes", JOB_NODES_COLUMNS, nodes)):  # fmt: skip
            if sink is not None:
                sink(table, columns, rows)
            else:
                self.connection.executemany(f"INSERT INTO {table} ({', '.join(columns)}) "
                                            f"VALUES ({', '.join('?' * len(columns))})",
                                            rows)  # fmt: skip
        self._documents.clear()
        self._positions.clear()
        self._written.clear()


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection meanwhile: a bulk fold makes millions of small objects and
    keeps tens of thousands of documents, none in a cycle, and the collector's full passes over
    them took 45% of the fold (10,000 jobs). The pause is the whole process's: the cycles the
    server's other threads leave meanwhile (few: reference counting frees the rest) are
    collected once the fold ends."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def ledger_events(
    app: Application[Any], after: int, head: int
) -> Iterator[tuple[Any | None, int, str | None]]:
    """The ledger's domain events after position ``after`` up to ``head``, with positions and
    their times as ISO text where the state held that text (the fold writes it: no
    ``isoformat`` of the time just read from it, 7% of a rebuild); None, None for the events the
    views pass over (not decoded: see :func:`projections.views.is_viewed`)."""
    decode = _decoder(app.mapper)
    viewed: dict[str, bool] = {}
    for page in _stored_pages(app.recorder, after, head):
        for position, originator_id, version, topic, state in page:
            shown = viewed.get(topic)
            if shown is None:
                shown = viewed[topic] = is_viewed(topic)
            if shown:
                domain_event, at = decode(originator_id, version, topic, state)
                yield domain_event, position, at
            else:
                yield None, position, None


KNOWN_ORIGINATORS = 50_000
"""Originators' ids a decoder keeps at once (a few MiB)."""


class _NamedUUID(UUID):
    """A UUID that keeps its text: the fold asks each event's originator id for it."""

    __slots__ = ("_text",)
    _text: str

    def __init__(self, uuid: UUID) -> None:
        super().__init__(int=uuid.int)
        object.__setattr__(self, "_text", str(uuid))

    def __str__(self) -> str:
        return self._text


_TYPED = b'"_type_"'
_DIGITS = bytes.maketrans(bytes(range(256)), bytes(48 if 48 <= b <= 57 else 32 for b in range(256)))
"""Every digit to ``0``, every other byte to a space: a run of 19 digits is then ``0`` * 19,
found in C (a regular expression took 3 µs a state)."""
_LONG_NUMBER = b"0" * 19


def _decoder(mapper: Mapper[Any]) -> Callable[[Any, int, str, bytes], tuple[Any, str | None]]:
    """How a stored event becomes its domain event: as the mapper makes it, faster where the
    state is plain JSON but for the event's time, as nearly all are. The library's decoder
    calls its object hook on every object of a state and makes a UUID of the originator's id
    for every event: most of a rebuild's reading. Here orjson reads a state where it reads
    nothing otherwise than ``json.loads`` (no run of 19 digits: orjson reads an integer past
    64 bits as a float; no NaN or infinity, which it refuses) and where the one transcoded
    value is the time at ``timestamp`` (decoded by the mapper's own transcoding), of an event
    class at the version it was stored at. Every other state, and every event of an encrypted
    or compressed ledger, goes through the mapper. ``tests/integration/test_rebuild_views.py``
    checks that both make the same events. With each event, the ISO text its time was read
    from (the library's ``isoformat`` of it), or None."""

    def mapped(originator_id: Any, version: int, topic: str, state: bytes) -> tuple[Any, None]:
        return mapper.to_domain_event(StoredEvent(originator_id=originator_id,
                                                  originator_version=version, topic=topic,
                                                  state=state)), None  # fmt: skip

    transcoder = mapper.transcoder
    names = getattr(transcoder, "names", None)
    if mapper.cipher or mapper.compressor or not isinstance(names, dict):
        return mapped

    originators: dict[Any, Any] = {}
    """The originators' ids by their stored form, made once each while their events come
    (a job's are close together in the ledger): 15% of a rebuild on SQLite made a UUID from
    its text for every event, and the fold its text from the UUID again."""

    def decode(
        originator_id: Any, version: int, topic: str, state: bytes
    ) -> tuple[Any, str | None]:
        state = bytes(state)
        if state.count(_TYPED) != 1 or _LONG_NUMBER in state.translate(_DIGITS):
            return mapped(originator_id, version, topic, state)
        try:
            event_state = orjson.loads(state)
        except orjson.JSONDecodeError:
            return mapped(originator_id, version, topic, state)
        if type(event_state) is not dict:
            return mapped(originator_id, version, topic, state)
        moment = event_state.get("timestamp")
        cls = resolve_topic(topic)
        stored_version = event_state.pop("class_version", 1)
        if type(moment) is not dict or stored_version != getattr(cls, "class_version", 1):
            return mapped(originator_id, version, topic, state)  # (an older version: upcast)
        transcoding = names.get(moment.get("_type_"))
        if transcoding is None or "_data_" not in moment:
            return mapped(originator_id, version, topic, state)
        text = moment["_data_"]
        event_state["timestamp"] = transcoding.decode(text)
        originator = originators.get(originator_id)
        if originator is None:
            if len(originators) >= KNOWN_ORIGINATORS:
                originators.clear()
            uuid = find_id_convertor(cls, cast(Hashable, type(originator_id)))(originator_id)
            originator = originators[originator_id] = (
                _NamedUUID(uuid) if type(uuid) is UUID else uuid
            )
        event_state["originator_id"] = originator
        event_state["originator_version"] = version
        domain_event = object.__new__(cls)
        object.__setattr__(domain_event, "__dict__", event_state)
        return domain_event, text if type(transcoding) is DatetimeAsISO else None

    return decode


Page = list[tuple[int, Any, int, str, bytes]]


def _stored_pages(recorder: Any, after: int, head: int) -> Iterator[Page]:
    """The stored events after ``after`` up to ``head``, :data:`PAGE` at a time, as plain
    ``(position, originator id, version, topic, state)`` rows: what the recorder's
    ``select_notifications`` reads, without making a notification and a UUID of every event
    (a third of a rebuild's reading, and a third of the events are not viewed)."""
    read: Callable[[int], Page]
    if isinstance(recorder, SQLiteApplicationRecorder):
        statement = (f"SELECT rowid, originator_id, originator_version, topic, state "
                     f"FROM {recorder.events_table_name} WHERE rowid > ? AND rowid <= ? "
                     f"ORDER BY rowid LIMIT ?")  # fmt: skip

        def read(start: int) -> Page:
            with recorder.datastore.transaction(commit=False) as cursor:
                cursor.execute(statement, (start, head, PAGE))
                return [tuple(row) for row in cursor.fetchall()]  # type: ignore[misc]
    elif isinstance(recorder, PostgresApplicationRecorder):
        query = SQL("SELECT notification_id, originator_id, originator_version, topic, state "
                    "FROM {}.{} WHERE notification_id > %s AND notification_id <= %s "
                    "ORDER BY notification_id LIMIT %s").format(
            Identifier(recorder.datastore.schema), Identifier(recorder.events_table_name))

        def read(start: int) -> Page:
            with recorder.datastore.get_connection() as connection:
                cursor = connection.cursor(row_factory=tuple_row)
                cursor.execute(query, (start, head, PAGE))
                return cursor.fetchall()  # type: ignore[return-value]
    else:
        raise TypeError(f"no way to read the stored events of a {type(recorder).__name__}")
    if after >= head:
        return
    # the next page is read while this one folds: the database works meanwhile
    with ThreadPoolExecutor(1, "ledger-reader") as reader:
        reading = reader.submit(read, after)
        while True:
            page = reading.result()
            if not page:
                return
            if page[-1][0] < head:
                reading = reader.submit(read, page[-1][0])
            yield page
            if page[-1][0] >= head:
                return
