"""The node's accelerators: what the host has, and which job holds which index."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable


def detect_gpus() -> list[str]:
    """The names of the host's NVIDIA GPUs by index (``nvidia-smi``); empty when there are none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        listing = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in listing.splitlines() if line.strip()]


class AcceleratorPool:
    """Indices ``0..count-1``, each held by at most one job; waiting jobs are served in order."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._holders: dict[int, str] = {}
        self._queue: list[str] = []
        self._changed = threading.Condition()

    def free(self) -> list[int]:
        with self._changed:
            return self._free()

    def held_by(self, job_id: str) -> list[int]:
        with self._changed:
            return sorted(index for index, holder in self._holders.items() if holder == job_id)

    def acquire(
        self,
        job_id: str,
        count: int,
        *,
        cancel: threading.Event,
        on_wait: Callable[[], None] = lambda: None,
    ) -> list[int] | None:
        """Allocate ``count`` indices, waiting behind earlier jobs while too few are free.

        ``on_wait`` is called once, outside the pool's lock, if the job has to wait.
        Returns None if ``cancel`` is set first.
        """
        if count > self.count:
            raise ValueError(f"{count} accelerators asked for, this node has {self.count}")
        with self._changed:
            self._queue.append(job_id)
        told = False
        try:
            while True:
                with self._changed:
                    if cancel.is_set():
                        return None
                    taken = self._take(job_id, count)
                    if taken is not None:
                        return taken
                    if told:
                        self._changed.wait(0.2)
                        continue
                on_wait()
                told = True
        finally:
            with self._changed:
                if job_id in self._queue:
                    self._queue.remove(job_id)
                self._changed.notify_all()

    def release(self, job_id: str) -> None:
        with self._changed:
            for index in [i for i, holder in self._holders.items() if holder == job_id]:
                del self._holders[index]
            self._changed.notify_all()

    def _take(self, job_id: str, count: int) -> list[int] | None:
        free = self._free()
        if self._queue[0] != job_id or len(free) < count:
            return None
        taken = free[:count]
        for index in taken:
            self._holders[index] = job_id
        self._queue.remove(job_id)
        return taken

    def _free(self) -> list[int]:
        return [index for index in range(self.count) if index not in self._holders]
