"""What `admin verify` and `admin purge` use: the ledger's application and its database, the
views, and the artifact store (handed over by :meth:`api.services.Services.ledger_parts`)."""

from __future__ import annotations

from dataclasses import dataclass

from api.artifacts.store import ArtifactStore
from domain.application import TrainingJobs
from ledger.database import Database
from projections.projector import Projector
from projections.queries import Queries


@dataclass(frozen=True)
class LedgerParts:
    jobs: TrainingJobs
    database: Database
    projector: Projector
    queries: Queries
    artifacts: ArtifactStore
