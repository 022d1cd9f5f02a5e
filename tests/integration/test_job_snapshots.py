"""A job with many events (checkpoints) loads from its last snapshot, and goes on from there."""

from __future__ import annotations

from collections.abc import Callable

from domain.actors import user
from domain.application import TrainingJobs
from tests.integration.conftest import Lifecycle

CHECKPOINTS = 250


def test_a_job_with_many_checkpoints_loads_from_a_snapshot(
    open_app: Callable[[], TrainingJobs],
) -> None:
    writer = open_app()
    lifecycle = Lifecycle(writer)
    job_id = lifecycle.in_progress("long-run")
    node = lifecycle.node_id
    for step in range(CHECKPOINTS):
        writer.record_checkpoint(job_id, node, {"id": f"ck-{step}", "name": f"step-{step}"})
    version = writer.job(job_id).version

    reader = open_app()  # a fresh application: no aggregate cache
    snapshots = list(reader.snapshots.get(job_id, desc=True, limit=1)) if reader.snapshots else []
    assert snapshots, "no snapshot of the job"
    assert snapshots[0].originator_version >= version - 100
    loaded = reader.job(job_id)
    assert loaded.version == version
    assert loaded.checkpoint_ids == {f"ck-{step}" for step in range(CHECKPOINTS)}
    assert str(loaded.status) == "in progress"

    # Commands go on from the snapshot: a resend is still known, a stop is recorded.
    assert reader.record_checkpoint(job_id, node, {"id": "ck-7", "name": "step-7"}).position is None
    reader.request_stop(job_id, by=user(Lifecycle.owner))
    assert reader.job(job_id).status == "stop in progress"
    assert open_app().job(job_id).status == "stop in progress"

