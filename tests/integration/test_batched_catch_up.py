"""The live projector folds each batch it reads at once, on each store: the views it leaves are
those it leaves applying one event at a time, and an event it cannot apply still halts it at
that event, after those before it."""

from __future__ import annotations

from typing import Any

import pytest

from api.services import Services
from domain.actors import user
from domain.job import TrainingJob
from projections.projector import ProjectionHalted, Projector
from projections.views import VIEW_TABLES
from tests.integration import test_rebuild_views
from tests.integration.conftest import Lifecycle, job_spec
from tests.integration.test_projections import (
    a_job_straddles_a_batch_boundary,
    heard_by,
    ledger_after,
)
from tests.integration.test_rebuild_views import dump, workload

services = test_rebuild_views.services  # the real services on each store


def drop_views(services: Services) -> None:
    with services.database.transaction(write=True) as cursor:
        for table in VIEW_TABLES:
            cursor.execute(f"DROP TABLE {table}")
        cursor.execute("DELETE FROM projection_tracking")


def project_anew(services: Services, batch: int, **options: Any) -> Projector:
    """Fresh views of the whole ledger, caught up in batches of ``batch`` events."""
    drop_views(services)
    return Projector(services.jobs, services.database, batch=batch, **options)


def test_views_folded_in_batches_equal_those_applied_one_event_at_a_time(
    services: Services,
) -> None:
    workload(services)
    assert a_job_straddles_a_batch_boundary(services.jobs)
    head = services.jobs.recorder.max_notification_id()  # type: ignore[attr-defined]
    folded = dump(services)
    assert project_anew(services, batch=1).catch_up() == head
    assert dump(services) == folded
    assert project_anew(services, batch=head).catch_up() == head  # the whole ledger at once
    assert dump(services) == folded


def test_listeners_hear_every_event_once_in_ledger_order(services: Services) -> None:
    workload(services, jobs=20)
    projector = project_anew(services, batch=7)
    heard = heard_by(projector)
    start = projector.catch_up()
    lifecycle = Lifecycle(services.jobs)
    for index in range(5):  # more than a batch of events, of many jobs
        lifecycle.succeeded(f"late-{index}")
    assert projector.catch_up() > start + 7
    assert heard == ledger_after(services.jobs, 0)


def test_an_event_the_views_reject_halts_them_after_the_events_before_it(
    services: Services,
) -> None:
    workload(services, jobs=10)
    before = services.projector.catch_up()
    services.jobs.save(TrainingJob(owner="alice", name="huge", spec=job_spec(accels=2**70),
                                   by=user("alice")))  # past the model's guards  # fmt: skip
    services.jobs.submit("alice", "after", job_spec(), by=user("alice"))
    projector = project_anew(services, batch=500)  # the bad event mid-batch
    with pytest.raises(ProjectionHalted) as halted:
        projector.catch_up()
    assert halted.value.poison.position == before + 1
    assert projector.position() == before
    assert services.queries.job_by_name("alice", "huge") is None
    skipping = project_anew(services, batch=500, skip={before + 1})
    assert skipping.catch_up() == services.jobs.recorder.max_notification_id()  # type: ignore[attr-defined]
    assert services.queries.job_by_name("alice", "after") is not None
