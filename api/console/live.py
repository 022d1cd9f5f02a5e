"""What keeps open console pages current without a thread each.

A page's stream (server-sent events) is a coroutine that sleeps on an :class:`asyncio.Event`.
:class:`JobWatch`, a listener of the projector, sets the events of the streams that watch a
job whenever the views applied one of its events (written by any replica: the projector tells
its listeners of every event it or another replica applied). A job page's stream also follows
the job's log as ``logs --follow`` does (:mod:`api.artifacts.followers`): shipped bytes wake it.
A woken stream reads the views once and sends what changed; a quiet one costs a small object.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from api.http.streaming import FollowingResponse
from domain.job_attempts import is_job_event


class Watch:
    """One stream's interest: the jobs it shows, and the event that wakes it."""

    def __init__(self, wake: asyncio.Event) -> None:
        self.wake = wake
        self.changed = False
        """Set when an event of a watched job was applied; the stream clears it."""
        self.loop = asyncio.get_running_loop()

    def _touch(self) -> None:
        self.changed = True
        self.wake.set()


class JobWatch:
    """The jobs open console streams watch, by job id."""

    def __init__(self) -> None:
        self._by_job: defaultdict[str, set[Watch]] = defaultdict(set)
        self._lock = threading.Lock()

    @contextmanager
    def watching(self, job_ids: Iterable[str], wake: asyncio.Event) -> Iterator[Watch]:
        watch = Watch(wake)
        ids = set(job_ids)
        with self._lock:
            for job_id in ids:
                self._by_job[job_id].add(watch)
        try:
            yield watch
        finally:
            with self._lock:
                for job_id in ids:
                    watches = self._by_job.get(job_id)
                    if watches is not None:
                        watches.discard(watch)
                        if not watches:
                            del self._by_job[job_id]

    def on_events(self, domain_events: Sequence[Any]) -> None:
        """A projector listener (its thread): wake the streams of each job that changed."""
        touched: set[Watch] = set()
        with self._lock:
            for domain_event in domain_events:
                if is_job_event(domain_event):
                    touched.update(self._by_job.get(str(domain_event.originator_id), ()))
        for watch in touched:
            if not watch.loop.is_closed():
                watch.loop.call_soon_threadsafe(watch._touch)


def server_event(kind: str, data: Any, event_id: str | None = None) -> bytes:
    """One server-sent event; ``data`` as JSON on one line (a log's newlines included)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


KEEPALIVE = b": still here\n\n"
"""A comment line: proxies keep a quiet stream open, and a gone client is noticed."""


class EventStream(FollowingResponse):
    """``text/event-stream`` that ends as soon as its client goes away, even while it has
    nothing to send."""

    def __init__(self, content: Any) -> None:
        super().__init__(content, media_type="text/event-stream", headers={
            "Cache-Control": "no-store", "X-Accel-Buffering": "no"})  # fmt: skip
