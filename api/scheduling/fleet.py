"""What a scheduling round reads of the fleet for the policy (:func:`domain.policy.plan`): the
jobs waiting to be placed, the jobs lined up on or holding each node, each owner's decayed
accelerator-hours, holdings and quota.

A job's priority and owner never change: they are read from its document once and kept (a
round with ten thousand waiting jobs reads only the new ones). The jobs on nodes are few (at
most a node's worth in line per priority, and what runs), and are read each round; usage is
summed again every ``USAGE_EVERY_S``; quotas are read every round.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from common.contract import image_key
from common.job_spec import JobSpec
from domain.policy import HALF_LIFE_S, Lined, Queued, Running, decayed_usage
from domain.statuses import Status
from projections.queries import Queries

USAGE_EVERY_S = 10.0
USAGE_WINDOW_HALF_LIVES = 10
"""Runs that ended longer ago than this many half-lives weigh under a thousandth: not read."""
HOLDS = frozenset({Status.IN_PROGRESS.value, Status.STOP_IN_PROGRESS.value})
LINED_SINCE = ("Enqueued", "Preempted", "NodeAssigned")
Static = tuple[str, int, bool, str | None]
"""What never changes of a job: owner, priority rank, preemptible, image (``image_key``)."""
"""The events after which a job on a node waits for its accelerators."""


@lru_cache(maxsize=1 << 16)  # a waiting job's moments are the same round after round
def _epoch(moment: str) -> float:
    return datetime.fromisoformat(moment).timestamp()


class Fleet:
    """One round's view of the fleet, and what stays true from round to round."""

    def __init__(self, queries: Queries, quotas: Callable[[], dict[str, int]],
                 preempt_after_s: float | None) -> None:  # fmt: skip
        self.queries, self.preempt_after_s, self._quotas = queries, preempt_after_s, quotas
        self._static: dict[str, Static] = {}
        """job id -> (owner, priority rank, preemptible, image): they never change."""
        self._usage: tuple[float, dict[str, float]] = (0.0, {})
        self._queued: dict[str, tuple[Any, ...]] = {}
        """job id -> (its row, owner, accels, nodes, rank, submitted, waiting since, image): what
        :meth:`queue` read from the row, by the row object it read it from."""
        self.documents: dict[str, dict[str, Any]] = {}
        """This round's documents of the jobs on nodes, by id."""

    def static(self, job_ids: list[str]) -> dict[str, Static]:
        unknown = [job_id for job_id in job_ids if job_id not in self._static]
        for start in range(0, len(unknown), 500):
            for job_id, document in self.queries.jobs(unknown[start:start + 500]).items():
                spec = JobSpec.from_dict(document["spec"])
                image = image_key(spec.runtime_image) if spec.runtime_image else None
                self._static[job_id] = (document["owner"], spec.rank, spec.may_be_preempted,
                                        image)  # fmt: skip
        return self._static

    def forget(self, keep: set[str]) -> None:
        """Drop what is kept of jobs no longer waiting nor on a node."""
        if len(self._static) > 2 * max(len(keep), 1000):
            self._static = {k: v for k, v in self._static.items() if k in keep}

    def queue(self, rows: list[dict[str, Any]], now: float) -> list[Queued]:
        """The waiting jobs as the policy takes them. What is read from each row is kept while
        the waiting line hands the same row object (:mod:`api.scheduling.line` reads again only
        the jobs that changed): a round over a long queue only works out how long each waited."""
        kept, self._queued = self._queued, {}
        new = [row for row in rows if (kept.get(row["id"]) or (None,))[0] is not row]
        static = self.static([row["id"] for row in new])
        for row in new:
            facts = static.get(row["id"])
            if facts is not None:  # else its document is not in the views yet: the next round
                kept[row["id"]] = (row, facts[0], int(row["accels"]), int(row["nodes"]),
                                   facts[1], _epoch(row["created_at"]),
                                   _epoch(row["updated_at"]), facts[3])  # fmt: skip
        queued = []
        for row in rows:
            entry = kept.get(row["id"])
            if entry is not None and entry[0] is row:
                _, owner, accels, nodes, rank, submitted, since, image = entry
                self._queued[row["id"]] = entry
                queued.append(Queued(row["id"], owner, accels, nodes, rank, submitted,
                                     max(now - since, 0.0), image))  # fmt: skip
        return queued

    def on_nodes(self, now: float) -> tuple[list[Lined], list[Running], dict[str, int]]:
        """The jobs lined up on nodes (building ones too: they take room in the line), those
        holding accelerators, and what each owner's jobs hold or are placed for.

        The documents of the jobs in line are read (when each began to wait); those of the
        running jobs only when one of them may be preempted (a job of higher priority is in
        line): when each started, and whether a preemption is under way."""
        by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in self.queries.on_nodes():
            by_job[str(row["job_id"])].append(row)
        static = self.static(list(by_job))
        known = {job_id: rows for job_id, rows in by_job.items() if job_id in static}
        holding = {job_id for job_id, rows in known.items() if rows[0]["status"] in HOLDS}
        waiting = [job_id for job_id in known if job_id not in holding]
        top = max((static[job_id][1] for job_id in waiting), default=-1)
        exposed = self.preempt_after_s is not None and any(
            static[job_id][2] and static[job_id][1] < top for job_id in holding)
        self.documents = self.queries.jobs(
            waiting + (sorted(holding) if exposed else []))
        lined: list[Lined] = []
        running: list[Running] = []
        held: dict[str, int] = defaultdict(int)
        for job_id, placements in known.items():
            owner, rank, may_preempt, _ = static[job_id]
            accels, status = int(placements[0]["accels"]), placements[0]["status"]
            node_ids = tuple(str(row["node_id"]) for row in placements)
            held[owner] += accels * len(node_ids)
            document = self.documents.get(job_id) or {}
            if job_id in holding:
                attempts = document.get("attempts") or [{}]
                started = attempts[-1].get("started_at") or document.get("updated_at")
                running.append(Running(
                    job_id, owner, accels, node_ids, rank, may_preempt,
                    _epoch(started) if started else 0.0,
                    preempting=document.get("preemption") is not None
                    or status != Status.IN_PROGRESS.value,
                ))  # fmt: skip
            elif document:
                waited = now - _epoch(_lined_since(document))
                lined.append(Lined(job_id, owner, accels, node_ids, rank,
                                   waited if status == Status.ENQUEUED.value else 0.0))
        return lined, running, dict(held)

    def usage(self, now: float) -> dict[str, float]:
        at, usage = self._usage
        if now - at >= USAGE_EVERY_S:
            since = datetime.fromtimestamp(now, UTC) - timedelta(
                seconds=HALF_LIFE_S * USAGE_WINDOW_HALF_LIVES)
            rows = self.queries.usage_intervals(since.isoformat())
            usage = decayed_usage(
                ((row["owner"], int(row["accels"]), _epoch(row["started_at"]),
                  _epoch(row["ended_at"]) if row["ended_at"] else None) for row in rows),
                now,
            )  # fmt: skip
            self._usage = (now, usage)
        return usage

    def quotas(self) -> dict[str, int]:
        """Read every round (one small query): a quota set holds from the next round on."""
        return self._quotas()


def _lined_since(document: dict[str, Any]) -> str:
    """When the job began to wait in its nodes' lines (built, or preempted)."""
    for entry in reversed(document.get("history") or []):
        if entry["event"] in LINED_SINCE:
            return str(entry["at"])
    return str(document["updated_at"])
