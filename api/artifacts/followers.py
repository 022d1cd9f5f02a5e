"""``logs --follow`` without a thread per follower.

A follower is a coroutine that streams a job's log file from its offset, then sleeps on an
:class:`asyncio.Event` until something happens to that job: new log bytes arrive (the log route
wakes it), or the job reaches a terminal status or ends an attempt (the projector's listener
wakes it, for events written by any replica). A timer wakes it too, now and then, in case
bytes arrived through another replica's store. A thousand quiet followers cost a thousand
small objects, no thread and no database query.

:func:`follow_log` is that coroutine's loop, the one both ``logs --follow`` and a console
page's live log run: it follows one node's log of one attempt (:class:`AttemptLog`) until
that attempt is over (:func:`attempt_over`) and its every byte is sent.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

from api.artifacts.store import ArtifactStore
from common.attempts import attempt_key, current_attempt
from domain.events import event_name
from domain.lifecycle import EVENT_STATUS
from domain.statuses import TERMINAL, Status


class TooManyFollowers(Exception):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(
            f"{limit} log streams are open on this server, its limit; retry in a moment, or "
            "read the logs without --follow"
        )


BATCH_S = 0.25
"""A woken follower reads at most this often (a thousand followers of a chatty job each read
and send a few bigger chunks a second, not one per batch the agent ships)."""
ATTEMPT_ENDS = frozenset({"Retried", "Preempted"})
"""Events that end an attempt of a job that goes on."""
LOG_READ_BYTES = 256 * 1024
RECHECK_S = 1.0
"""A quiet follower looks at the log this often anyway (bytes stored by another replica)."""
FOLLOWERS_PER_S = 2000
"""Follower reads a second one server spends on one job at most: the more followers a job
has, the longer each one's batch (1,000 followers: one read each half second)."""


class Follower:
    """One stream's wake-up call."""

    def __init__(self, peers: set[Follower]) -> None:
        self.woken = asyncio.Event()
        self.job_ended = False
        self.attempt_ended = False
        """The job ended an attempt (``Retried``, ``Preempted``) since this was last cleared:
        a follower of that attempt's log ends once it sent it all."""
        self._peers = peers
        self._last_read = 0.0

    async def sleep(self, timeout: float) -> None:
        """Until woken (or ``timeout``), then until this follower's batch is due.

        The pause is spread at random over the batch, so that a thousand followers woken by
        one log chunk do not all read and send at once, which would hold up every other
        request on the event loop.
        """
        with suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.woken.wait()
        loop = asyncio.get_running_loop()
        batch = max(BATCH_S, len(self._peers) / FOLLOWERS_PER_S)
        due = self._last_read + batch * (0.5 + random.random() / 2)
        if due > loop.time() and not self.job_ended:
            await asyncio.sleep(due - loop.time())
        self.woken.clear()
        self._last_read = loop.time()


class LogFollowers:
    """The open follow streams of this server, by job."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.closing = False
        self._by_job: defaultdict[str, set[Follower]] = defaultdict(set)
        self._count = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def count(self) -> int:
        return self._count

    @asynccontextmanager
    async def follow(self, job_id: str) -> AsyncIterator[Follower]:
        with self._lock:  # while the server stops too: the stream sends what there is, then ends
            if self._count >= self.limit:
                raise TooManyFollowers(self.limit)
            self._loop = asyncio.get_running_loop()
            peers = self._by_job[job_id]
            follower = Follower(peers)
            peers.add(follower)
            self._count += 1
        try:
            yield follower
        finally:
            with self._lock:
                self._count -= 1
                followers = self._by_job[job_id]
                followers.discard(follower)
                if not followers:
                    del self._by_job[job_id]

    def wake(self, job_id: str, *, ended: bool = False, attempt_ended: bool = False) -> None:
        """Something happened to ``job_id``; safe to call from any thread."""
        with self._lock:
            followers = list(self._by_job.get(job_id, ()))
            loop = self._loop
        if followers and loop is not None and not loop.is_closed():
            # Safe from the loop itself, other threads and signal handlers alike.
            loop.call_soon_threadsafe(_wake_all, followers, ended, attempt_ended)

    def on_events(self, domain_events: Sequence[Any]) -> None:
        """A projector listener: a job that ended (or was deleted) ends its follow streams."""
        for domain_event in domain_events:
            status = EVENT_STATUS.get(event_name(domain_event))
            if (status is not None and status in TERMINAL) or event_name(
                domain_event
            ) == "Deleted":
                self.wake(str(domain_event.originator_id), ended=True)
            elif event_name(domain_event) in ATTEMPT_ENDS:
                self.wake(str(domain_event.originator_id), attempt_ended=True)

    def close_all(self) -> None:
        """The server is stopping: every stream ends now (a client resumes at its offset)."""
        self.closing = True
        with self._lock:
            jobs = list(self._by_job)
        for job_id in jobs:
            self.wake(job_id)


def _wake_all(followers: list[Follower], ended: bool, attempt_ended: bool = False) -> None:
    for follower in followers:
        follower.job_ended = follower.job_ended or ended
        follower.attempt_ended = follower.attempt_ended or attempt_ended
        follower.woken.set()


@dataclass(frozen=True)
class AttemptLog:
    """One node's log of one attempt of a job."""

    store: ArtifactStore
    job_id: str
    node_index: int = 0
    attempt: int = 1

    def read(self, offset: int) -> bytes:
        """The bytes from ``offset`` on (at most :data:`LOG_READ_BYTES`; none: not yet)."""
        return self.store.read_log(attempt_key(self.job_id, self.attempt), offset,
                                   LOG_READ_BYTES, node_index=self.node_index)  # fmt: skip

    def size(self) -> int:
        return self.store.log_size(attempt_key(self.job_id, self.attempt), self.node_index)


def attempt_over(document: Mapping[str, Any] | None, attempt: int) -> bool:
    """Whether ``attempt``'s log is whole: the job is gone or terminal, or in a later attempt."""
    return (document is None or bool(document.get("deleted_at"))
            or Status(document["status"]) in TERMINAL
            or current_attempt(document) > attempt)  # fmt: skip


async def follow_log(
    followers: LogFollowers, follower: Follower, log: AttemptLog, offset: int,
    over: Callable[[], Awaitable[bool]], again: Callable[[], bool] = lambda: False,
) -> AsyncIterator[bytes | None]:  # fmt: skip
    """``log`` from ``offset`` as it grows, until ``over()`` (asked at once, then whenever the
    job ends an attempt or ``again()``) and every byte is sent; ends early, before the log is
    whole, when the server stops (the client resumes at its offset). None once a round, after
    ``over()`` was asked and before the new bytes: the caller may send what else it has.

    Agents ship every line before the terminal report, so one more read after the log's
    attempt ended drains it all. Reads are small and local, so they run on the event loop: no
    thread waits. ``follower`` is registered before ``over()`` is first asked: an end that
    comes in between still wakes it.
    """
    ask = True
    while True:
        if ask:
            follower.job_ended = await over() or follower.job_ended
        ended = follower.job_ended
        yield None
        while chunk := log.read(offset):
            offset += len(chunk)
            yield chunk
        if ended or followers.closing:
            return
        await follower.sleep(RECHECK_S)
        ask = (follower.attempt_ended and not follower.job_ended) or again()
        follower.attempt_ended = False
