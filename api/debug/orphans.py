"""Debug sessions that a server left open in the ledger when it died: closed by another.

A session lives in the memory of the server process that relays it (:mod:`api.debug.sessions`).
A server that stops records the end of its sessions; one killed at once (``kill -9``, a lost
host) cannot. Each ``DebugSessionOpened`` names its relay (the instance id of that process,
:mod:`api.debug.presence`), so a server closes, as it starts and then every few seconds while it
schedules, every open session whose relay is not alive, or that names none (recorded before
relays were): ``DebugSessionClosed`` by the scheduler, the reason starting with
``server_restarted``. The periodic sweep takes a relay for dead when two sweeps in a row find
it so (a live server takes its presence again within a second of losing it). A session whose
job ended a while ago is closed too even if its relay lives: the node ends a session when its
job ends, and one it did not end is over all the same.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from api.debug.presence import Presence
from domain.actors import scheduler
from domain.application import TrainingJobs
from domain.errors import DomainError
from projections.projector import Projector
from projections.queries import Queries

log = logging.getLogger(__name__)

SERVER_RESTARTED = ("server_restarted: the server that relayed the session stopped before it "
                    "ended")  # fmt: skip
JOB_ENDED = "job_ended: the job ended ({status}) and its node did not end the session"
SWEEP_EVERY_S = 5.0
"""How often the scheduling server looks for sessions of servers that died meanwhile."""
ENDED_GRACE_S = 30.0
"""How long after its job ended a session that a live server relays may stay open."""


@dataclass(frozen=True)
class OrphanParts:
    """What closing orphaned sessions uses: the ledger's commands, the views, the servers'
    presence."""

    jobs: TrainingJobs
    queries: Queries
    projector: Projector
    presence: Presence


def close_orphaned_sessions(
    parts: OrphanParts, now: datetime | None = None, suspects: set[str] | None = None
) -> int:
    """Close every orphaned session in the ledger, and wait until the views show it; returns
    how many this call closed.

    With ``suspects`` (the relays found dead by the previous call), a relay is taken for dead
    only when it was dead then too: a server whose presence went with the database for a
    moment holds it again by then. ``suspects`` becomes the relays found dead now."""
    now = now or datetime.now(UTC)
    sessions = parts.queries.open_debug_sessions()
    relays = {row["relay"] for row in sessions if row["relay"]}
    alive = parts.presence.alive(relays) if relays else set()
    if suspects is not None:
        dead = relays - alive
        alive |= dead - suspects
        suspects.clear()
        suspects.update(dead)
    closed, position = 0, None
    for row in sessions:
        reason = _why_orphaned(row, alive, now)
        if reason is None:
            continue
        seconds = (now - datetime.fromisoformat(row["opened_at"])).total_seconds()
        try:
            outcome = parts.jobs.close_debug_session(UUID(row["job_id"]), row["id"], reason,
                                                        seconds, scheduler())  # fmt: skip
        except DomainError as error:
            log.warning("debug session %s of job %s stays open: %s", row["id"], row["job_id"],
                        error)  # fmt: skip
            continue
        if outcome.position is not None:  # else another server closed it meanwhile
            closed, position = closed + 1, outcome.position
            log.info("debug session %s of job %s closed: %s", row["id"], row["job_id"], reason)
    if position is not None:
        parts.projector.wait(position)
    return closed


def _why_orphaned(row: dict[str, Any], alive: set[str], now: datetime) -> str | None:
    if not row["relay"] or row["relay"] not in alive:
        return SERVER_RESTARTED
    ended = row["ended_at"]
    if ended and now - datetime.fromisoformat(ended) > timedelta(seconds=ENDED_GRACE_S):
        return JOB_ENDED.format(status=row["status"])
    return None


def close_at_start(parts: OrphanParts) -> None:
    """As a server starts, before it serves: take its presence, close what dead servers left
    open. Neither stops the start when the database is away (the leader's sweep does it later,
    and a session cannot be opened without the presence)."""
    try:
        parts.presence.hold()
        if parts.projector.halted is None:
            close_orphaned_sessions(parts)
    except Exception:
        log.exception("closing the debug sessions dead servers left open failed")


class OrphanSweep:
    """The scheduling server's periodic sweep (a replica that died and never came back leaves
    no session open for more than two sweeps); each run survives its own errors."""

    def __init__(self, parts: OrphanParts, every_s: float = SWEEP_EVERY_S) -> None:
        self.parts = parts
        self.every_s = every_s
        self._due = 0.0
        self._suspects: set[str] = set()

    def run_if_due(self) -> None:
        if time.monotonic() < self._due:
            return
        self._due = time.monotonic() + self.every_s
        try:
            close_orphaned_sessions(self.parts, suspects=self._suspects)
        except Exception:
            log.exception("closing orphaned debug sessions failed; trying again in %g s",
                          self.every_s)  # fmt: skip
