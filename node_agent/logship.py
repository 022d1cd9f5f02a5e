"""Ordered, idempotent shipping of one job's output to the control plane.

Lines are appended to the job's log file first (so a slow or absent control plane never blocks
the job nor loses a byte), and a thread ships the file from the last acknowledged offset in
batches: whenever ``max_batch`` bytes are waiting, else every ``flush_interval`` seconds.
The server appends the bytes at ``offset`` once, so a resend after a lost answer is harmless;
when it says the offset is past its end (``log-offset-mismatch``) the shipper resends from
the offset it expects.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from node_agent.client import ApiError, ControlPlaneClient

log = logging.getLogger("flexai.agent")

MAX_BATCH = 256 * 1024
FLUSH_INTERVAL = 0.2


class LogShipper:
    """Takes a job's output with :meth:`write`; :meth:`close` returns once all of it shipped."""

    def __init__(
        self,
        client: ControlPlaneClient,
        job_id: str,
        path: Path,
        *,
        flush_interval: float = FLUSH_INTERVAL,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        self._write_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._read_fd = os.open(path, os.O_RDONLY)
        self._changed = threading.Condition()
        self._written = 0
        self._acked = 0
        self._last_send = 0.0
        self._closing = False
        self._given_up = False
        self._fds_closed = False
        self._thread = threading.Thread(target=self._ship, name=f"logs-{job_id}", daemon=True)
        self._thread.start()

    @property
    def acknowledged(self) -> int:
        """Bytes the control plane has acknowledged."""
        with self._changed:
            return self._acked

    def write(self, data: bytes) -> None:
        """Append output bytes; never blocks on the network."""
        if not data:
            return
        with self._changed:
            if self._closing:
                return
            view = memoryview(data)
            while view:
                view = view[os.write(self._write_fd, view) :]
            self._written += len(data)
            self._changed.notify_all()

    def write_line(self, text: str) -> None:
        self.write(f"{text}\n".encode(errors="replace"))

    def abandon(self) -> None:
        """Stop shipping as soon as possible (the agent is going away)."""
        with self._changed:
            self._closing = True
            self._given_up = True
            self._changed.notify_all()

    def close(self, timeout: float | None = None) -> bool:
        """Ship what is left and stop; True when every byte has been acknowledged.

        Later calls return at once with the same answer.
        """
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._thread.join(timeout)
        with self._changed:
            self._given_up = True  # a thread still running after ``timeout`` stops at once
            self._changed.notify_all()
            complete = self._acked >= self._written
            if not self._thread.is_alive() and not self._fds_closed:
                self._fds_closed = True
                os.close(self._write_fd)
                os.close(self._read_fd)
        return complete

    def _ship(self) -> None:
        while (batch := self._next_batch()) is not None:
            offset, data = batch
            try:
                size = self.client.append_logs(self.job_id, offset, data)
            except ApiError as error:
                if not self._resync(error, offset):
                    log.error("job %s: log shipping stopped: %s", self.job_id, error)
                    return
                continue
            except Exception as error:  # unreachable, or a bug: wait, then try again
                log.warning("job %s: logs not shipped yet: %s", self.job_id, error)
                with self._changed:
                    self._changed.wait_for(lambda: self._given_up, timeout=1.0)
                continue
            with self._changed:
                self._acked = max(offset + len(data), min(size, self._written))
                self._last_send = time.monotonic()
                self._changed.notify_all()

    def _next_batch(self) -> tuple[int, bytes] | None:
        """The bytes to send next, once it is time to; None when done."""
        with self._changed:
            while True:
                if self._given_up:
                    return None
                pending = self._written - self._acked
                if pending == 0 and self._closing:
                    return None
                due = self._last_send + self.flush_interval - time.monotonic()
                if pending >= self.max_batch or (pending and (self._closing or due <= 0)):
                    offset, end = self._acked, self._written
                    break
                self._changed.wait(timeout=due if pending else None)
        data = os.pread(self._read_fd, min(end - offset, self.max_batch), offset)
        if offset + len(data) < end and (cut := data.rfind(b"\n")) >= 0:
            data = data[: cut + 1]  # whole lines when the batch is full, if it holds one
        return offset, data

    def _resync(self, error: ApiError, sent_at: int) -> bool:
        expected = error.problem.get("expected_offset")
        if error.slug != "log-offset-mismatch" or not isinstance(expected, int):
            return False
        if expected == sent_at:
            return False  # refusing the very offset it expects: resending cannot help
        with self._changed:
            log.warning(
                "job %s: the control plane expects log offset %d, not %d; resending from there",
                self.job_id,
                expected,
                self._acked,
            )
            self._acked = max(0, min(expected, self._written))
        return True
