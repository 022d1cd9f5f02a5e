"""The bulk seeder's templates (:mod:`bench.seed`), and the check of what it makes from
them.

Each job the seeder writes is one of two shapes, both made once here by the domain's own
commands on real aggregates: ``TrainingJob.submit`` with its ``JobName`` claim,
``begin_scheduling``, then ``reject`` (``stopped`` jobs: ``request_stop`` and
``confirm_stopped``). The application's mapper turns those events into stored events and the
views' own fold (:func:`projections.views.fold_job_event`) turns them into view rows. Those are
the templates: from one job to the next only its id, its name and its moments differ, and they
are put into the templates' text. :func:`check_job` checks a job made from one against the real
thing: its stored events decoded by the mapper and encoded again give the very same bytes,
folded by the views they give the very same rows, and its events' hashes are the chain's.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from eventsourcing.application import Application
from eventsourcing.persistence import Mapper, StoredEvent

from bench.seed_writes import Batch
from domain.actors import scheduler, user
from domain.job import TrainingJob
from domain.job_name import JobName
from ledger.chain import GENESIS, event_hash
from ledger.database import SQLiteDatabase
from projections.views import fold_job_event, job_rows

SPEC: dict[str, Any] = {
    "repository_url": "https://github.com/example/spiral-classifier.git",
    "entry_point": ["train.py", "--epochs", "10"],
    "accels": 1,
    "nodes": 1,
    "env": {"LEARNING_RATE": "0.01"},
}
NAME = "seedjobnamezq"
"""The template's name, put in place of each job's."""
SEPARATOR = "\x00"
"""Between a template's texts: JSON never holds it raw."""


def _length_prefix(part: bytes) -> bytes:
    return len(part).to_bytes(8, "big")


class Template:
    """A text with slots: every occurrence of each token found in it, filled per job."""

    def __init__(self, text: str, tokens: dict[str, str]) -> None:
        longest_first = sorted(tokens.values(), key=len, reverse=True)
        pattern = re.compile("|".join(re.escape(token) for token in longest_first))
        slots = {token: slot for slot, token in tokens.items()}
        escaped = text.replace("{", "{{").replace("}", "}}")
        self.format = pattern.sub(lambda found: "{" + slots[found.group(0)] + "}", escaped)

    def fill(self, values: dict[str, str]) -> list[str]:
        """The texts joined in the template (``SEPARATOR``), filled."""
        return self.format.format_map(values).split(SEPARATOR)


@dataclass
class Shape:
    """One shape of job: its stored events and view rows, as templates."""

    events: list[tuple[str, int, str]]
    """``(whose: "job" or "claim", version, topic)`` in ledger order."""
    listed: list[Any]
    """``job_list``'s row (its position aside); the values at ``varying`` are filled."""
    varying: list[int]
    text: Template
    """Each event's state, ``varying``'s values of ``job_list``'s row and ``job_details``'
    document, in one text (one ``format_map`` a job)."""
    last_job_event: int
    """Index in ``events`` of the job's last event (``job_list.position``)."""
    steps: list[tuple[int, int, str, bytes]] = field(default_factory=list)
    """Each event's ``(whose: 0 the job, 1 the claim, version, topic, the version and topic as
    its chain hash takes them)``."""

    def __post_init__(self) -> None:
        for whose, version, topic in self.events:
            parts = (str(version).encode(), topic.encode())
            hashed = b"".join(_length_prefix(part) + part for part in parts)
            self.steps.append((int(whose == "claim"), version, topic, hashed))


def make_shape(app: Application[Any], owner: str, stopped: bool) -> Shape:
    """The template of ``owner``'s stopped jobs (``stopped``), else of their rejected jobs."""
    job = TrainingJob.submit(owner=owner, name=NAME, spec=SPEC, by=user(owner))
    claim = JobName(owner=owner, name=NAME, job_id=job.id)
    job.begin_scheduling(by=scheduler())
    if stopped:
        job.request_stop(by=user(owner))
        job.confirm_stopped(by=scheduler())
    else:
        job.reject(code="no_fit", message="no node has enough accelerators", by=scheduler())
    job_events = job.collect_events()
    domain_events = [job_events[0], *claim.collect_events(), *job_events[1:]]
    tokens = {"name": NAME, "job": str(job.id), "job_hex": job.id.hex}
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
    assert not any(SEPARATOR in text for text in [*texts, details[1]])
    text = Template(SEPARATOR.join([*texts, details[1]]), tokens)
    return Shape(events, list(listed[:-1]), varying, text, last)


def _decode(app: Application[Any], state: bytes) -> bytes:
    if app.mapper.cipher:
        state = app.mapper.cipher.decrypt(state)
    if app.mapper.compressor:
        state = app.mapper.compressor.decompress(state)
    return state


def _require(holds: bool, what: str) -> None:
    if not holds:
        raise RuntimeError(f"the seeder's templates are wrong: {what}")


def check_job(app: Application[Any], shape: Shape, batch: Batch, first: int, nth: int) -> None:
    """The batch's job ``nth``, its events from ``first`` on: its stored events are the
    mapper's own bytes; its rows are the views' own; its events' hashes are the chain's."""
    plain: Mapper[Any] = Mapper(transcoder=app.mapper.transcoder)
    document = None
    rows = batch.events[first : first + len(shape.events)]
    scratch = SQLiteDatabase(":memory:")
    with scratch.transaction() as cursor:
        for (whose, _, _), row in zip(shape.events, rows, strict=True):
            stored = StoredEvent(uuid.UUID(str(row[0])), row[1], row[2], row[3])
            domain_event = app.mapper.to_domain_event(stored)
            again = bytes(plain.to_stored_event(domain_event).state)
            _require(again == _decode(app, row[3]), f"{row[2]}: the mapper writes {again!r}")
            if whose == "job":
                document = fold_job_event(cursor, document, domain_event, row[4])
                position = row[4]
    scratch.close()
    assert document is not None
    listed, details, _ = job_rows(document, position)
    made = (batch.listed[nth], batch.details[nth])
    _require((listed, details) == made, "the views fold otherwise")
    previous: dict[str, str] = {}
    for row, chained in zip(rows, batch.chain[first : first + len(rows)], strict=True):
        aggregate = uuid.UUID(str(row[0])).hex
        hashed = event_hash(previous.get(aggregate, GENESIS), aggregate, row[1], row[2], row[3])
        _require(hashed == chained[3], "the chain hashes otherwise")
        previous[aggregate] = hashed
