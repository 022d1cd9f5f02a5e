"""Hashing (and writing) a stream in a thread of its own, in order: hashlib and file writes
let go of the GIL, so the thread that reads the stream (from the network, from a zip) need not
wait for them. Small pieces are gathered into batches of about ``batch`` bytes first (a hand-off
per piece would cost more than it saves); at most ``ahead`` batches wait, the reader beyond."""

from __future__ import annotations

import queue
import threading
from typing import IO, Protocol

BATCH = 4 * 2**20


class Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...


class Behind:
    """Feeds what it is given to ``digest`` (and writes it to ``sink``) behind the caller."""

    def __init__(self, digest: Digest, sink: IO[bytes] | None = None, *, batch: int = BATCH,
                 ahead: int = 4) -> None:  # fmt: skip
        self.digest = digest
        self.sink = sink
        self.batch = batch
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._queue: queue.Queue[list[bytes] | None] = queue.Queue(ahead)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="behind", daemon=True)
        self._thread.start()

    def feed(self, data: bytes) -> None:
        if self._error is not None:
            raise self._error
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= self.batch:
            self._hand_on()

    def close(self) -> None:
        """Wait until everything fed is hashed (and written); the writing's error, if any."""
        if self._thread.is_alive():
            self._hand_on()
            self._queue.put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error

    def _hand_on(self) -> None:
        if self._pending:
            self._queue.put(self._pending)
            self._pending, self._pending_bytes = [], 0

    def _run(self) -> None:
        while (pieces := self._queue.get()) is not None:
            if self._error is not None:
                continue  # drain: the feeder hears of the error
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            try:
                self.digest.update(data)
                if self.sink is not None:
                    self.sink.write(data)
            except BaseException as error:  # told to the feeder, never lost in this thread
                self._error = error
