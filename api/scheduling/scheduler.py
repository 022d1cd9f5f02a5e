"""The scheduler: places jobs on nodes, says why waiting jobs wait, and keeps the fleet honest.

Each round (woken by submissions, reports and registrations, else every
``scheduler_interval_s``):

1. nodes silent past their lease (``--node-timeout``, counted only while this server runs)
   are lost: their jobs fail ``node_lost``, or look for other nodes when they only waited;
2. pending jobs start scheduling, and scheduling jobs are placed, oldest first
   (:func:`domain.scheduling.choose_node`), or rejected with the reason;
3. every waiting job gets a one-line reason and the detail behind it (:mod:`api.scheduling.waits`);
   2 and 3 are skipped by a round that finds nothing they read changed since they last ran
   (at most ``REPLAN_EVERY_S`` before), and by one that finds only new jobs joining a long
   line (:mod:`api.scheduling.arrivals`: they are explained as their like were);
4. about once a second, stops no node confirmed in time fail, and jobs past their time limit
   whose node did not end them fail ``time_limit_exceeded``.

Only one server schedules at a time: the one holding the scheduler lock
(:mod:`api.scheduling.leadership`); replicas of it on the same PostgreSQL stand by and take
over within a few seconds of its death. All of the above is the leader's work.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from api.scheduling.arrivals import Arrivals
from api.scheduling.deadlines import attempt, end_overdue, lose_silent_nodes
from api.scheduling.fleet import Fleet
from api.scheduling.leadership import RETRY_S, LeaderLock
from api.scheduling.line import WaitingLine
from api.scheduling.parts import SchedulingParts
from api.scheduling.reasons import enqueued_wait, node_wait, scheduling_wait
from domain.policy import Preempt, plan
from domain.scheduling import Assign, NodeCapacity, Reject, choose_node
from domain.statuses import Status
from ledger.database import is_unavailable

log = logging.getLogger(__name__)
DEADLINES_EVERY_S = 1.0
ROUND_GAP_S = 0.005
"""The least time between two rounds; after a longer round, its length up to 1 s (so rounds take
at most half the server's time, however many jobs wait)."""
REPLAN_EVERY_S = 0.5
"""A round plans again at least this often, even when nothing it reads changed..."""
REPLAN_SHARE = 0.05
"""...unless that plan would take more than this share of the server's time: a plan of 30,000
waiting jobs (0.1 to 0.25 s here) is made again every 2 to 5 s while nothing changes..."""
REPLAN_AT_MOST_S = 10.0
"""...and at least this often whatever it takes: time's effects (patience, fair share's decay,
preemption's wait) are seen within it."""
LEADER_RETRY_S = RETRY_S
"""How often a server that does not schedule tries to take the scheduler lock."""
SAVES_AT_ONCE = 8
"""How many of a round's commands are saved side by side."""

Command = tuple[Callable[..., object], tuple[object, ...]]


class Scheduler:
    def __init__(self, parts: SchedulingParts, chores: Sequence[Callable[[], None]] = ()) -> None:
        self.parts = parts
        self.chores = tuple(chores)
        """Called every round on the leader (each keeps its own pace), such as the sweep that
        closes the debug sessions of servers that died (:mod:`api.debug.orphans`)."""
        self.started_at = datetime.now(UTC)
        self._deadlines_at = self._last_round_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._savers = ThreadPoolExecutor(SAVES_AT_ONCE, thread_name_prefix="scheduler-save")
        self.fleet = Fleet(parts.queries, parts.quotas, parts.settings.preempt_after_s)
        self.line = WaitingLine(parts.queries)
        self.arrivals = Arrivals()
        parts.projector.listeners += [self.arrivals.on_events, self.line.on_events]
        self._held: dict[str, int] = {}
        """What each owner's jobs held or were placed for at the last round's start."""
        self._planned: tuple[int, frozenset[str], dict[str, int]] | None = None
        """The inputs (:meth:`_inputs`) of the last plan."""
        self._replan_at = 0.0
        self._waits_made: dict[str, tuple[tuple[object, ...], dict[str, Any]]] = {}
        """Each waiting job's explanation, and what it was made of, as the last plan made it:
        one made of the same is that very object (written rows are compared by identity)."""
        self.line_length = 0
        """How many jobs wait to be placed, at the last plan."""

    def run_once(self) -> None:
        parts = self.parts
        if parts.projector.halted is not None:
            return  # its decisions could not be shown; health says why
        with parts.rounds():
            self._round()

    def _round(self) -> None:
        parts = self.parts
        lose_silent_nodes(parts, self.started_at)
        inputs = self._inputs()
        if (inputs != self._planned or self.line.moved or time.monotonic() >= self._replan_at
                ) and not self._joined(inputs):  # fmt: skip
            started, (_, live, quotas) = time.monotonic(), inputs
            self.arrivals.planning()
            capacity = self._capacity(live)
            waits = self._place(capacity, quotas)
            self._take_pending(capacity, quotas, fast=not waits)
            waits.update(self._explain_enqueued(capacity))
            parts.waits.replace(waits, self.line_length)
            took = time.monotonic() - started
            self._planned = inputs
            self._replan_at = time.monotonic() + min(max(REPLAN_EVERY_S, took / REPLAN_SHARE),
                                                      REPLAN_AT_MOST_S)
        if time.monotonic() >= self._deadlines_at:
            self._deadlines_at = time.monotonic() + DEADLINES_EVERY_S
            end_overdue(parts)
        for chore in self.chores:
            chore()
        parts.projector.catch_up()

    def _joined(self, inputs: tuple[int, frozenset[str], dict[str, int]]) -> bool:
        """A round in which jobs only joined a long line: they are explained as the last plan
        explained their like, and no plan is made (:mod:`api.scheduling.arrivals`)."""
        if self._planned is None or self._planned[1:] != inputs[1:] or \
                time.monotonic() >= self._replan_at:  # fmt: skip
            return False
        rows = self.line.rows()
        changed = self.line.read_again
        static = self.fleet.static([job_id for job_id in changed or () if job_id in rows])
        waits = self.arrivals.explain(changed, rows, static, inputs[2])
        if waits is None:
            return False
        self._take_pending({}, {}, fast=False)  # jobs submitted through another replica
        if waits:
            self.line_length += len(waits)
            self.parts.waits.add(waits, self.line_length)
        self._planned = inputs
        return True

    def _inputs(self) -> tuple[int, frozenset[str], dict[str, int]]:
        """What a round's plan is made of, but time: the views' position (every job and node),
        the nodes alive, and the quotas. A round that finds them as the last plan left them
        makes no new plan (a queue of thousands waiting costs no CPU while nothing happens),
        unless ``REPLAN_EVERY_S`` passed (longer for a long line: ``REPLAN_SHARE``): what time
        changes (patience, fair share's decay, preemption's wait) is then seen."""
        parts = self.parts
        live = parts.state.live_nodes(parts.settings.node_timeout_s)
        return parts.projector.position(), frozenset(live), self.fleet.quotas()

    # -- placing ----------------------------------------------------------------------------

    def _place(
        self, capacity: dict[str, NodeCapacity], quotas: dict[str, int]
    ) -> dict[str, dict[str, Any]]:
        """Place the jobs waiting in ``scheduling`` in the policy's order (priority, then fair
        share, then age: :func:`domain.policy.plan`), and ask for the preemptions it names."""
        parts, fleet, started = self.parts, self.fleet, time.monotonic()
        now, patience = time.time(), parts.settings.scheduling_patience_s
        rows = self.line.rows()
        lined, running, held = fleet.on_nodes(now)
        queue = fleet.queue(list(rows.values()), now)
        decided = plan(queue, list(capacity.values()), lined, running, fleet.usage(now), quotas,
                       held, patience, parts.settings.preempt_after_s)  # fmt: skip
        self.arrivals.planned(rows, queue, decided, quotas, patience, time.monotonic() - started)
        fleet.forget({*rows, *fleet.documents})
        self._held = held
        waits: dict[str, dict[str, Any]] = {}
        made_now: dict[str, tuple[tuple[object, ...], dict[str, Any]]] = {}
        saves: list[Command] = []
        for place, job_id in enumerate(decided.order, start=1):
            row, decision = rows[job_id], decided.decisions[job_id]
            if isinstance(decision, Assign):
                saves.append(self._assign(parts.jobs.assign, UUID(job_id), row, decision,
                                          capacity))  # fmt: skip
            elif isinstance(decision, Reject):
                saves.append((parts.jobs.reject, (UUID(job_id), decision.code,
                                                     decision.message)))  # fmt: skip
            else:
                key = (decision, place, decided.reasons[job_id], row["accels"], row["nodes"])
                made = self._waits_made.get(job_id)
                if made is None or made[0] != key:  # the same as last round: the same object
                    made = key, {**scheduling_wait(row, decision), "place": place,
                                 "order": decided.reasons[job_id]}  # fmt: skip
                waits[job_id] = made[1]
                made_now[job_id] = made
        self._waits_made, self.line_length = made_now, len(decided.order) if waits else 0
        self._save_side_by_side(saves)
        self._preempt(decided.preemptions)
        return waits

    def _preempt(self, preemptions: Sequence[Preempt]) -> None:
        """Ask each victim's nodes to stop it, naming the job that takes its place."""
        asked: set[str] = set()
        for preemption in preemptions:
            victim, document = preemption.victim, self.fleet.documents.get(preemption.for_job)
            if victim in asked or document is None:
                continue
            asked.add(victim)
            log.info("job %s is preempted for %s's job %s", victim, document["owner"],
                     document["name"])  # fmt: skip
            attempt(self.parts.jobs.request_preemption, UUID(victim), document["name"],
                    document["owner"])  # fmt: skip

    def _take_pending(
        self, capacity: dict[str, NodeCapacity], quotas: dict[str, int], fast: bool
    ) -> None:
        """New jobs start scheduling; while no older job waits, one with room on nodes now and
        within its owner's quota is placed in the same save (a burst of submissions is not
        two rounds each), higher priorities first."""
        parts = self.parts
        pending = parts.queries.jobs_in([Status.PENDING])
        static = self.fleet.static([row["id"] for row in pending]) if fast else {}
        quotas = quotas if fast else {}
        held = dict(self._held)
        pending.sort(key=lambda row: -static.get(row["id"], ("", 1, False, None))[1])
        saves: list[Command] = []
        for row in pending:
            job_id = UUID(row["id"])
            decision = None
            owner, _, _, image = static.get(row["id"], (row["owner"], 1, False, None))
            cost = int(row["accels"]) * int(row["nodes"])
            within = owner not in quotas or held.get(owner, 0) + cost <= quotas[owner]
            if fast and within:
                decision = choose_node(row["accels"], row["nodes"], list(capacity.values()),
                                       0.0, parts.settings.scheduling_patience_s,
                                       image)  # fmt: skip
            if isinstance(decision, Assign):
                held[owner] = held.get(owner, 0) + cost
                saves.append(self._assign(parts.jobs.schedule_onto, job_id, row, decision,
                                          capacity))  # fmt: skip
                continue
            fast = fast and not within  # it waits: those after it wait behind it
            saves.append((parts.jobs.begin_scheduling, (job_id,)))
        self._save_side_by_side(saves)

    def _assign(
        self, command: Callable[..., object], job_id: UUID, row: dict[str, Any],
        decision: Assign, capacity: dict[str, NodeCapacity],
    ) -> Command:  # fmt: skip
        """The command that places the job on the decision's nodes, whose room it takes at
        once (should the command fail, the job having moved on meanwhile, that room is
        counted again in the next round)."""
        nodes = [{"node_id": node.node_id, "node_name": node.name, "address": node.address}
                 for node in decision.nodes]  # fmt: skip
        for node in decision.nodes:
            capacity[node.node_id] = capacity[node.node_id].taking(row["accels"])
        self._held[row["owner"]] = self._held.get(row["owner"], 0) + row["accels"] * row["nodes"]
        return command, (job_id, decision.node_id, decision.node_name, nodes)

    def _save_side_by_side(self, saves: Sequence[Command]) -> None:
        """Run these commands, each on a job of its own, side by side: saves that come
        together commit together (the ledger's group commit), so a round that places many
        jobs waits for a few commits, not one per job. A command that meets another's change
        of the same aggregate is retried by the application, as any command is."""
        if len(saves) <= 1:
            for command, args in saves:
                attempt(command, *args)
            return
        for _ in self._savers.map(lambda save: attempt(save[0], *save[1]), saves):
            pass  # each done (an error other than a refusal fails the round, as it did)

    def _capacity(self, live: frozenset[str]) -> dict[str, NodeCapacity]:
        parts = self.parts
        load, images = parts.queries.node_load(), parts.state.images()
        capacity = {}
        for row in parts.queries.nodes():
            if parts.settings.require_isolation and not sandboxes(row):
                continue  # --require-isolation: it gets no job
            held, queued = load.get(row["id"], (0, 0))
            capacity[row["id"]] = NodeCapacity(
                node_id=row["id"], name=row["name"], accels=int(row["accels"]),
                busy_accels=held + queued, alive=row["id"] in live, address=row["address"],
                held=held, images=frozenset(images.get(row["id"], ())),
            )  # fmt: skip
        return capacity

    # -- why jobs wait ----------------------------------------------------------------------

    def _line_rank(self, job_id: str) -> int:
        """A job's priority rank, as its place in every node's line begins with it."""
        return self.fleet.static([job_id]).get(job_id, ("", 1, False, None))[1]

    def _explain_enqueued(self, capacity: dict[str, NodeCapacity]) -> dict[str, dict[str, Any]]:
        parts = self.parts
        holders: dict[str, list[dict[str, Any]]] = {}
        waits: dict[str, dict[str, Any]] = {}
        for row in parts.queries.jobs_in([Status.ENQUEUED]):
            document = self.fleet.documents.get(row["id"]) or parts.queries.job(row["id"])
            if document is None:
                continue
            row = {**row, "created_at": document["created_at"]}  # its place in the lines
            nodes = []
            for placement in document.get("placements", []):
                node_id = placement["node_id"]
                if node_id not in holders:
                    holders[node_id] = parts.queries.holders(node_id)
                nodes.append(node_wait(row, placement, capacity.get(node_id), holders[node_id],
                                       self._line_rank))  # fmt: skip
            waits[row["id"]] = enqueued_wait(row, nodes)
        return waits

    # -- the loop ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._follow_lock, name="scheduler", daemon=True)
        self._thread.start()

    def _follow_lock(self) -> None:
        """Schedule while this server holds the scheduler lock; stand by and try to take it
        about once a second otherwise (see :mod:`api.scheduling.leadership`)."""
        lock = self.parts.leader_lock
        standing_by = False
        try:
            while not self._stop.is_set():
                try:
                    leads = lock.acquire()
                except Exception:
                    log.exception("taking the scheduler lock failed")
                    leads = False
                if leads:
                    standing_by = False
                    self._lead(lock)
                    continue
                if not standing_by:
                    log.info("another server schedules; this one stands by to take over")
                    standing_by = True
                self._stop.wait(LEADER_RETRY_S)
        finally:
            self.parts.leading.clear()
            lock.release()

    def _lead(self, lock: LeaderLock) -> None:
        log.info("this server schedules now (it holds the scheduler lock)")
        # Node leases count from now: agents that talked to a replica that just died need
        # their --node-timeout to find this one.
        self.started_at = datetime.now(UTC)
        self._deadlines_at = self._last_round_s = 0.0
        self._planned = None
        self.line.forget()  # what changed while another server scheduled was not kept
        self.parts.leading.set()
        try:
            self._loop(lock)
        finally:
            self.parts.leading.clear()
            lock.release()

    def _loop(self, lock: LeaderLock) -> None:
        wakeup = self.parts.settings.scheduler_interval_s
        while not self._stop.is_set():
            self.parts.wakeup.wait(wakeup)
            # Wake-ups during a round or right after it make one more round, not one each.
            self._stop.wait(min(max(ROUND_GAP_S, self._last_round_s), 1.0))
            self.parts.wakeup.clear()
            if self._stop.is_set():
                return
            if not lock.held():
                log.warning("the scheduler lock is lost (its database connection broke): this "
                            "server stops scheduling and tries to take the lock again")  # fmt: skip
                return
            started = time.monotonic()
            try:
                self.run_once()
            except Exception as error:  # each round survives its own errors
                if is_unavailable(error):
                    log.warning("scheduling waits for the database: %s", error)
                else:
                    log.exception("scheduling round failed")
            self._last_round_s = time.monotonic() - started

    def stop(self) -> None:
        self._stop.set()
        self.parts.wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._savers.shutdown(wait=False, cancel_futures=True)


def sandboxes(node: dict[str, Any]) -> bool:
    """Whether the node's agent said it runs each job in a sandbox of its own."""
    said = json.loads(node.get("isolation") or "null") or {}
    return isinstance(said, dict) and said.get("level") == "sandbox"
