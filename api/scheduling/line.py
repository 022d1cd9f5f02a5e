"""The jobs waiting to be placed (``scheduling``), kept between the scheduler's rounds.

A round read every waiting job's row, thousands of them, though between two rounds only a few
change. Now a round reads again only the jobs whose events the views applied since the last
one: the projector tells its listeners of every event, this process's and those other replicas
applied to the views they share. Changes the listeners are not told of (a rebuild swapping
the views in) are found by a full read every ``FULL_READ_S``, and when this server begins to
schedule.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from domain.statuses import Status
from projections.queries import Queries

FULL_READ_S = 5.0
"""Every waiting job is read again at least this often."""
MAX_CHANGED = 10_000
"""Past this many jobs changed since the last round, the next one reads every waiting job (a
replica that does not schedule keeps no longer list)."""
_CHUNK = 500


class WaitingLine:
    def __init__(self, queries: Queries) -> None:
        self.queries = queries
        self._lock = threading.Lock()
        self._changed: set[str] | None = None
        """Jobs with events since the last read; None: read every waiting job."""
        self._rows: dict[str, dict[str, Any]] = {}
        self._full_at = 0.0
        self.read_again: set[str] | None = None
        """The jobs the last :meth:`rows` read again; None: it read every waiting job."""

    def on_events(self, events: Sequence[Any]) -> None:
        """A projector's listener: these events are in the views now."""
        with self._lock:
            if self._changed is None:
                return
            self._changed.update(str(event.originator_id) for event in events)
            if len(self._changed) > MAX_CHANGED:
                self._changed = None

    def forget(self) -> None:
        """The next read reads every waiting job."""
        with self._lock:
            self._changed = None

    @property
    def moved(self) -> bool:
        """Whether events came since the last read (or every job is to be read)."""
        with self._lock:
            return self._changed is None or bool(self._changed)

    def rows(self) -> Mapping[str, dict[str, Any]]:
        """The waiting jobs' list rows, by id: the line's own, as they are until the next call
        (not copied: 30,000 of them took a millisecond a round)."""
        now = time.monotonic()
        with self._lock:
            changed, self._changed = self._changed, set()
        try:
            if changed is None or now >= self._full_at:
                self.read_again = None
                found = self.queries.jobs_in([Status.SCHEDULING])
                kept, self._rows = self._rows, {}
                for row in found:  # a row as it was is that very object: the plan knows it
                    job_id = str(row["id"])
                    same = kept.get(job_id)
                    self._rows[job_id] = same if same == row else row
                self._full_at = now + FULL_READ_S
            else:
                self.read_again = changed
                self._read_again(changed)
        except BaseException:
            self.forget()  # what changed is not lost with the database
            raise
        return self._rows

    def _read_again(self, changed: set[str]) -> None:
        ordered = sorted(changed)
        for start in range(0, len(ordered), _CHUNK):
            chunk = ordered[start : start + _CHUNK]
            rows = self.queries.list_rows(chunk)
            for job_id in chunk:
                row = rows.get(job_id)
                if row is not None and row["status"] == Status.SCHEDULING.value:
                    self._rows[job_id] = row
                else:
                    self._rows.pop(job_id, None)
