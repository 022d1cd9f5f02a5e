"""The node's accelerators: the GPUs the host has, and which of this agent's jobs holds which.

GPUs are found through NVML (``nvidia-ml-py``), else by asking ``nvidia-smi``. An agent confined
to some GPUs by its own ``CUDA_VISIBLE_DEVICES`` offers those only, numbered from 0 in that
order (the numbering :func:`node_agent.launch.visible_devices` maps back).
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Gpu:
    index: int
    model: str
    memory_mb: int
    uuid: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def detect_gpus(env: Mapping[str, str] | None = None) -> list[Gpu]:
    """The host's NVIDIA GPUs this agent may use, by index; empty when there are none."""
    found = _from_nvml()
    if found is None:
        found = _from_nvidia_smi()
    return _confined(found, os.environ if env is None else env)


def _from_nvml() -> list[Gpu] | None:
    """None when NVML is not there or does not work (no driver): ``nvidia-smi`` may."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError, or a library that failed to load
        return None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            name, uuid = pynvml.nvmlDeviceGetName(handle), pynvml.nvmlDeviceGetUUID(handle)
            gpus.append(Gpu(index, _text(name), int(memory), _text(uuid)))
        return gpus
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _from_nvidia_smi() -> list[Gpu]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    query = "--query-gpu=index,name,memory.total,uuid"
    try:
        listing = subprocess.run(
            [smi, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for row in csv.reader(listing.splitlines(), skipinitialspace=True):
        if len(row) < 4:
            continue
        try:
            index, memory = int(row[0]), int(float(row[-2]))
        except ValueError:
            continue
        gpus.append(Gpu(index, ",".join(row[1:-2]).strip(), memory, row[-1].strip()))
    return gpus


def _confined(gpus: list[Gpu], env: Mapping[str, str]) -> list[Gpu]:
    """The GPUs the agent's ``CUDA_VISIBLE_DEVICES`` names (by index or UUID), renumbered."""
    named = [part.strip() for part in env.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    named = [part for part in named if part]
    if not named:
        return gpus
    by_name = {str(gpu.index): gpu for gpu in gpus} | {gpu.uuid: gpu for gpu in gpus}
    if not all(part in by_name for part in named):
        return gpus  # MIG devices or a typo: CUDA sorts it out, the numbering stays
    chosen = [by_name[part] for part in named]
    return [Gpu(i, gpu.model, gpu.memory_mb, gpu.uuid) for i, gpu in enumerate(chosen)]


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


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
