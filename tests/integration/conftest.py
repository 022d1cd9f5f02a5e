"""Integration helpers: the real application on the real store, and a driver for lifecycles."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from api.settings import Settings
from domain.actors import user
from domain.application import Outcome, TrainingJobs


def job_spec(accels: int = 1) -> dict[str, Any]:
    return {
        "repository_url": "https://example.com/org/repo.git",
        "entry_point": ["train.py", "--epochs", "1"],
        "accels": accels,
        "nodes": 1,
    }


@pytest.fixture
def store_env(database_url: str, tmp_path: Path) -> dict[str, str]:
    """The eventsourcing environment of the store under test."""
    return Settings(data_dir=tmp_path, database_url=database_url).event_store_env()


@pytest.fixture
def open_app(store_env: dict[str, str]) -> Iterator[Callable[[], TrainingJobs]]:
    """Opens application instances on the store (one per replica); closes them afterwards."""
    opened: list[TrainingJobs] = []

    def open_one() -> TrainingJobs:
        app = TrainingJobs(env=store_env)
        opened.append(app)
        return app

    yield open_one
    for app in opened:
        app.close()


@pytest.fixture
def app(open_app: Callable[[], TrainingJobs]) -> TrainingJobs:
    return open_app()


class Lifecycle:
    """Drives jobs through the application the way the scheduler, users and agents do."""

    owner = "alice"

    def __init__(self, app: TrainingJobs) -> None:
        self.app = app
        self.node_id, _ = app.register_node("gpu-node-1", accels=8, accel_type="H100")
        self.other_node_id, _ = app.register_node("gpu-node-2", accels=8, accel_type="H100")

    def submit(self, name: str, accels: int = 1, owner: str = owner) -> UUID:
        return self.app.submit(owner, name, job_spec(accels), by=user(owner)).job_id

    def report(self, job_id: UUID, kind: str, **facts: Any) -> Outcome:
        report = {"node_id": self.node_id, "type": kind, **facts}
        return self.app.report(job_id, self.node_id, report)

    def building(self, name: str, accels: int = 1) -> UUID:
        job_id = self.submit(name, accels)
        self.app.begin_scheduling(job_id)
        self.app.assign(job_id, self.node_id, "gpu-node-1")
        return job_id

    def in_progress(self, name: str, accels: int = 1) -> UUID:
        """Built on gpu-node-1: the control plane starts it with the lowest free indices."""
        job_id = self.building(name, accels=accels)
        self.report(job_id, "built", commit="c0ffee")
        assert self.app.job(job_id).status == "in progress"
        return job_id

    def succeeded(self, name: str) -> UUID:
        job_id = self.in_progress(name)
        self.report(job_id, "exited", exit_code=0)
        return job_id


@pytest.fixture
def lifecycle(app: TrainingJobs) -> Lifecycle:
    return Lifecycle(app)
