"""Tamper evidence: every stored event's hash, chained per aggregate, and a running digest.

The ledger's recorders (eventsourcing's, for SQLite and PostgreSQL) are extended here: in the
very transaction that inserts events, each event gets a row in ``<events table>_chain``:

- ``event_hash`` = SHA-256 over the previous event's hash *of the same aggregate* and the event
  as stored (aggregate id, version, topic, state bytes: encrypted and compressed if the ledger
  is, so checking needs no key);
- ``ledger_digest`` = SHA-256 over the previous row's digest and this event's hash and position,
  a running digest of the whole ledger in the order it was written (writers are serialized:
  SQLite has one writer, and eventsourcing's PostgreSQL recorder locks the events table; a
  group of saves committed together is chained save after save, as written).

:func:`verify_chain` recomputes both from the raw rows and names the first event whose stored
row was altered, deleted, inserted behind the ledger's back or reordered. Someone who can write
the database can rewrite the chain as well; the head digest that ``flexai admin verify`` prints
is what to keep elsewhere (and compare with ``--expect-digest``) to catch that too.
Events written before the chain existed are left out, and said to be.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder
from eventsourcing.sqlite import SQLiteApplicationRecorder
from psycopg.sql import SQL, Identifier

from ledger.group_commit import PostgresGroupCommit, SQLiteGroupCommit

GENESIS = ""
_DOMAIN = b"flexai-ledger-chain-v1"


def event_hash(previous: str, originator_id: str, version: int, topic: str, state: bytes) -> str:
    digest = hashlib.sha256(_DOMAIN)
    for part in (previous.encode(), originator_id.encode(), str(version).encode(), topic.encode()):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    digest.update(len(state).to_bytes(8, "big"))
    digest.update(state)
    return digest.hexdigest()


def ledger_digest(previous: str, position: int, hashed: str) -> str:
    return hashlib.sha256(f"{previous}|{position}|{hashed}".encode()).hexdigest()


def _id(originator_id: UUID | str) -> str:
    return originator_id.hex if isinstance(originator_id, UUID) else str(originator_id)


def chain_table(events_table: str) -> str:
    return f"{events_table}_chain"


def _chain_rows(
    stored_events: Sequence[StoredEvent],
    positions: Sequence[int],
    previous_hash: Any,
    last_digest: str,
) -> list[tuple[int, str, int, str, str]]:
    """``(position, originator, version, event hash, ledger digest)`` for new events;
    ``previous_hash(originator, version)`` is the hash of the aggregate's event before."""
    rows = []
    pending: dict[str, str] = {}  # events of this same transaction
    digest = last_digest
    for stored, position in zip(stored_events, positions, strict=True):
        originator = _id(stored.originator_id)
        version = stored.originator_version
        before = pending.get(f"{originator}/{version - 1}")
        if before is None:
            before = previous_hash(originator, version - 1) if version > 1 else GENESIS
        hashed = event_hash(before or GENESIS, originator, version, stored.topic,
                            bytes(stored.state))  # fmt: skip
        digest = ledger_digest(digest, position, hashed)
        pending[f"{originator}/{version}"] = hashed
        rows.append((position, originator, version, hashed, digest))
    return rows


class ChainedSQLiteRecorder(SQLiteGroupCommit, SQLiteApplicationRecorder):
    """eventsourcing's SQLite application recorder, chaining each event it inserts; saves
    that come together commit together (:mod:`ledger.group_commit`)."""

    def construct_create_table_statements(self) -> list[str]:
        return [
            *super().construct_create_table_statements(),
            f"CREATE TABLE IF NOT EXISTS {chain_table(self.events_table_name)} ("
            "notification_id INTEGER PRIMARY KEY, originator_id TEXT NOT NULL, "
            "originator_version INTEGER NOT NULL, event_hash TEXT NOT NULL, "
            "ledger_digest TEXT NOT NULL, UNIQUE (originator_id, originator_version))",
        ]

    def select_chain(self, after: int, limit: int) -> list[ChainRow]:
        """Chain rows after position ``after``, in position order."""
        table = chain_table(self.events_table_name)
        with self.datastore.transaction(commit=False) as c:
            c.execute(f"SELECT notification_id, originator_id, originator_version, event_hash, "
                      f"ledger_digest FROM {table} WHERE notification_id > ? "
                      "ORDER BY notification_id LIMIT ?", (after, limit))  # fmt: skip
            return [ChainRow(int(r[0]), str(r[1]), int(r[2]), str(r[3]), str(r[4]))
                    for r in c.fetchall()]  # fmt: skip

    def _insert_events(self, c: Any, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Any:
        positions = super()._insert_events(c, stored_events, **kwargs)
        if not stored_events or not positions:
            return positions
        table = chain_table(self.events_table_name)

        def previous_hash(originator: str, version: int) -> str | None:
            c.execute(f"SELECT event_hash FROM {table} WHERE originator_id = ? "
                      "AND originator_version = ?", (originator, version))  # fmt: skip
            row = c.fetchone()
            return str(row[0]) if row else None

        c.execute(f"SELECT ledger_digest FROM {table} ORDER BY notification_id DESC LIMIT 1")
        last = c.fetchone()
        for row in _chain_rows(stored_events, positions, previous_hash,
                               str(last[0]) if last else GENESIS):  # fmt: skip
            c.execute(f"INSERT INTO {table} VALUES (?, ?, ?, ?, ?)", row)
        return positions


KNOWN_HASHES = 20_000
"""Events whose hash a PostgreSQL recorder keeps (see ``ChainedPostgresRecorder._known``)."""


class ChainedPostgresRecorder(PostgresGroupCommit, PostgresApplicationRecorder):
    """eventsourcing's PostgreSQL application recorder, chaining each event it inserts (after
    the insert, in its transaction, while it holds the lock on the events table); saves that
    come together commit together (:mod:`ledger.group_commit`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.chain_table_name = chain_table(self.events_table_name)
        self.hashes_written = []
        self._known: OrderedDict[tuple[str, int], str] = OrderedDict()
        """The last events' hashes this process committed, by ``(aggregate, version)``: an
        aggregate's next event chains from its hash without reading it back (a hash, once
        committed, never changes; another replica's events are read)."""
        self.sql_create_statements.append(
            SQL(
                "CREATE TABLE IF NOT EXISTS {schema}.{table} ("
                "notification_id bigint PRIMARY KEY, originator_id text NOT NULL, "
                "originator_version bigint NOT NULL, event_hash text NOT NULL, "
                "ledger_digest text NOT NULL, UNIQUE (originator_id, originator_version))"
            ).format(schema=Identifier(self.datastore.schema),
                     table=Identifier(self.chain_table_name))  # fmt: skip
        )

    def select_chain(self, after: int, limit: int) -> list[ChainRow]:
        """Chain rows after position ``after``, in position order."""
        statement = SQL(
            "SELECT notification_id, originator_id, originator_version, event_hash, "
            "ledger_digest FROM {schema}.{table} WHERE notification_id > %s "
            "ORDER BY notification_id LIMIT %s"
        ).format(schema=Identifier(self.datastore.schema),
                 table=Identifier(self.chain_table_name))  # fmt: skip
        with self.datastore.get_connection() as connection, connection.cursor() as curs:
            curs.execute(statement, (after, limit))
            return [ChainRow(int(r["notification_id"]), str(r["originator_id"]),
                             int(r["originator_version"]), str(r["event_hash"]),
                             str(r["ledger_digest"])) for r in curs.fetchall()]  # fmt: skip

    def _fetch_ids_after_insert_events(
        self, curs: Any, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        positions = super()._fetch_ids_after_insert_events(curs, stored_events, **kwargs)
        if not stored_events or not positions:
            return positions
        table = SQL("{schema}.{table}").format(schema=Identifier(self.datastore.schema),
                                               table=Identifier(self.chain_table_name))  # fmt: skip

        def previous_hash(originator: str, version: int) -> str | None:
            known = self._known.get((originator, version))
            if known is not None:
                return known
            curs.execute(SQL("SELECT event_hash FROM {0} WHERE originator_id = %s "
                             "AND originator_version = %s").format(table),
                         (originator, version))  # fmt: skip
            row = curs.fetchone()
            return str(row["event_hash"]) if row else None

        head = self.chain_head if self.group_open else None  # the group's last digest
        if head is None:
            curs.execute(SQL("SELECT ledger_digest FROM {0} ORDER BY notification_id DESC "
                             "LIMIT 1").format(table))  # fmt: skip
            last = curs.fetchone()
            head = str(last["ledger_digest"]) if last else GENESIS
        rows = _chain_rows(stored_events, positions, previous_hash, head)
        curs.executemany(SQL("INSERT INTO {0} VALUES (%s, %s, %s, %s, %s)").format(table), rows)
        if self.group_open:
            self.chain_head = rows[-1][4]
            self.hashes_written.extend(((row[1], row[2]), row[3]) for row in rows)
        return positions

    def hashes_committed(self) -> None:
        known = self._known
        for key, hashed in self.hashes_written:
            known[key] = hashed
            known.pop((key[0], key[1] - 1), None)  # only an aggregate's last event is asked for
        while len(known) > KNOWN_HASHES:
            known.popitem(last=False)


# -- verification ------------------------------------------------------------------------


@dataclass(frozen=True)
class RawEvent:
    position: int
    originator_id: str
    version: int
    topic: str
    state: bytes
    as_text: bool = False
    """The row holds its state as text, not bytes (SQLite keeps what it is given): no command
    writes that, and the library cannot read it back; its UTF-8 bytes are hashed."""


@dataclass(frozen=True)
class ChainRow:
    position: int
    originator_id: str
    version: int
    event_hash: str
    ledger_digest: str


@dataclass
class ChainReport:
    events: int = 0
    chained: int = 0
    unchained_before: int | None = None
    """Events before this position were written before the chain existed (not checked)."""
    head_digest: str = GENESIS
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_chain(
    events: Iterable[RawEvent], chain: Iterable[ChainRow], *, max_problems: int = 20
) -> ChainReport:
    """Recompute the chain from raw events (in position order) and the recorded chain rows
    (in position order); say where they part."""
    report = ChainReport()
    rows = _Peekable(chain)
    last_hash: dict[str, tuple[int, str]] = {}  # originator -> (version, its recorded hash)
    unchained: set[str] = set()  # aggregates with events from before the chain existed
    digest = GENESIS

    def problem(text: str) -> bool:
        report.problems.append(text)
        return len(report.problems) >= max_problems

    def deleted(row: ChainRow) -> str:
        return (f"event {row.originator_id} version {row.version} at position {row.position} "
                "was deleted from the ledger (its chain row remains)")  # fmt: skip

    for event in events:
        report.events += 1
        where = f"event {event.originator_id} version {event.version} at position {event.position}"
        while (row := rows.peek()) is not None and row.position < event.position:
            next(rows)
            if problem(deleted(row)):
                return report
        row = rows.peek()
        if row is None or row.position != event.position:
            if report.chained == 0:  # written before the chain existed: not checked
                report.unchained_before = event.position + 1
                unchained.add(event.originator_id)
            elif problem(f"{where} is not in the chain: it was inserted behind the ledger's "
                         "back"):
                return report  # fmt: skip
            continue
        next(rows)
        report.chained += 1
        moved = (row.originator_id, row.version) != (event.originator_id, event.version)
        if moved and problem(f"{where}: the chain recorded {row.originator_id} version "
                             f"{row.version} there: events were reordered or renumbered"):
            return report  # fmt: skip
        known = last_hash.get(event.originator_id)
        previous = GENESIS
        if known is not None and known[0] == event.version - 1:
            previous = known[1]
        elif event.version > 1 and not (known is None and event.originator_id in unchained):
            had = f"version {known[0]}" if known else "none"
            if problem(f"{where}: the aggregate's previous event is missing (the last one "
                       f"found: {had})"):
                return report  # fmt: skip
        if event.as_text and problem(f"{where}: its stored row was altered (its state is held "
                                     "as text, which no command writes: it cannot be read "
                                     "back)"):
            return report  # fmt: skip
        hashed = event_hash(previous, event.originator_id, event.version, event.topic,
                            event.state)  # fmt: skip
        if hashed != row.event_hash and problem(
            f"{where}: its stored row was altered (its hash is not the one recorded when it was "
            "written)"
        ):
            return report
        last_hash[event.originator_id] = (event.version, row.event_hash)
        digest = ledger_digest(digest, event.position, row.event_hash)
        if digest != row.ledger_digest:
            if problem(f"{where}: the ledger's running digest breaks here (chain rows before "
                       "it were altered, deleted or reordered)"):
                return report  # fmt: skip
            digest = row.ledger_digest
    for row in rows:
        if problem(deleted(row)):
            break
    report.head_digest = digest
    return report


PAGE = 1000


def raw_events(recorder: Any) -> Iterator[RawEvent]:
    """Every stored event, in position order, as stored (no decoding: no key needed)."""
    start = 1
    while True:
        page = recorder.select_notifications(start, PAGE)
        for notification in page:
            state = notification.state  # text where a hand edit made it so (SQLite)
            as_text = isinstance(state, str)
            yield RawEvent(notification.id, _id(notification.originator_id),
                           notification.originator_version, notification.topic,
                           state.encode() if as_text else bytes(state), as_text)  # fmt: skip
        if len(page) < PAGE:
            return
        start = page[-1].id + 1


def chain_rows(recorder: Any) -> Iterator[ChainRow]:
    """Every chain row, in position order."""
    after = 0
    while True:
        page = recorder.select_chain(after, PAGE)
        yield from page
        if len(page) < PAGE:
            return
        after = page[-1].position


def is_chained(recorder: Any) -> bool:
    return hasattr(recorder, "select_chain")


class _Peekable(Iterator[ChainRow]):
    def __init__(self, items: Iterable[ChainRow]) -> None:
        self._items = iter(items)
        self._next: ChainRow | None = None
        self._done = False

    def peek(self) -> ChainRow | None:
        if self._next is None and not self._done:
            try:
                self._next = next(self._items)
            except StopIteration:
                self._done = True
        return self._next

    def __next__(self) -> ChainRow:
        item = self.peek()
        if item is None:
            raise StopIteration
        self._next = None
        return item
