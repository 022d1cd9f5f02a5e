"""What the scheduler uses, and nothing else: the ledger's commands, the views it reads, the
nodes' heartbeats, the waiting jobs' reasons, the lock that makes one replica lead, and the
settings it keeps to. The composition root (:meth:`api.services.Services.scheduling`) hands
them over; the scheduler, its deadlines and its view of the fleet never see the rest."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from api.scheduling.leadership import LeaderLock
from api.scheduling.nodes import OperationalState
from api.scheduling.waits import Waits
from api.settings import Settings
from domain.application import TrainingJobs
from projections.projector import Projector
from projections.queries import Queries


@dataclass(frozen=True)
class SchedulingParts:
    jobs: TrainingJobs
    queries: Queries
    state: OperationalState
    """The nodes' heartbeats and claims."""
    waits: Waits
    """Why each waiting job waits (written each round)."""
    projector: Projector
    quotas: Callable[[], dict[str, int]]
    """Each user's accelerator quota."""
    rounds: Callable[[], AbstractContextManager[Any]]
    """Times one round (a context manager: the rounds' histogram of ``/metrics``)."""
    leader_lock: LeaderLock
    wakeup: threading.Event
    """Set by a write the scheduler should see at once (a submission, a heartbeat)."""
    leading: threading.Event
    """Set while this server's scheduler holds the lock and schedules."""
    settings: Settings
