"""Who goes first, and who must make room: the scheduling policy of one round, as a pure function.

:func:`plan` takes what the scheduler read of the fleet (jobs waiting in ``scheduling``, jobs
lined up on nodes, jobs holding accelerators, each owner's decayed usage, quotas and holdings)
and says, for each waiting job, whether it is placed, waits or is rejected, in which order the
jobs were considered (their place in the queue), and which running jobs are asked to stop so
that a long-waiting job of higher priority gets its accelerators. Placement on nodes itself is
:func:`domain.scheduling.choose_node`'s.

Order: priority first; among jobs of one priority, the owner who holds the fewest decayed
accelerator-hours (:func:`decayed_usage`, 24 h half-life) goes first, and each job given its
place counts for its owner as ``accels * nodes`` accelerator-hours more for the rest of the round,
so owners of equal usage take turns; then oldest first. A heap holds each owner's oldest job,
one heap per priority: a round costs O(N log U) for N jobs of U owners, after each owner's jobs
are sorted by age once.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

from common.contract import PRIORITIES
from domain.scheduling import Assign, Decision, NodeCapacity, Reject, Wait, choose_node

HALF_LIFE_S = 86400.0
_HOUR_S = 3600.0
_AGE = attrgetter("submitted", "job_id")
_Head = tuple[float, float, str, str]
"""A heap entry: the owner's usage so far, its oldest job's submission time and id, the owner."""

__all__ = [
    "PRIORITIES", "Assign", "Decision", "Lined", "Plan", "Preempt", "Queued", "Reject",
    "Running", "Wait", "decayed_usage", "plan",
]  # fmt: skip


@dataclass(slots=True)  # not frozen: made for every waiting job every round, 4x faster so
class Queued:
    """A job waiting to be placed (status ``scheduling``). Not changed once made."""

    job_id: str
    owner: str
    accels: int
    nodes: int
    priority: int
    submitted: float
    """Epoch seconds."""
    waited_s: float = 0.0
    image: str | None = None
    """The image it runs in (its runtime's), if any: nodes that hold it are preferred."""


@dataclass(frozen=True)
class Lined:
    """A job placed on nodes, waiting in their lines (``enqueued``) for accelerators."""

    job_id: str
    owner: str
    accels: int
    node_ids: tuple[str, ...]
    priority: int
    waited_s: float


@dataclass(frozen=True)
class Running:
    """A job holding ``accels`` accelerators on each of its nodes."""

    job_id: str
    owner: str
    accels: int
    node_ids: tuple[str, ...]
    priority: int
    preemptible: bool
    started: float
    preempting: bool = False
    """A preemption was already asked for: its accelerators are as good as free."""


@dataclass(frozen=True)
class Preempt:
    """Ask ``victim`` to stop so that ``for_job`` gets accelerators on ``node_id``."""

    victim: str
    for_job: str
    node_id: str


@dataclass(frozen=True)
class Plan:
    """What one round decided."""

    decisions: dict[str, Decision]
    """Per queued job id: Assign, Reject or Wait."""
    order: tuple[str, ...]
    """The queued job ids in the order they were considered (a job's place: index + 1)."""
    preemptions: tuple[Preempt, ...]
    reasons: dict[str, str]
    """Per queued job id, one line of why it is at its place (``inspect`` shows it)."""


def decayed_usage(
    intervals: Iterable[tuple[str, int, float, float | None]],
    now: float,
    half_life_s: float = HALF_LIFE_S,
) -> dict[str, float]:
    """Accelerator-hours per owner, each instant ``t`` weighted ``2 ** (-(now - t) / half_life_s)``.

    ``intervals`` are ``(owner, accels, start, end)``, ``end`` None for a job still running;
    what lies after ``now`` is not counted. The integral is taken in closed form:
    ``accels * h / ln 2 * (w(end) - w(start))`` with ``w(t) = 2 ** (-(now - t) / h)``.
    """
    if half_life_s <= 0:
        raise ValueError(f"half_life_s must be positive, got {half_life_s}; use 86400 for a day")
    scale = half_life_s / math.log(2) / _HOUR_S
    usage: dict[str, float] = defaultdict(float)
    for owner, accels, start, end in intervals:
        stop = now if end is None else min(end, now)
        usage[owner] += 0.0
        if stop <= start or accels <= 0:
            continue
        weight_stop = 2.0 ** (-(now - stop) / half_life_s)
        weight_start = 2.0 ** (-(now - start) / half_life_s)
        usage[owner] += accels * scale * (weight_stop - weight_start)
    return dict(usage)


def plan(
    queue: Sequence[Queued],
    nodes: Sequence[NodeCapacity],
    lined: Sequence[Lined],
    running: Sequence[Running],
    usage: Mapping[str, float],
    quotas: Mapping[str, int],
    held: Mapping[str, int],
    patience_s: float,
    preempt_after_s: float | None,
) -> Plan:
    """Decide one round: each queued job's decision and place, and the preemptions.

    ``nodes``: the registered nodes (their ``busy_accels`` and ``held`` are recomputed here from
    ``lined`` and ``running``); ``usage``: decayed accelerator-hours per owner; ``quotas``: the
    most accelerators an owner's jobs may hold at once, running or placed; ``held``: what each
    owner's jobs hold or are placed for now; ``preempt_after_s``: None turns preemption off.
    """
    round_ = _Round(nodes, lined, running, usage, quotas, held, patience_s)
    by_level: dict[int, dict[str, list[Queued]]] = {}
    for job in queue:
        owners = by_level.get(job.priority)
        if owners is None:
            _check_priority(job.job_id, job.priority)
            owners = by_level[job.priority] = {}
        jobs = owners.get(job.owner)
        if jobs is None:
            owners[job.owner] = [job]
        else:
            jobs.append(job)
    for owners in by_level.values():
        for jobs in owners.values():
            jobs.sort(key=_AGE, reverse=True)  # newest first: pop() takes the oldest
    for level in sorted(by_level, reverse=True):
        round_.consider_level(level, by_level[level])
    preemptions: tuple[Preempt, ...] = ()
    if preempt_after_s is not None:
        preemptions = _preemptions(nodes, lined, running, preempt_after_s)
    return Plan(round_.decisions, tuple(round_.order), preemptions, round_.reasons)


def _check_priority(job_id: str, priority: int) -> None:
    if not 0 <= priority < len(PRIORITIES):
        raise ValueError(f"job {job_id} has priority {priority}; a priority is an index of "
                         f"{PRIORITIES} (0 to {len(PRIORITIES) - 1})")  # fmt: skip


class _Round:
    """One round's bookkeeping: what it placed on each node and for each owner."""

    def __init__(
        self, nodes: Sequence[NodeCapacity], lined: Sequence[Lined], running: Sequence[Running],
        usage: Mapping[str, float], quotas: Mapping[str, int], held: Mapping[str, int],
        patience_s: float,
    ) -> None:  # fmt: skip
        self.nodes, self.usage, self.quotas, self.held = nodes, usage, quotas, held
        self.patience_s = patience_s
        self.held_on: dict[str, int] = defaultdict(int)
        for job in running:
            if not job.preempting:
                for node_id in job.node_ids:
                    self.held_on[node_id] += job.accels
        self.lined_by_level: list[dict[str, int]] = [defaultdict(int) for _ in PRIORITIES]
        for line in lined:
            _check_priority(line.job_id, line.priority)
            for level in range(line.priority + 1):  # a job of priority p counts for levels <= p
                for node_id in line.node_ids:
                    self.lined_by_level[level][node_id] += line.accels
        self.placed_on: dict[str, int] = defaultdict(int)
        self.placed_for: dict[str, int] = defaultdict(int)
        self.charged: dict[str, int] = defaultdict(int)
        self.decisions: dict[str, Decision] = {}
        self.order: list[str] = []
        self.reasons: dict[str, str] = {}
        self.capacity: dict[str, NodeCapacity] = {}
        self.candidates: list[NodeCapacity] = []
        self.quota_waits: dict[str, tuple[int, Wait]] = {}
        self.known: dict[tuple[int, int, bool], Decision] = {}
        """Wait and Reject decisions for (accels, nodes, patience spent) while capacity is
        unchanged: after the fleet's lines fill up, thousands of jobs cost a look-up each."""

    def consider_level(self, level: int, owners: dict[str, list[Queued]]) -> None:
        """Decide the jobs of one priority, the owner of least usage first each time."""
        self._capacity_for(level)
        usage, charged = self.usage, self.charged
        heap: list[_Head] = [
            (usage.get(owner, 0.0) + charged[owner], jobs[-1].submitted, jobs[-1].job_id, owner)
            for owner, jobs in owners.items()
        ]
        heapq.heapify(heap)
        name = PRIORITIES[level]
        holds = {owner: f"priority {name}; fair share: {owner} holds "
                        f"{usage.get(owner, 0.0):.1f} accelerator-hours (24 h half-life)"
                 for owner in owners}  # fmt: skip
        reasons, order, decisions = self.reasons, self.order, self.decisions
        quotas, held, placed_for, known = self.quotas, self.held, self.placed_for, self.known
        late_after, replace, pop = self.patience_s, heapq.heapreplace, heapq.heappop
        only, tied = f", the only owner waiting at {name}", ", as little as another owner waiting"
        tied, least = tied + "; the older job goes first", ", the least of those waiting"
        while heap:
            spent, _, job_id, owner = heap[0]
            jobs = owners[owner]
            job = jobs.pop()
            ahead = charged[owner]
            size = len(heap)
            if size == 1:
                rank = only
            elif heap[1][0] == spent or (size > 2 and heap[2][0] == spent):
                rank = tied  # the heap's two children hold the next smallest usage
            else:
                rank = least
            reasons[job_id] = (f"{holds[owner]} and {ahead} more by its jobs ahead of this one"
                               f"{rank}" if ahead else holds[owner] + rank)  # fmt: skip
            order.append(job_id)
            cost = job.accels * job.nodes
            quota = quotas.get(owner)
            decision: Decision | None = None
            if quota is not None:
                holding = held.get(owner, 0) + placed_for[owner]
                if cost > quota:
                    decision = Wait(f"quota: {owner} runs {holding} of {quota} accelerators; "
                                    f"this job alone asks for {cost}: ask for fewer, or for a "
                                    "larger quota")  # fmt: skip
                elif holding + cost > quota:
                    decision = self._over_quota(owner, holding, quota)
            if decision is None:
                decision = known.get((job.accels, job.nodes, job.waited_s >= late_after))
                if decision is None:
                    decision = self._place(job)
            decisions[job_id] = decision
            charged[owner] = ahead + cost
            if jobs:
                following_job = jobs[-1]
                replace(heap, (spent + cost, following_job.submitted, following_job.job_id, owner))
            else:
                pop(heap)

    def _over_quota(self, owner: str, holding: int, quota: int) -> Wait:
        """The Wait of an owner at its quota, made once for each amount it holds."""
        made = self.quota_waits.get(owner)
        if made is None or made[0] != holding:
            made = (holding, Wait(f"quota: {owner} runs {holding} of {quota} accelerators"))
            self.quota_waits[owner] = made
        return made[1]

    def _place(self, job: Queued) -> Decision:
        """Ask :func:`choose_node` where ``job`` goes on the nodes as they are now; a Wait or
        Reject is kept for the jobs of the same shape until the nodes change."""
        decision = choose_node(job.accels, job.nodes, self.candidates, job.waited_s,
                               self.patience_s, job.image)  # fmt: skip
        if isinstance(decision, Assign):
            self._take(job, decision)
        else:
            self.known[(job.accels, job.nodes, job.waited_s >= self.patience_s)] = decision
        return decision

    def _take(self, job: Queued, decision: Assign) -> None:
        for node in decision.nodes:
            self.placed_on[node.node_id] += job.accels
            self.capacity[node.node_id] = self.capacity[node.node_id].taking(job.accels)
        self.placed_for[job.owner] += job.accels * job.nodes
        self.candidates = list(self.capacity.values())
        self.known.clear()

    def _capacity_for(self, level: int) -> None:
        """The nodes as a job of priority ``level`` sees them: their lines hold only what jobs
        of that priority or higher ask for (lined, or placed this round), so it goes ahead of
        the lower ones in the line."""
        lined = self.lined_by_level[level]
        self.capacity = {}
        for node in self.nodes:
            held = min(self.held_on.get(node.node_id, 0), node.accels)
            asked = lined.get(node.node_id, 0) + self.placed_on.get(node.node_id, 0)
            self.capacity[node.node_id] = NodeCapacity(
                node.node_id, node.name, node.accels, held + asked, node.alive, node.address, held,
                node.images,
            )
        self.candidates = list(self.capacity.values())
        self.known.clear()


def _preemptions(
    nodes: Sequence[NodeCapacity],
    lined: Sequence[Lined],
    running: Sequence[Running],
    preempt_after_s: float,
) -> tuple[Preempt, ...]:
    """Running jobs to stop so that lined jobs that waited ``preempt_after_s`` get their
    accelerators.

    Each live node's free accelerators (its own, less what non-preempting running jobs hold)
    go to its line in order (priority, then the longest waiting): a lined job first takes what
    is free there; when that is short and it has waited long enough, preemptible running jobs
    of lower priority of other owners are chosen, lowest priority then the most recently
    started first, as few as cover the shortfall (none if all of them would not). What a
    victim frees counts on each of its nodes, so jobs later in the lines ask for no more.
    """
    free: dict[str, int] = {node.node_id: node.accels for node in nodes if node.alive}
    on_node: dict[str, list[Running]] = defaultdict(list)
    for holder in running:
        for node_id in holder.node_ids:
            on_node[node_id].append(holder)
            if node_id in free and not holder.preempting:
                free[node_id] -= holder.accels
    chosen: set[str] = set()
    preemptions: list[Preempt] = []
    for job in sorted(lined, key=lambda job: (-job.priority, -job.waited_s, job.job_id)):
        for node_id in job.node_ids:
            if node_id not in free:
                continue
            if free[node_id] < job.accels and job.waited_s >= preempt_after_s:
                shortfall = job.accels - free[node_id]
                for victim in _victims(on_node[node_id], job, shortfall, chosen):
                    chosen.add(victim.job_id)
                    preemptions.append(Preempt(victim.job_id, job.job_id, node_id))
                    for freed_on in victim.node_ids:
                        if freed_on in free:
                            free[freed_on] += victim.accels
            free[node_id] -= job.accels  # below zero: what the line ahead still waits for
    return tuple(preemptions)


def _victims(holders: list[Running], job: Lined, shortfall: int, chosen: set[str]) -> list[Running]:
    """The fewest running jobs, in order of preference, that free ``shortfall`` accelerators
    for ``job``; none when all that may be taken would not."""
    pool = sorted(
        (holder for holder in holders
         if holder.preemptible and holder.priority < job.priority and holder.owner != job.owner
         and not holder.preempting and holder.job_id not in chosen),
        key=lambda holder: (holder.priority, -holder.started, holder.job_id),
    )  # fmt: skip
    taken, freed = [], 0
    for holder in pool:
        if freed >= shortfall:
            break
        taken.append(holder)
        freed += holder.accels
    return taken if freed >= shortfall else []
