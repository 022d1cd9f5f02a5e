"""The composition root: every concrete part, built from the settings in one place."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from api.artifacts import LocalArtifactStore
from api.settings import Settings
from api.state import OperationalState
from domain.application import TrainingJobs
from projections.db import Database, open_database
from projections.projector import Projector
from projections.queries import Queries


@dataclass
class Services:
    settings: Settings
    jobs: TrainingJobs
    database: Database
    projector: Projector
    queries: Queries
    state: OperationalState
    artifacts: LocalArtifactStore
    scheduler_wakeup: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        self.projector.stop()
        self.jobs.close()
        self.database.close()


def build_services(settings: Settings) -> Services:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    database = open_database(settings.resolved_database_url)
    jobs = TrainingJobs(env=settings.event_store_env())
    return Services(
        settings=settings,
        jobs=jobs,
        database=database,
        projector=Projector(jobs, database),
        queries=Queries(database),
        state=OperationalState(database),
        artifacts=LocalArtifactStore(settings.data_dir / "artifacts"),
    )
