"""Ended jobs' logs written to the store for good, as soon as each job ends.

The S3 store keeps each log's newest bytes in the operational database until a part's worth
gathered (:mod:`api.artifacts.s3_logs`), so a job's last lines would wait there for the store's
periodic sweep. Once a job reaches a terminal status its log is whole (agents ship every line
before they report the end): the projector tells :meth:`LogSettler.on_events`, which notes the
job and wakes a thread of its own. That thread writes what the database still holds of the
job's log into the bucket (``settle_logs``). The listener only notes the job, so no request
waits on the bucket.

A job keeps a log stream per attempt (:func:`~common.attempts.attempt_key`); settling a
job settles them all. An attempt that ends while the job goes on (``Retried``, ``Preempted``)
has its log whole too, so the job is noted then as well: its last lines need not wait.

A settle that fails (the bucket away, the database for a moment) keeps its jobs noted and is
tried again after 1 s, then twice as long each time, up to 30 s, until it succeeds or the
server stops; meanwhile the log reads as well from the database. Every replica hears of every
event, so each one settles the jobs that end: the first to come writes the parts, and the
others find nothing left, or write the same part again (two flushes of one stream are safe
across replicas, see :mod:`api.artifacts.s3_logs`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from api.artifacts.followers import ATTEMPT_ENDS
from api.artifacts.store import ArtifactStore, StorageUnavailable
from domain.events import event_name
from domain.lifecycle import EVENT_STATUS
from domain.statuses import TERMINAL

log = logging.getLogger(__name__)

RETRY_FIRST_S = 1.0
RETRY_MOST_S = 30.0
"""A failed settle is tried again after RETRY_FIRST_S, twice as long each time up to this."""


class LogSettler:
    def __init__(self, store: ArtifactStore) -> None:
        self.store = store
        self._due: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._failing = False
        self._thread: threading.Thread | None = None

    @property
    def due(self) -> set[str]:
        """The jobs whose logs wait to be settled."""
        with self._lock:
            return set(self._due)

    def on_events(self, domain_events: Sequence[Any]) -> None:
        """A projector listener: each job that ended (or whose attempt did) is noted, and the
        thread woken."""
        ended = {str(event.originator_id) for event in domain_events
                 if EVENT_STATUS.get(event_name(event)) in TERMINAL
                 or event_name(event) in ATTEMPT_ENDS}  # fmt: skip
        if ended:
            with self._lock:
                self._due |= ended
            self._wake.set()

    def settle_due(self) -> bool:
        """Settle the logs of every job noted; whether they all went (those that did not stay
        noted). The bucket away stops the pass: the jobs after it would wait on it too."""
        with self._lock:
            due, self._due = sorted(self._due), set()
        failed: list[str] = []
        error: Exception | None = None
        for index, job_id in enumerate(due):
            try:
                self.store.settle_logs([job_id])
            except StorageUnavailable as unavailable:
                failed, error = due[index:], unavailable
                break
            except Exception as unexpected:  # noqa: BLE001 - tried again, like the rest
                failed.append(job_id)
                error = unexpected
        if failed:
            with self._lock:
                self._due.update(failed)
            if not self._failing:
                log.warning("the logs of %d ended job(s) stay in the database for now (tried "
                            "again shortly): %s", len(failed), error)  # fmt: skip
            self._failing = True
            return False
        if self._failing and due:
            log.info("ended jobs' logs are written to the store again")
        self._failing = False
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="log-settler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        wait: float | None = None
        delay = RETRY_FIRST_S
        while True:
            self._wake.wait(wait)
            self._wake.clear()
            if self._stopping.is_set():
                return
            if self.settle_due():
                wait, delay = None, RETRY_FIRST_S
            else:
                wait, delay = delay, min(delay * 2, RETRY_MOST_S)

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
