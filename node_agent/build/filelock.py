"""An exclusive lock on a file that a stop can interrupt (node-wide caches build once)."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

POLL_S = 0.02


class LockCancelled(Exception):
    """The job was stopped while it waited for the lock."""


class FileLock:
    """``flock`` on ``path``: exclusive across threads and processes; waits until ``cancel``."""

    def __init__(self, path: Path, cancel: threading.Event) -> None:
        self.path = path
        self.cancel = cancel
        self._fd = -1

    def __enter__(self) -> FileLock:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if self.cancel.wait(POLL_S):
                    os.close(self._fd)
                    raise LockCancelled() from None

    def __exit__(self, *_: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
