"""Agents' long polls on their assignments, without a thread per waiting agent.

An agent asks ``GET .../assignments?wait=S&since=ETAG``; when the node's answer still has that
etag, the request sleeps on an :class:`asyncio.Event` until something happens to one of the
node's jobs, or ``S`` seconds pass. The projector's listener wakes it, for events written by
any replica: an event that names a node (a job assigned to it) wakes that node, and an event of
a job that a node was last seen holding wakes that node (a stop, a job moved away), unless
that node's own agent reported it (it knows already; under load, its jobs' reports would keep
it busy).
A thousand waiting agents cost a thousand small objects; an event wakes only its nodes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from domain.events import event_name
from domain.lifecycle import EVENT_STATUS
from domain.statuses import TERMINAL

MAX_WAIT_S = 30.0
"""The longest a request waits for a change (agents' HTTP timeouts are longer)."""


def etag_of(body: Any) -> str:
    """A short, stable digest of an answer body (JSON with sorted keys)."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Waiter:
    """One waiting request's wake-up call."""

    def __init__(self) -> None:
        self.woken = asyncio.Event()

    async def sleep(self, timeout: float) -> bool:
        """Until woken or ``timeout``; True when woken. Clears the call for the next round."""
        try:
            async with asyncio.timeout(timeout):
                await self.woken.wait()
        except TimeoutError:
            return False
        finally:
            self.woken.clear()
        return True


class AssignmentWaiters:
    """The waiting assignment requests of this server, by node."""

    def __init__(self) -> None:
        self.closing = False
        self._by_node: defaultdict[str, set[Waiter]] = defaultdict(set)
        self._nodes_of_job: defaultdict[str, set[str]] = defaultdict(set)
        self._node_names: dict[str, str] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def count(self) -> int:
        with self._lock:
            return sum(len(waiters) for waiters in self._by_node.values())

    @asynccontextmanager
    async def waiting(self, node_id: str) -> AsyncIterator[Waiter]:
        """A waiter for ``node_id``, registered before the caller reads the assignments (so
        that no event between the read and the sleep is missed)."""
        waiter = Waiter()
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._by_node[node_id].add(waiter)
        try:
            yield waiter
        finally:
            with self._lock:
                waiters = self._by_node[node_id]
                waiters.discard(waiter)
                if not waiters:
                    del self._by_node[node_id]

    def seen(self, node_id: str, job_ids: Iterable[str]) -> None:
        """The node was answered these jobs: their events wake it from now on."""
        with self._lock:
            for job_id in job_ids:
                self._nodes_of_job[job_id].add(node_id)

    def on_events(self, domain_events: Sequence[Any]) -> None:
        """A projector listener: wake the nodes these events concern."""
        nodes: set[str] = set()
        with self._lock:
            for domain_event in domain_events:
                job_id = str(domain_event.originator_id)
                named = _nodes_named(domain_event)
                if named:
                    self._nodes_of_job[job_id].update(named)
                    self._node_names.update((node, name) for node, name in named.items() if name)
                reporter = _reporting_agent(domain_event)
                nodes.update(
                    node for node in self._nodes_of_job.get(job_id, ())
                    if reporter is None or self._node_names.get(node) != reporter
                )  # fmt: skip
                if _ends_the_job(domain_event):
                    self._nodes_of_job.pop(job_id, None)
        for node_id in nodes:
            self.wake(node_id)

    def wake(self, node_id: str) -> None:
        """Something happened to one of ``node_id``'s jobs; safe to call from any thread."""
        with self._lock:
            waiters = list(self._by_node.get(node_id, ()))
            loop = self._loop
        if waiters and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(_wake_all, waiters)

    def close_all(self) -> None:
        """The server is stopping: every waiting request answers now."""
        self.closing = True
        with self._lock:
            nodes = list(self._by_node)
        for node_id in nodes:
            self.wake(node_id)


def _nodes_named(domain_event: Any) -> dict[str, str]:
    """The nodes an event places the job on (``node_id``, and each of ``nodes`` for a job of
    several nodes), with their names when it says them."""
    named = [(getattr(domain_event, "node_id", None), getattr(domain_event, "node_name", None))]
    for placed in getattr(domain_event, "nodes", None) or ():
        if isinstance(placed, dict):
            named.append((placed.get("node_id"), placed.get("node_name")))
    return {
        node: name if isinstance(name, str) else ""
        for node, name in named
        if isinstance(node, str) and node
    }


def _reporting_agent(domain_event: Any) -> str | None:
    """The name of the node whose agent caused the event, if an agent did."""
    by = getattr(domain_event, "by", None)
    if isinstance(by, dict) and by.get("kind") == "agent":
        return str(by.get("id"))
    return None


def _ends_the_job(domain_event: Any) -> bool:
    name = event_name(domain_event)
    status = EVENT_STATUS.get(name)
    return name == "Deleted" or (status is not None and status in TERMINAL)


def _wake_all(waiters: list[Waiter]) -> None:
    for waiter in waiters:
        waiter.woken.set()
