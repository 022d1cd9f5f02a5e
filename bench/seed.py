"""A bulk seeder: many ended jobs written straight into the ledger, its hash chain and the
views, thousands of jobs a second (``bench/million.py``, and tests of big stores).

What it writes is what the commands write: each job is filled in from one of two templates
that the domain's own commands, the application's mapper and the views' own fold made
(:mod:`bench.seed_shapes`), and the first job of each shape is checked against the real
thing before anything is written.

Rows go in big batches, one transaction each (PostgreSQL: ``COPY``; SQLite: ``executemany``;
see :mod:`bench.seed_writes`), holding the ledger's write lock as the recorders do: the
events, their chain rows (:mod:`ledger.chain`: each event's hash, the running digest), and
the views' rows with their tracking position, so that views and ledger move together. The views
must have caught up with the ledger first (the seeder catches them up), and no server should be
writing meanwhile. The next batch is made while one is written: on SQLite in a process of its
own, on PostgreSQL in a thread (see ``_maker``). Only the running digest chains one batch to
the next: each batch is made from the last one's position and digest.
"""

from __future__ import annotations

import gc
import hashlib
import multiprocessing
import random
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from eventsourcing.application import Application

from bench.seed_shapes import Shape, check_job, make_shape
from bench.seed_writes import VIEWS, Batch, open_writer
from domain.ids import time_ordered_id
from domain.job_name import JobName
from ledger.chain import _DOMAIN as _CHAIN_DOMAIN
from ledger.chain import ledger_digest
from ledger.database import Database, SQLiteDatabase
from projections.projector import Projector

BATCH = 10_000
"""Jobs per transaction."""
WRITER_SWITCH_S = 0.001
"""The interpreter's switch interval while seeding (see ``_switching_often``)."""
STEP = timedelta(microseconds=10)
"""Between two jobs' submissions; a job's events share its moment."""
_ID_LENGTH = (32).to_bytes(8, "big")
"""An aggregate id's length in the chain's hashes (32 hex digits)."""
_NO_HASH = (0).to_bytes(8, "big")
"""An aggregate's first event's previous hash (none), as its chain hash takes it."""
_HASH_LENGTH = (64).to_bytes(8, "big")
"""A previous hash's length in the chain's hashes (64 hex digits)."""


JOB_NAMES = "job-{:07d}"
"""Seeded jobs' names (``str.format``-ed with each job's number)."""


def job_name(index: int) -> str:
    return JOB_NAMES.format(index)


@dataclass(frozen=True)
class Seeded:
    jobs: int
    events: int
    first_position: int
    last_position: int
    seconds: float


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


@dataclass(frozen=True)
class _Plan:
    """What making any batch of the jobs takes (sent to the process that makes them)."""

    shapes: tuple[Shape, Shape]
    """Rejected jobs' and stopped jobs'."""
    owner: str
    names: str
    first: int
    moment: datetime
    """Job 0's."""
    stop_every: int
    compressor: Any
    cipher: Any
    uuids: bool
    """The events' aggregate ids as UUIDs (PostgreSQL's ``COPY`` takes them), else as their hex
    digits (SQLite's column holds them; they also cross to another process faster)."""

    def shape(self, index: int) -> Shape:
        return self.shapes[index % self.stop_every == 0]


def _ready() -> None:
    """Nothing: the maker's process has started and imported this module."""


def _make(plan: _Plan, start: int, end: int, after: int, digest: str, seed: int) -> Batch:
    """Jobs ``start`` to ``end``, their events from position ``after + 1`` on, chained from the
    ledger's ``digest``."""
    draw = random.Random(seed)
    batch = Batch(after, digest)
    position = after
    for index in range(start, end):
        shape = plan.shape(index)
        moment = plan.moment + STEP * index
        job = _job(plan.owner, plan.names.format(plan.first + index), moment,
                   len(shape.events), draw)  # fmt: skip
        digest = _add(plan, batch, shape, job, position + 1, digest)
        position += len(shape.events)
    batch.last, batch.head = position, digest
    return batch


def _encode(plan: _Plan, text: str) -> bytes:
    state = text.encode()
    if plan.compressor:
        state = plan.compressor.compress(state)
    if plan.cipher:
        state = plan.cipher.encrypt(state)
    return state


def _check_first(app: Application[Any], plan: _Plan, batch: Batch) -> None:
    """The first job of each shape (jobs 0 and 1, before anything is written)."""
    first = 0
    for index in range(min(2, len(batch.listed))):
        shape = plan.shape(index)
        check_job(app, shape, batch, first, index)
        first += len(shape.events)


def _add(plan: _Plan, batch: Batch, shape: Shape, job: _Job, position: int,
         digest: str) -> str:  # fmt: skip
    """The job's events from ``position`` on; the ledger's digest after them. Each event's hash
    is :func:`ledger.chain.event_hash`'s, its parts joined for one call to SHA-256, those
    that are the same for every job (version, topic) joined once (``check_job`` compares)."""
    values = job.values
    texts = shape.text.fill(values)
    hexes = (values["job_hex"], job.claim_id.hex)
    ids = (job.job_id, job.claim_id) if plan.uuids else hexes
    keys = (_ID_LENGTH + hexes[0].encode(), _ID_LENGTH + hexes[1].encode())
    previous = [_NO_HASH, _NO_HASH]  # each one's last hash, as the next hash takes it
    transformed = plan.compressor or plan.cipher
    sha256, add_event, add_chained = hashlib.sha256, batch.events.append, batch.chain.append
    at = position
    # ``texts`` begins with the events' states (then the rows' texts)
    for (whose, version, topic, parts), text in zip(shape.steps, texts, strict=False):
        state = _encode(plan, text) if transformed else text.encode()
        hashed = sha256(b"".join((_CHAIN_DOMAIN, previous[whose], keys[whose], parts,
                                  len(state).to_bytes(8, "big"), state))).hexdigest()  # fmt: skip
        previous[whose] = _HASH_LENGTH + hashed.encode()
        digest = ledger_digest(digest, at, hashed)
        add_event((ids[whose], version, topic, state, at))
        add_chained((at, hexes[whose], version, hashed, digest))
        at += 1
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


@contextmanager
def _maker(processes: bool) -> Iterator[Executor]:
    """Where the batches are made: one process of its own (``processes``), else one thread.
    On SQLite the process, its collector off (the batches' rows are all it holds), makes the
    next batch while this one writes one, each on a core: in threads they take turns, since
    the driver lets go of the GIL for each row it inserts and waits to have it back (100,000
    jobs: 11,600 jobs/s in threads, 16,600 to 16,900 in processes). PostgreSQL works in a
    process of its own already, and there a third busy process on two cores costs more than it
    gains: 13,500 to 13,900 jobs/s against 15,700 to 17,400 in threads with the rows pickled,
    16,400 to 16,900 against 17,700 to 18,200 with them made into ``COPY``'s data there."""
    if processes:
        spawn = multiprocessing.get_context("spawn")  # nothing of this process's state taken
        executor: Executor = ProcessPoolExecutor(1, spawn, initializer=gc.disable)
    else:
        executor = ThreadPoolExecutor(1, "seed-maker")
    with executor:
        yield executor


def _made(making: Future[Batch]) -> Batch:
    try:
        return making.result()
    except BrokenProcessPool as error:
        raise RuntimeError(
            "the process that makes the seeder's batches ended without one (its own error, if "
            "any, is above); a script that seeds must start under "
            "`if __name__ == \"__main__\":`, since that process imports it"
        ) from error


def seed_jobs(
    app: Application[Any],
    database: Database,
    count: int,
    *,
    owner: str = "admin",
    names: str = JOB_NAMES,
    first: int = 0,
    stop_every: int = 10,
    batch_size: int = BATCH,
    progress: Callable[[int], None] | None = None,
) -> Seeded:
    """Append ``count`` ended jobs of ``owner`` to the ledger of ``app`` and to its views in
    ``database`` (the same database, as a server has them). Job ``i`` is named
    ``names.format(first + i)``.

    On SQLite, past one batch, the batches are made in a process of their own (see
    ``_maker``), unless the ledger is encrypted or compressed (its cipher stays here). A
    script that seeds must start under ``if __name__ == "__main__":``, as that process imports
    it."""
    began = time.perf_counter()
    compressor, cipher = app.mapper.compressor, app.mapper.cipher
    in_sqlite = isinstance(database, SQLiteDatabase)
    processes = in_sqlite and count > batch_size and not (compressor or cipher)
    with _maker(processes) as maker:
        maker.submit(_ready)  # the process starts meanwhile
        Projector(app, database, VIEWS).catch_up()
        shapes = (make_shape(app, owner, False), make_shape(app, owner, True))
        moment = datetime.now(UTC) - STEP * count
        plan = _Plan(shapes, owner, names, first, moment, stop_every, compressor, cipher,
                     not in_sqlite)  # fmt: skip
        draw = random.Random(uuid.uuid4().int)

        def make(start: int, after: int, digest: str) -> Future[Batch]:
            """Jobs ``start`` on, a batch of them, after position ``after`` and ``digest``."""
            return maker.submit(_make, plan, start, min(count, start + batch_size), after,
                                digest, draw.getrandbits(64))  # fmt: skip

        with _switching_often(), open_writer(app, database) as writer:
            position, digest = head = writer.peek()
            making = make(0, position, digest)
            for start in range(0, count, batch_size):
                batch = _made(making)
                if start == 0:
                    _check_first(app, plan, batch)
                position, digest, end = batch.last, batch.head, start + batch_size
                if end < count:  # made while this one is written
                    making = make(end, position, digest)
                writer.append(batch)
                if progress is not None:
                    progress(min(count, end))
            writer.analyze()
    return Seeded(count, position - head[0], head[0] + 1, position,
                  time.perf_counter() - began)  # fmt: skip
