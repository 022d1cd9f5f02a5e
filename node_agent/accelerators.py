"""The node's accelerators: the GPUs the host has, and which of this agent's jobs holds which.

GPUs are found through NVML (``nvidia-ml-py``), else by asking ``nvidia-smi``. An agent confined
to some GPUs by its own ``CUDA_VISIBLE_DEVICES`` offers those only, numbered from 0 in that
order (the numbering :func:`node_agent.run.launch.visible_devices` maps back).
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from node_agent.run.processes import pid_running


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
    """Which of this agent's jobs holds which accelerator index.

    The control plane allocates the indices; this pool only checks that an index handed out is
    not still held here, by a job that runs or by processes of a job that survived SIGKILL
    (stuck in the kernel, on a hung GPU): a job must never share an accelerator.
    """

    def __init__(self) -> None:
        self._held: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        """By job: its indices, and the pids that survived its end (none while it runs)."""
        self._changed = threading.Condition()

    def claim(
        self,
        job_id: str,
        indices: Sequence[int],
        *,
        patience: float = 0.0,
        cancel: threading.Event | None = None,
    ) -> str | None:
        """Hold ``indices`` for the job; None when done, else what holds them still.

        A job of this agent that still runs on one of them is waited for ``patience`` seconds
        (or until ``cancel``): the control plane may allocate an index as soon as it has seen
        a job end, a little before this node has ended that job's processes.
        """
        deadline = time.monotonic() + patience
        with self._changed:
            while (holder := self._holder(job_id, indices)) is not None:
                running = not self._held[holder][1]
                left = deadline - time.monotonic()
                if not running or left <= 0 or (cancel is not None and cancel.is_set()):
                    return _describe(holder, sorted(set(self._held[holder][0]) & set(indices)),
                                     self._held[holder][1])  # fmt: skip
                self._changed.wait(min(left, 0.5))
            self._held[job_id] = (tuple(indices), ())
            return None

    def release(self, job_id: str, survivors: Sequence[int] = ()) -> None:
        """The job's processes ended; those in ``survivors`` did not, and keep its indices."""
        with self._changed:
            held = self._held.pop(job_id, None)
            if held is not None and survivors:
                self._held[job_id] = (held[0], tuple(survivors))
            self._changed.notify_all()

    def _holder(self, job_id: str, indices: Sequence[int]) -> str | None:
        """Another job holding one of ``indices``, if any (call with the lock held)."""
        for other, (held, survivors) in list(self._held.items()):
            if survivors and not any(map(pid_running, survivors)):
                del self._held[other]  # the stuck processes ended at last
            elif other != job_id and set(held) & set(indices):
                return other
        return None

    def held_by(self, job_id: str) -> list[int]:
        with self._changed:
            return sorted(self._held.get(job_id, ((), ()))[0])


def _describe(job_id: str, indices: list[int], survivors: tuple[int, ...]) -> str:
    which = f"accelerator{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))}"
    if not survivors:
        return f"{which} of this node {'are' if len(indices) > 1 else 'is'} held by job {job_id}"
    pids = ", ".join(map(str, survivors))
    return (
        f"{which} of this node {'are' if len(indices) > 1 else 'is'} still held by processes "
        f"{pids} of job {job_id}, which survived SIGKILL (stuck in the kernel)"
    )


def device_nodes(gpus: Sequence[Gpu]) -> dict[int, tuple[str, str]]:
    """Each offered GPU's device node and UUID, by index (a sandbox shows a job only its
    own): the node's minor number from NVML, else from the driver's ``/proc`` files, else
    the GPU's host index."""
    minors = _minors_from_nvml() or _minors_from_proc()
    return {gpu.index: (f"/dev/nvidia{minors.get(gpu.uuid, gpu.index)}", gpu.uuid)
            for gpu in gpus}  # fmt: skip


def _minors_from_nvml() -> dict[str, int]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return {}
    try:
        found = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            found[_text(pynvml.nvmlDeviceGetUUID(handle))] = int(
                pynvml.nvmlDeviceGetMinorNumber(handle))  # fmt: skip
        return found
    except Exception:
        return {}
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _minors_from_proc(root: str = "/proc/driver/nvidia/gpus") -> dict[str, int]:
    found: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for bus in os.listdir(root):
            with open(f"{root}/{bus}/information") as information:
                facts = dict(line.split(":", 1) for line in information if ":" in line)
            uuid, minor = facts.get("GPU UUID", "").strip(), facts.get("Device Minor", "")
            if uuid and minor.strip().isdigit():
                found[uuid] = int(minor)
    return found
