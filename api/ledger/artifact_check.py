"""``admin verify``'s look at the artifact store: every artifact the ledger names is there, with
the size the ledger recorded (``shallow``), and with its SHA-256 too (``deep``: each object read
whole).

The artifacts come from the ledger itself, not from the views: each job's
``CheckpointRecorded`` and ``OutputsRecorded`` (a node's later output replaces its earlier one)
and each dataset's ``Pushed`` (one object per content, however many versions or users pushed
it). A job whose artifacts were purged (``ArtifactsPurged``) is passed over: they are gone on
purpose. An artifact recorded before sizes and hashes were is only looked for.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from eventsourcing.utils import get_topic

from api.artifacts.store import ArtifactStore, checkpoint_key, dataset_key, output_key
from domain.application import TrainingJobs
from domain.datasets import Dataset
from domain.events import event_name
from domain.topics import JOB_EVENT_TOPICS

Depth = Literal["none", "shallow", "deep"]
PAGE = 500
JOB_EVENTS = ("CheckpointRecorded", "OutputsRecorded", "ArtifactsPurged")
DATASET_EVENTS = ("Created", "Pushed")
ATTEMPT_EVENTS = ("Retried", "Preempted")
"""A job's attempt ends: the outputs recorded after are the next attempt's (a key of its own)."""


@dataclass(frozen=True)
class Artifact:
    kind: str
    """``checkpoint``, ``output`` or ``dataset``."""
    key: str
    size: int | None
    """As the ledger recorded it; None for one recorded before sizes were."""
    sha256: str | None
    job_id: str | None = None
    dataset: str | None = None
    """A dataset's ``owner/name`` (the first that pushed its content)."""


def ledger_artifacts(jobs: TrainingJobs) -> list[Artifact]:
    """Every artifact the ledger names, but those of jobs whose artifacts were purged."""
    found: dict[str, Artifact] = {}
    purged: set[str] = set()
    datasets: dict[str, str] = {}
    attempts: dict[str, int] = {}
    for event in _events(jobs):
        name, origin = event_name(event), str(event.originator_id)
        if type(event).__qualname__.startswith("Dataset."):
            if name == "Created":
                datasets[origin] = f"{event.owner}/{event.name}"
            else:
                key = dataset_key(event.content_hash)
                found.setdefault(key, Artifact("dataset", key, getattr(event, "archive_size", None),
                                               event.content_hash, dataset=datasets.get(origin)))
        elif name == "CheckpointRecorded":
            checkpoint = event.checkpoint
            key = checkpoint_key(origin, checkpoint["id"])
            found[key] = Artifact("checkpoint", key, checkpoint.get("archive_size"),
                                  checkpoint.get("sha256"), job_id=origin)  # fmt: skip
        elif name in ATTEMPT_EVENTS:
            attempts[origin] = int(event.attempt) + 1
        elif name == "OutputsRecorded":
            attempt = int(getattr(event, "attempt", None) or attempts.get(origin, 1))
            key = output_key(origin, event.node_index, attempt)
            found[key] = Artifact("output", key, event.size, event.sha256, job_id=origin)
        elif name == "ArtifactsPurged":
            purged.add(origin)
    return [artifact for artifact in found.values() if artifact.job_id not in purged]


def _events(jobs: TrainingJobs) -> Iterator[Any]:
    """The ledger's events that name artifacts, decoded, in the order they were recorded."""
    wanted = (tuple(prefix + name for prefix in JOB_EVENT_TOPICS
                    for name in (*JOB_EVENTS, *ATTEMPT_EVENTS))
              + tuple(f"{get_topic(Dataset)}.{name}" for name in DATASET_EVENTS))  # fmt: skip
    start = 1
    while True:
        page = jobs.recorder.select_notifications(start, PAGE)
        for notification in page:
            if notification.topic in wanted:
                yield jobs.mapper.to_domain_event(notification)
        if len(page) < PAGE:
            return
        start = page[-1].id + 1


def problem_of(store: ArtifactStore, artifact: Artifact, depth: Depth) -> str | None:
    """What is wrong with the artifact in the store, if anything."""
    size = store.size(artifact.key)
    if size is None:
        return "missing from the artifact store"
    if artifact.size is not None and size != artifact.size:
        return f"altered: {size} bytes in the store, {artifact.size} recorded"
    if depth == "deep" and artifact.sha256:
        try:
            stored = store.sha256(artifact.key)
        except FileNotFoundError:
            return "missing from the artifact store"
        if stored != artifact.sha256:
            return f"altered: its SHA-256 is {stored}, the ledger recorded {artifact.sha256}"
    return None
