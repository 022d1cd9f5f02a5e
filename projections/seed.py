"""A bulk seeder: many ended jobs written straight into the ledger, its hash chain and the
views, thousands of jobs a second (``bench/million.py``, and tests of big stores).

What it writes is what the commands write. Each job is one of two shapes, both made once by the
domain's own commands on real aggregates: ``TrainingJob.submit`` with its ``JobName`` claim,
``begin_scheduling``, then ``reject`` (``stopped`` jobs, every ``stop_every``-th one:
``request_stop`` and ``confirm_stopped``). The application's mapper turns those events into
stored events and the views' own fold (:func:`projections.views.fold_job_event`) turns them into
view rows. Those are the templates: from one job to the next only its id, its name and its
moments differ, and they are put into the templates' text. The first job of each shape is then
checked against the real thing: its stored events decoded by the mapper and encoded again give
the very same bytes, and folded by the views give the very same rows.

Rows go in big batches, one transaction each (PostgreSQL: ``COPY``; SQLite: ``executemany``;
see :mod:`projections.seed_writes`), holding the ledger's write lock as the recorders do: the
events, their chain rows (:mod:`projections.chain`: each event's hash, the running digest), and
the views' rows with their tracking position, so that views and ledger move together. The views
must have caught up with the ledger first (the seeder catches them up), and no server should be
writing meanwhile.
"""

from __future__ import annotations

import hashlib
import random
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from eventsourcing.application import Application
from eventsourcing.persistence import Mapper, StoredEvent

from domain.actors import scheduler, user
from domain.ids import time_ordered_id
from domain.job import TrainingJob
from domain.job_name import JobName
from projections.chain import _DOMAIN as _CHAIN_DOMAIN
from projections.chain import GENESIS, event_hash, ledger_digest
from projections.db import Database, SQLiteDatabase
from projections.projector import Projector
from projections.seed_writes import VIEWS, Batch, open_writer
from projections.views import fold_job_event, job_rows

SPEC: dict[str, Any] = {
    "repository_url": "https://github.com/example/spiral-classifier.git",
    "entry_point": ["train.py", "--epochs", "10"],
    "accels": 1,
    "nodes": 1,
    "env": {"LEARNING_RATE": "0.01"},
}
BATCH = 10_000
"""Jobs per transaction."""
WRITER_SWITCH_S = 0.001
"""The interpreter's switch interval while seeding (see ``_switching_often``)."""
STEP = timedelta(microseconds=10)
"""Between two jobs' submissions; a job's events share its moment."""
_NAME = "seedjobnamezq"
"""The template's name, put in place of each job's."""
_SEPARATOR = "\x00"
"""Between a template's texts: JSON never holds it raw."""
_ID_LENGTH = (32).to_bytes(8, "big")
"""An aggregate id's length in the chain's hashes (32 hex digits)."""


def job_name(index: int) -> str:
    return f"job-{index:07d}"


@dataclass(frozen=True)
class Seeded:
    jobs: int
    events: int
    first_position: int
    last_position: int
    seconds: float


# -- the templates ---------------------------------------------------------------------------


class _Text:
    """A text with slots: every occurrence of each token found in it, filled per job."""

    def __init__(self, text: str, tokens: dict[str, str]) -> None:
        longest_first = sorted(tokens.values(), key=len, reverse=True)
        pattern = re.compile("|".join(re.escape(token) for token in longest_first))
        slots = {token: slot for slot, token in tokens.items()}
        escaped = text.replace("{", "{{").replace("}", "}}")
        self.format = pattern.sub(lambda found: "{" + slots[found.group(0)] + "}", escaped)

    def fill(self, values: dict[str, str]) -> list[str]:
        """The texts joined in the template (``_SEPARATOR``), filled."""
        return self.format.format_map(values).split(_SEPARATOR)


@dataclass
class _Shape:
    """One shape of job: its stored events and view rows, as templates."""

    events: list[tuple[str, int, str]]
    """``(whose: "job" or "claim", version, topic)`` in ledger order."""
    listed: list[Any]
    """``job_list``'s row (its position aside); the values at ``varying`` are filled."""
    varying: list[int]
    text: _Text
    """Each event's state, ``varying``'s values of ``job_list``'s row and ``job_details``'
    document, in one text (one ``format_map`` a job)."""
    last_job_event: int
    """Index in ``events`` of the job's last event (``job_list.position``)."""
    hashed_parts: list[bytes] = field(default_factory=list)
    """Each event's version and topic, as its chain hash takes them."""

    def __post_init__(self) -> None:
        for _, version, topic in self.events:
            parts = (str(version).encode(), topic.encode())
            self.hashed_parts.append(b"".join(_length(part) + part for part in parts))


def _shape(app: Application[Any], owner: str, stopped: bool) -> _Shape:
    job = TrainingJob.submit(owner=owner, name=_NAME, spec=SPEC, by=user(owner))
    claim = JobName(owner=owner, name=_NAME, job_id=job.id)
    job.begin_scheduling(by=scheduler())
    if stopped:
        job.request_stop(by=user(owner))
        job.confirm_stopped(by=scheduler())
    else:
        job.reject(code="no_fit", message="no node has enough accelerators", by=scheduler())
    job_events = job.collect_events()
    domain_events = [job_events[0], *claim.collect_events(), *job_events[1:]]
    tokens = {"name": _NAME, "job": str(job.id), "job_hex": job.id.hex}
    tokens |= {f"t{k}": event.timestamp.isoformat() for k, event in enumerate(domain_events)}
    plain: Mapper[Any] = Mapper(transcoder=app.mapper.transcoder)
    events, texts = [], []
    document = None
    scratch = SQLiteDatabase(":memory:")
    with scratch.transaction() as cursor:
        for position, event in enumerate(domain_events, start=1):
            stored = plain.to_stored_event(event)
            whose = "job" if event.originator_id == job.id else "claim"
            events.append((whose, stored.originator_version, stored.topic))
            texts.append(bytes(stored.state).decode())
            if whose == "job":
                document = fold_job_event(cursor, document, event, position)
                last = position - 1
    scratch.close()
    assert document is not None
    listed, details, nodes = job_rows(document, last + 1)
    assert not nodes, "seeded jobs hold no node"
    varying = [
        index
        for index, value in enumerate(listed[:-1])
        if isinstance(value, str) and any(token in value for token in tokens.values())
    ]
    texts += [listed[index] for index in varying]
    assert not any(_SEPARATOR in text for text in [*texts, details[1]])
    text = _Text(_SEPARATOR.join([*texts, details[1]]), tokens)
    return _Shape(events, list(listed[:-1]), varying, text, last)


@dataclass
class _Job:
    job_id: uuid.UUID
    claim_id: uuid.UUID
    values: dict[str, str]


def _job(owner: str, name: str, moment: datetime, events: int, draw: random.Random) -> _Job:
    """One job's values: an id as the commands make one (:func:`domain.ids.time_ordered_id`,
    at its moment), its name, and one moment for all its events (a command's events may share
    one, too)."""
    job_id = time_ordered_id(int(moment.timestamp() * 1000), draw.getrandbits(74))
    at = moment.isoformat()
    values = {"name": name, "job": str(job_id), "job_hex": job_id.hex}
    values |= {f"t{k}": at for k in range(events)}
    return _Job(job_id, JobName.create_id(owner, name), values)


# -- writing ---------------------------------------------------------------------------------


def _encode(app: Application[Any], text: str) -> bytes:
    state = text.encode()
    if app.mapper.compressor:
        state = app.mapper.compressor.compress(state)
    if app.mapper.cipher:
        state = app.mapper.cipher.encrypt(state)
    return state


def _require(holds: bool, what: str) -> None:
    if not holds:
        raise RuntimeError(f"the seeder's templates are wrong: {what}")


def _check(app: Application[Any], shape: _Shape, job: _Job, batch: Batch, first: int) -> None:
    """The job's stored events are the mapper's own bytes; its rows are the views' own."""
    plain: Mapper[Any] = Mapper(transcoder=app.mapper.transcoder)
    document = None
    end = first + len(shape.events)
    scratch = SQLiteDatabase(":memory:")
    with scratch.transaction() as cursor:
        for offset, row in enumerate(batch.events[first:end]):
            stored = StoredEvent(uuid.UUID(str(row[0])), row[1], row[2], row[3])
            domain_event = app.mapper.to_domain_event(stored)
            again = plain.to_stored_event(domain_event).state
            expected = shape.text.fill(job.values)[offset].encode()
            _require(bytes(again) == expected, f"{row[2]}: the mapper writes {again!r}")
            if domain_event.originator_id == job.job_id:
                document = fold_job_event(cursor, document, domain_event, row[4])
                position = row[4]
    scratch.close()
    assert document is not None
    listed, details, _ = job_rows(document, position)
    _require((listed, details) == (batch.listed[-1], batch.details[-1]), "the views fold otherwise")
    previous: dict[Any, str] = {}
    for row, chained in zip(batch.events[first:end], batch.chain[first:end], strict=True):
        hashed = event_hash(previous.get(row[0], GENESIS), row[0].hex, row[1], row[2], row[3])
        _require(hashed == chained[3], "the chain hashes otherwise")
        previous[row[0]] = hashed


def _length(part: bytes) -> bytes:
    return len(part).to_bytes(8, "big")


def _add(app: Application[Any], batch: Batch, shape: _Shape, job: _Job, position: int,
         digest: str) -> str:  # fmt: skip
    """The job's events from ``position`` on; the ledger's digest after them. Each event's hash
    is :func:`projections.chain.event_hash`'s, its parts joined for one call to SHA-256, those
    that are the same for every job (version, topic) joined once (``_check`` compares)."""
    values = job.values
    texts = shape.text.fill(values)
    previous = {"job": b"", "claim": b""}
    ids = {"job": job.job_id, "claim": job.claim_id}
    claim_hex = job.claim_id.hex
    hexes = {"job": values["job_hex"], "claim": claim_hex}
    hexes_encoded = {"job": values["job_hex"].encode(), "claim": claim_hex.encode()}
    transformed = app.mapper.compressor or app.mapper.cipher
    sha256 = hashlib.sha256
    for offset, (whose, version, topic) in enumerate(shape.events):
        state = _encode(app, texts[offset]) if transformed else texts[offset].encode()
        before = previous[whose]
        hashed = sha256(b"".join((
            _CHAIN_DOMAIN, len(before).to_bytes(8, "big"), before, _ID_LENGTH,
            hexes_encoded[whose], shape.hashed_parts[offset], len(state).to_bytes(8, "big"),
            state,
        ))).hexdigest()  # fmt: skip
        previous[whose] = hashed.encode()
        at = position + offset
        digest = ledger_digest(digest, at, hashed)
        batch.events.append((ids[whose], version, topic, state, at))
        batch.chain.append((at, hexes[whose], version, hashed, digest))
    listed = list(shape.listed)
    for index, text in zip(shape.varying, texts[len(shape.events) : -1], strict=True):
        listed[index] = text
    listed.append(position + shape.last_job_event)
    batch.listed.append(tuple(listed))
    batch.details.append((values["job"], texts[-1]))
    return digest


@contextmanager
def _switching_often() -> Iterator[None]:
    """The interpreter's switch interval at ``WRITER_SWITCH_S`` meanwhile. Woken by each answer
    of the database, the writer thread waits for the GIL that the thread making the rows holds,
    up to the switch interval: 5 ms by default, more than the statement took (PostgreSQL:
    17,700 to 18,900 jobs/s seeded with 5 ms, 20,000 to 20,900 with 1 ms)."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, WRITER_SWITCH_S))
    try:
        yield
    finally:
        sys.setswitchinterval(switch)


def seed_jobs(
    app: Application[Any],
    database: Database,
    count: int,
    *,
    owner: str = "admin",
    name: Callable[[int], str] = job_name,
    stop_every: int = 10,
    batch_size: int = BATCH,
    progress: Callable[[int], None] | None = None,
) -> Seeded:
    """Append ``count`` ended jobs of ``owner`` (job ``i`` named ``name(i)``) to the ledger of
    ``app`` and to its views in ``database`` (the same database, as a server has them)."""
    began = time.perf_counter()
    Projector(app, database, VIEWS).catch_up()
    shapes = {stopped: _shape(app, owner, stopped) for stopped in (False, True)}
    moment = datetime.now(UTC) - STEP * count
    draw = random.Random(uuid.uuid4().int)
    # One thread writes a batch while this one makes the next (the drivers let go of the GIL
    # while the database works).
    with _switching_often(), open_writer(app, database) as writer, \
            ThreadPoolExecutor(1, "seed-writer") as thread:  # fmt: skip
        position, digest = first = thread.submit(writer.peek).result()
        writing: Future[None] | None = None
        for start in range(0, count, batch_size):
            batch = Batch(position, digest)
            for index in range(start, min(count, start + batch_size)):
                shape = shapes[index % stop_every == 0]
                job = _job(owner, name(index), moment + STEP * index, len(shape.events), draw)
                offset = len(batch.events)
                digest = _add(app, batch, shape, job, position + 1, digest)
                position += len(shape.events)
                if index in (0, 1):  # the first of each shape
                    _check(app, shape, job, batch, offset)
            batch.last = position
            if writing is not None:
                writing.result()
                if progress is not None:
                    progress(start)
            writing = thread.submit(writer.append, batch)
        if writing is not None:
            writing.result()
            if progress is not None:
                progress(count)
        thread.submit(writer.analyze).result()
    return Seeded(count, position - first[0], first[0] + 1, position,
                  time.perf_counter() - began)  # fmt: skip
