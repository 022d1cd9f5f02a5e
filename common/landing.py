"""A download's bytes landing in its partial file: read into one buffer while a thread of their
own hashes and writes the one before, in order (hashlib and file writes let go of the GIL). A
few buffers are reused from first byte to last, so no memory is allocated, or faulted in, per
piece."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Protocol

BUFFER = 4 * 2**20
BUFFERS = 3


class Digest(Protocol):
    def update(self, data: memoryview, /) -> None: ...


class Landing:
    """Takes what ``read_into`` puts in its buffers to ``digest`` and the file ``fd``."""

    def __init__(self, digest: Digest, fd: int, *, size: int = BUFFER,
                 buffers: int = BUFFERS) -> None:  # fmt: skip
        self.digest = digest
        self.fd = fd
        self._free: queue.Queue[bytearray] = queue.Queue()
        for _ in range(buffers):
            self._free.put(bytearray(size))
        self._full: queue.Queue[tuple[bytearray, int] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="landing", daemon=True)
        self._thread.start()

    def fill(self, read_into: Callable[[memoryview], int]) -> int:
        """Read the next bytes (as many as a buffer holds, fewer at the end); 0 at the end."""
        buffer = self._free.get()
        if self._error is not None:
            self._free.put(buffer)
            raise self._error
        try:
            got = read_into(memoryview(buffer))
        except BaseException:
            self._free.put(buffer)
            raise
        if got:
            self._full.put((buffer, got))
        else:
            self._free.put(buffer)
        return got

    def close(self) -> None:
        """Wait until every byte read is hashed and written; the writing's error, if any."""
        if self._thread.is_alive():
            self._full.put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while (item := self._full.get()) is not None:
            buffer, length = item
            if self._error is None:
                try:
                    view = memoryview(buffer)[:length]
                    self.digest.update(view)
                    while view:
                        view = view[os.write(self.fd, view) :]
                except BaseException as error:  # told to the reader, never lost in this thread
                    self._error = error
            self._free.put(buffer)
