"""Ledgers written before the model was split into one module per aggregate name its classes
``domain.model:...``. Every such topic (an aggregate, each of its event classes, the aggregate
a snapshot holds) still resolves to the moved class; new events are stored under the new topics;
a ledger holding both loads, from its snapshots too, on each store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import StoredEvent
from eventsourcing.utils import get_topic, resolve_topic

from api.ledger.verify import verify_ledger
from api.services import build_services
from api.settings import Settings
from domain.actors import user
from domain.application import TrainingJobs
from domain.job import TrainingJob
from domain.job_name import JobName
from domain.node import Node
from tests.integration.conftest import Lifecycle
from tests.integration.test_stored_ledger import import_ledger, load_fixture

AGGREGATES: tuple[type[Aggregate], ...] = (TrainingJob, JobName, Node)
OLD_MODULE = "domain.model"
NEW_MODULES = {"domain.job:": "TrainingJob", "domain.job_name:": "JobName", "domain.node:": "Node"}


def classes_stored_by_topic() -> list[type]:
    """Each aggregate and every event class of it: the classes a stored topic can name."""
    return [
        cls
        for aggregate in AGGREGATES
        for cls in (aggregate, *(value for value in vars(aggregate).values()
                                 if isinstance(value, type) and issubclass(value, Aggregate.Event)))
    ]  # fmt: skip


@pytest.mark.parametrize("cls", classes_stored_by_topic(), ids=lambda cls: cls.__qualname__)
def test_a_topic_written_as_domain_model_resolves_to_the_moved_class(cls: type) -> None:
    assert resolve_topic(f"{OLD_MODULE}:{cls.__qualname__}") is cls
    new = get_topic(cls)
    assert new == f"{cls.__module__}:{cls.__qualname__}"
    assert not new.startswith(f"{OLD_MODULE}:")
    assert resolve_topic(new) is cls


def as_before_the_split(text: str) -> str:
    """A stored topic or state as the ledger held it before the split."""
    for module, aggregate in NEW_MODULES.items():
        text = text.replace(f"{module}{aggregate}", f"{OLD_MODULE}:{aggregate}")
    return text


def copy_as_before_the_split(app: TrainingJobs, source: UUID, *, from_snapshot: bool) -> UUID:
    """Store ``source``'s events again under a new id with the old topics; with
    ``from_snapshot``, its last snapshot (holding the old topic too) and only the events after
    it, so that the copy loads only through that snapshot."""
    copy = uuid4()
    after = 0
    if from_snapshot:
        assert app.snapshots is not None
        [snapshot] = app.snapshots.recorder.select_events(source, desc=True, limit=1)
        after = snapshot.originator_version
        state = as_before_the_split(bytes(snapshot.state).decode())
        assert f'"topic":"{OLD_MODULE}:' in state
        app.snapshots.recorder.insert_events([StoredEvent(
            originator_id=copy, originator_version=after, topic=snapshot.topic,
            state=state.encode())])  # fmt: skip
    app.recorder.insert_events([
        StoredEvent(originator_id=copy, originator_version=stored.originator_version,
                    topic=as_before_the_split(stored.topic),
                    state=as_before_the_split(bytes(stored.state).decode()).encode())
        for stored in app.recorder.select_events(source, gt=after)
    ])  # fmt: skip
    return copy


def topics_of(app: TrainingJobs, originator: UUID) -> list[str]:
    return [stored.topic for stored in app.recorder.select_events(originator)]


@pytest.mark.parametrize("from_snapshot", [False, True], ids=["events", "snapshot"])
def test_a_ledger_with_old_and_new_topics_loads(
    open_app: Callable[[], TrainingJobs], from_snapshot: bool
) -> None:
    writer = open_app()
    lifecycle = Lifecycle(writer)
    job_id = lifecycle.in_progress("before-split")
    writer.record_checkpoint(job_id, lifecycle.node_id, {"id": "ck-1", "name": "step-1"})
    name_id = JobName.create_id(Lifecycle.owner, "before-split")
    node_id = UUID(lifecycle.node_id)
    for originator in (job_id, name_id, node_id):
        writer.take_snapshot(originator)
    writer.record_checkpoint(job_id, lifecycle.node_id, {"id": "ck-2", "name": "step-2"})
    old_job, old_name, old_node = (
        copy_as_before_the_split(writer, originator, from_snapshot=from_snapshot)
        for originator in (job_id, name_id, node_id)
    )
    assert all(topic.startswith(f"{OLD_MODULE}:TrainingJob.")
               for topic in topics_of(writer, old_job))  # fmt: skip

    reader = open_app()  # a fresh application: nothing cached
    job = reader.job(old_job)
    assert (type(job), job.name, str(job.status)) == (TrainingJob, "before-split", "in progress")
    assert job.checkpoint_ids == {"ck-1", "ck-2"}
    assert job.placements[0]["accelerators"] == [0]
    name: JobName = reader.repository.get(old_name)
    assert (type(name), name.job_id) == (JobName, job_id)
    node: Node = reader.node(old_node)
    assert (type(node), node.name, node.allocations) == (Node, "gpu-node-1", {str(job_id): [0]})

    reader.request_stop(old_job, by=user(Lifecycle.owner))
    *old, new = topics_of(reader, old_job)
    assert new == "domain.job:TrainingJob.StopRequested"
    assert all(topic.startswith(f"{OLD_MODULE}:") for topic in old)
    mixed = open_app().job(old_job)
    assert str(mixed.status) == "stop in progress"
    history = [type(event).__name__ for event in open_app().history(old_job)]
    assert history[-2:] == ["CheckpointRecorded", "StopRequested"]


def test_verify_counts_the_jobs_of_a_ledger_written_before_the_split(
    database_url: str, tmp_path: Path
) -> None:
    fixture: dict[str, Any] = load_fixture()
    modules = {event["topic"].partition(":")[0] for event in fixture["events"]}
    assert modules == {OLD_MODULE, "domain.datasets"}
    services = build_services(Settings(data_dir=tmp_path, database_url=database_url))
    try:
        import_ledger(services, fixture["events"])
        verified = verify_ledger(services.ledger_parts(), artifacts="none")  # none came with it
        assert verified["jobs"] == len(fixture["statuses"]) == 10
        assert verified["ok"], verified
    finally:
        services.close()
