"""New jobs joining a long line, explained without a new plan.

A plan reads, orders and explains every waiting job: 0.1 s for 30,000 of them here. When jobs
kept coming, each round planned again, and rounds took half the server's time (the most they
may), so single submissions went at half their rate while a long line waited.

A round now makes no plan when all that happened since the last one is new jobs that began to
wait: the ledger's only events since are ``Submitted``, ``SchedulingStarted`` and name claims,
the nodes alive and the quotas are the same, and the last plan placed, refused and preempted
nothing. Each new job then waits for the very reason the last plan gave the jobs of its
priority and shape (accelerators, nodes): it can take no room that they could not, as the
policy's own memo of decisions holds within a round (:class:`domain.policy._Round`). A job of
another priority or shape, of an owner with a quota, or any other event: the round plans.
Until the next plan, such a job's explanation has no place in line (``inspect`` then counts
its place oldest first, as for a job no round explained yet). The next plan comes as before:
when anything else happens, and at least every ``REPLAN_EVERY_S`` (or its share).

Only after a plan that took ``LONG_PLAN_S``: a short line is planned again at every change,
so each job has its exact place at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from api.scheduling.fleet import Static
from api.scheduling.reasons import scheduling_wait
from domain.policy import Plan, Queued
from domain.scheduling import Wait

ARRIVALS = frozenset({"TrainingJob.Submitted", "TrainingJob.SchedulingStarted",
                      "JobName.Created", "JobName.Claimed"})  # fmt: skip
"""The events of a job joining the line (with its name's claim)."""
LONG_PLAN_S = 0.005
"""A plan that took less is made again at every change."""

Shape = tuple[int, int, int]
"""A waiting job's priority rank, accelerators and nodes."""


class Arrivals:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._other = True
        """Whether an event other than a job's arrival came since the last plan began."""
        self._waits: dict[Shape, Wait | None] | None = None
        """The last plan's Wait for each shape (None: jobs of it were decided otherwise);
        None: no round goes without a plan until the next one."""
        self._lined: set[str] = set()
        """The jobs waiting at the last plan, and those that joined since."""

    def on_events(self, events: Sequence[Any]) -> None:
        """A projector's listener (told before the waiting line is)."""
        if any(type(event).__qualname__ not in ARRIVALS for event in events):
            with self._lock:
                self._other = True

    def planning(self) -> None:
        """A plan begins: what comes from now on is after it."""
        with self._lock:
            self._other = False
            self._waits = None

    def planned(self, rows: Iterable[str], queue: Sequence[Queued], decided: Plan,
                quotas: Mapping[str, int], patience_s: float, took: float) -> None:  # fmt: skip
        """What the plan decided for the line's jobs (``rows``), in ``took`` seconds."""
        if took < LONG_PLAN_S or decided.preemptions:
            return
        waits: dict[Shape, Wait | None] = {}
        decisions = decided.decisions
        for job in queue:
            decision = decisions.get(job.job_id)
            if not isinstance(decision, Wait):
                return  # placed or refused: its events come, and the next round plans
            if job.owner in quotas or job.waited_s >= patience_s:
                continue
            shape = (job.priority, job.accels, job.nodes)
            known = waits.setdefault(shape, decision)
            if known is not None and known is not decision and known != decision:
                waits[shape] = None
        with self._lock:
            self._lined = set(rows)
            if not self._other:
                self._waits = waits

    def explain(
        self, changed: set[str] | None, rows: Mapping[str, dict[str, Any]],
        static: Mapping[str, Static], quotas: Mapping[str, int],
    ) -> dict[str, dict[str, Any]] | None:  # fmt: skip
        """The explanations of the jobs that joined the line since (``changed``: the jobs the
        line read again; None: it read every one), or None when the round must plan."""
        with self._lock:
            if self._other or self._waits is None or changed is None:
                return None
            waits, lined = self._waits, self._lined
        explained: dict[str, dict[str, Any]] = {}
        for job_id in changed:
            row = rows.get(job_id)
            if job_id in lined:
                return None  # a waiting job changed or left the line: another event
            if row is None:
                continue  # no job waiting to be placed: a name's claim, a pending job
            facts = static.get(job_id)
            if facts is None or facts[0] in quotas:
                return None
            decision = waits.get((facts[1], int(row["accels"]), int(row["nodes"])))
            if decision is None:
                return None
            explained[job_id] = scheduling_wait(row, decision)
        with self._lock:
            if self._other:
                return None
            self._lined.update(explained)
        return explained
