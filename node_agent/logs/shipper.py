"""Ordered, idempotent shipping of one job's log file to the control plane.

The job's log file is the source of truth: the entry point appends its output there itself
(through the shim, so a slow or absent control plane, or an agent that restarted, never blocks
the job nor loses a byte), the agent appends its own lines with :meth:`LogShipper.write`, and a
thread ships the file from the last acknowledged offset in batches: whenever ``max_batch``
bytes are waiting, else every ``flush_interval`` seconds. The server appends the bytes at
``offset`` once (each node of a job has its own log stream), so a resend after a lost answer is
harmless, and an agent that restarted resumes from the start of the file: the server's first
answer says how much it holds. When it says the offset is past its end
(``log-offset-mismatch``) the shipper resends from the offset it expects.

While the control plane cannot store logs (unreachable, or a 503 such as
``storage-unavailable``) the shipper keeps retrying, with a backoff that doubles up to 30 s
and honours ``Retry-After``. Once that has lasted ``unavailable_after`` seconds it calls
``on_unavailable`` (which reports ``logs_unavailable``) once for the offset it is stuck at, so
the user learns why the logs stop there and where the whole log is kept.

A job given secrets has their values masked (``***``) in what is shipped
(:mod:`node_agent.logs.masking`): the shipped stream is then the masked file, whose offsets differ
from the file's; it is a function of the file alone, so starting over from the file's first
byte (a resync) sends the same bytes at the same offsets again.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from common.attempts import attempt_query
from node_agent.client import ApiError, ApiUnavailable, ControlPlaneClient, NodeTaken
from node_agent.logs.masking import SecretMask

log = logging.getLogger("flexai.agent")

MAX_BATCH = 256 * 1024
"""Far below the server's log chunk limit (4 MiB unless its operator lowered it)."""
MIN_BATCH = 1024
"""The smallest log chunk limit a server may set: a 413 never shrinks batches below it."""
FLUSH_INTERVAL = 0.2
FIRST_RETRY = 1.0
LONGEST_RETRY = 30.0
UNAVAILABLE_AFTER = 10.0

ReportUnavailable = Callable[[str, int, int], bool]
"""``(message, offset, written)``: report that logs cannot be shipped past ``offset``;
True once that is settled (recorded or refused for good), False to try again later."""


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
        unavailable_after: float = UNAVAILABLE_AFTER,
        on_unavailable: ReportUnavailable | None = None,
        node_index: int = 0,
        resume: bool = False,
        secret_values: Sequence[str] = (),
        attempt: int = 1,
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.path = path
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        self.unavailable_after = unavailable_after
        self.on_unavailable = on_unavailable
        self.node_index = node_index
        self.attempt = attempt
        """The job's attempt this log is of: each attempt's stream has its own offsets."""
        self._write_fd, self._read_fd = _open_log(path, resume)
        self._changed = threading.Condition()
        self._written = 0
        self._acked = 0
        self._last_send = time.monotonic()  # a short job's whole log then goes at once
        self._closing = False
        self._given_up = False
        self._fds_closed = False
        self._failing_since: float | None = None  # when the current run of failures began
        self._reported_stuck_at: int | None = None  # the offset last reported unavailable
        self._mask = SecretMask(secret_values) if secret_values else None
        self._fed = 0  # masking: bytes of the file fed to the mask
        self._outbox = b""  # masking: masked bytes not acknowledged yet, from ``_sent`` on
        self._sent = 0  # masking: masked bytes the control plane acknowledged
        self._thread = threading.Thread(target=self._ship, name=f"logs-{job_id}", daemon=True)
        self._thread.start()

    @property
    def written(self) -> int:
        """Bytes the job (and the agent's lines) wrote so far."""
        with self._changed:
            return self._size()

    @property
    def acknowledged(self) -> int:
        """Bytes the control plane has acknowledged."""
        with self._changed:
            return self._acked

    @property
    def reported_unavailable_at(self) -> int | None:
        """The offset the shipper last told the control plane it is stuck at."""
        return self._reported_stuck_at

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
            self._changed.notify_all()

    def write_line(self, text: str) -> None:
        """One line of the agent's own, on a line of its own: after a newline when the job's
        last output ended without one (``print(..., end="")``), so that it is not glued on."""
        with self._changed:
            size = self._size()
            last = os.pread(self._read_fd, 1, size - 1) if size and not self._fds_closed else b""
        lead = "\n" if last not in (b"", b"\n") else ""
        self.write(f"{lead}{text}\n".encode(errors="replace"))

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
            complete = self._acked >= self._size()
            if not self._thread.is_alive() and not self._fds_closed:
                self._fds_closed = True
                os.close(self._write_fd)
                os.close(self._read_fd)
        return complete

    def _ship(self) -> None:
        backoff = FIRST_RETRY
        while (batch := self._next_masked() if self._mask else self._next_batch()) is not None:
            offset, data = batch
            attempted = time.monotonic()
            try:
                size = self._append(offset, data)
            except NodeTaken:
                return  # the agent is going away; it says why
            except ApiError as error:
                if self._resync(error, offset) or self._shrink(error, len(data)):
                    continue
                log.error("job %s: log shipping stopped: %s", self.job_id, error)
                self._report_unavailable(f"log shipping stopped: {error}")
                return
            except Exception as error:  # unreachable, storage trouble, or a bug: wait, retry
                if self._failing_since is None:
                    self._failing_since = attempted
                    log.warning("job %s: logs not shipped yet, retrying: %s", self.job_id, error)
                if time.monotonic() - self._failing_since >= self.unavailable_after:
                    self._report_unavailable(f"logs cannot be stored: {error}")
                retry_after = error.retry_after if isinstance(error, ApiUnavailable) else None
                with self._changed:
                    self._changed.wait_for(
                        lambda: self._given_up, timeout=max(backoff, retry_after or 0.0)
                    )
                backoff = min(backoff * 2, LONGEST_RETRY)
                continue
            if self._failing_since is not None:
                log.info("job %s: logs shipped again", self.job_id)
            self._failing_since, backoff = None, FIRST_RETRY
            with self._changed:
                if self._mask is not None:
                    self._masked_acknowledged(offset + len(data))
                else:
                    self._acked = max(offset + len(data), min(size, self._written))
                self._last_send = time.monotonic()
                self._changed.notify_all()

    def _append(self, offset: int, data: bytes) -> int:
        return self.client.append_logs(self.job_id, offset, data, self.node_index,
                                       **attempt_query(self.attempt))  # fmt: skip

    def _report_unavailable(self, what: str) -> None:
        """Tell the control plane, once per offset, that the logs stop there for now."""
        with self._changed:
            offset, written = self._acked, self._size()
        if self.on_unavailable is None or self._reported_stuck_at == offset:
            return
        message = f"{what}; the full log is kept on the node in {self.path}"
        if self.on_unavailable(message, offset, written):
            self._reported_stuck_at = offset

    def _shrink(self, error: ApiError, sent: int) -> bool:
        """A batch over the server's log chunk limit (413): send smaller ones from now on."""
        if error.status != 413:
            return False
        limit = error.problem.get("limit")
        smaller = min(sent // 2, limit if isinstance(limit, int) else sent)
        if smaller < MIN_BATCH:
            return False
        log.warning(
            "job %s: the control plane takes at most %s bytes of log at once; sending %d",
            self.job_id,
            limit if isinstance(limit, int) else "fewer",
            smaller,
        )
        self.max_batch = smaller
        return True

    def _next_batch(self) -> tuple[int, bytes] | None:
        """The bytes to send next, once it is time to; None when done."""
        with self._changed:
            while True:
                if self._given_up:
                    return None
                pending = self._size() - self._acked
                if pending <= 0 and self._closing:
                    return None
                due = self._last_send + self.flush_interval - time.monotonic()
                if pending >= self.max_batch or (pending > 0 and (self._closing or due <= 0)):
                    offset, end = self._acked, self._written
                    break
                # The job appends to the file by itself: look at its size again soon.
                self._changed.wait(timeout=due if pending > 0 else self.flush_interval)
        data = os.pread(self._read_fd, min(end - offset, self.max_batch), offset)
        if offset + len(data) < end and (cut := data.rfind(b"\n")) >= 0:
            data = data[: cut + 1]  # whole lines when the batch is full, if it holds one
        return offset, data

    def _next_masked(self) -> tuple[int, bytes] | None:
        """The masked bytes to send next, at their offset in the masked stream; None when
        done. The mask keeps a value's worth of bytes back until more come or the log closes."""
        assert self._mask is not None
        while not self._outbox:
            with self._changed:
                while True:
                    if self._given_up:
                        return None
                    pending = self._size() - self._fed
                    if pending <= 0 and self._closing and not self._mask.held:
                        return None
                    due = self._last_send + self.flush_interval - time.monotonic()
                    if pending >= self.max_batch or self._closing or (pending > 0 and due <= 0):
                        start, end, closing = self._fed, self._written, self._closing
                        break
                    self._changed.wait(timeout=due if pending > 0 else self.flush_interval)
            data = os.pread(self._read_fd, min(end - start, self.max_batch), start)
            self._fed = start + len(data)
            self._outbox = self._mask.feed(data, final=closing and self._fed >= end)
            if not self._outbox:
                with self._changed:  # everything held back: wait for more, not at once
                    self._last_send = time.monotonic()
        return self._sent, self._outbox[: self.max_batch]

    def _masked_acknowledged(self, end: int) -> None:
        """The control plane holds the masked stream up to ``end`` (call with the lock held)."""
        assert self._mask is not None
        self._outbox = self._outbox[max(0, end - self._sent) :]
        self._sent = end
        if not self._outbox:  # what the file's bytes fed so far gave is all shipped
            self._acked = self._fed - self._mask.held

    def _resync(self, error: ApiError, sent_at: int) -> bool:
        expected = error.problem.get("expected_offset")
        if error.slug != "log-offset-mismatch" or not isinstance(expected, int):
            return False
        if expected == sent_at:
            return False  # refusing the very offset it expects: resending cannot help
        if self._mask is not None:
            log.warning("job %s: the control plane expects log offset %d; resending the "
                        "masked log from its start", self.job_id, expected)  # fmt: skip
            with self._changed:
                self._fed, self._outbox, self._sent, self._acked = 0, b"", 0, 0
                self._mask.reset()
            return True
        with self._changed:
            log.warning(
                "job %s: the control plane expects log offset %d, not %d; resending from there",
                self.job_id,
                expected,
                self._acked,
            )
            self._acked = max(0, min(expected, self._size()))
        return True

    def _size(self) -> int:
        """The log file's size (call with the lock held); what the shipper last saw of it if
        it cannot be read any more."""
        if not self._fds_closed:
            self._written = max(self._written, os.fstat(self._read_fd).st_size)
        return self._written


def _open_log(path: Path, resume: bool) -> tuple[int, int]:
    """The log file for appending and for reading: a new one, or the one a job that runs on
    (an agent restarted) appends to. The job owns the directory: the agent follows no link
    there, and resumes only a plain file of its own."""
    if not resume:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW
        return os.open(path, flags, 0o644), os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    read_fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    status = os.fstat(read_fd)
    if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid() or status.st_nlink != 1:
        os.close(read_fd)
        raise OSError(f"{path} is not the agent's own log file any more; not resumed")
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW), read_fd
