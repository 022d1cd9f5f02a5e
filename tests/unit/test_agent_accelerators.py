"""The node's accelerator pool: who holds which index, and who waits."""

from __future__ import annotations

import sys
import threading
import time
import types
from pathlib import Path

import pytest

from node_agent.accelerators import AcceleratorPool, Gpu, detect_gpus


def acquire_in_thread(
    pool: AcceleratorPool, job_id: str, count: int, cancel: threading.Event | None = None
) -> tuple[threading.Thread, list[object]]:
    result: list[object] = []
    waits: list[str] = []

    def run() -> None:
        taken = pool.acquire(
            job_id, count, cancel=cancel or threading.Event(), on_wait=lambda: waits.append(job_id)
        )
        result.append(taken)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    result.append(waits)
    return thread, result


def test_a_job_gets_the_lowest_free_indices() -> None:
    pool = AcceleratorPool(4)
    assert pool.acquire("a", 1, cancel=threading.Event()) == [0]
    assert pool.acquire("b", 2, cancel=threading.Event()) == [1, 2]
    pool.release("a")
    assert pool.acquire("c", 2, cancel=threading.Event()) == [0, 3]
    assert pool.held_by("c") == [0, 3]


def test_a_job_waits_says_so_once_and_starts_when_enough_are_freed() -> None:
    pool = AcceleratorPool(2)
    pool.acquire("running", 2, cancel=threading.Event())
    thread, result = acquire_in_thread(pool, "queued", 1)
    time.sleep(0.5)
    assert thread.is_alive()
    assert result[0] == ["queued"]
    pool.release("running")
    thread.join(5)
    assert result[1] == [0]


def test_waiting_jobs_are_served_in_arrival_order() -> None:
    pool = AcceleratorPool(2)
    pool.acquire("running", 2, cancel=threading.Event())
    big, big_result = acquire_in_thread(pool, "big", 2)
    time.sleep(0.1)
    small, small_result = acquire_in_thread(pool, "small", 1)
    time.sleep(0.1)
    pool.release("running")
    big.join(5)
    assert big_result[1] == [0, 1]
    assert small.is_alive()
    pool.release("big")
    small.join(5)
    assert small_result[1] == [0]


def test_a_cancelled_wait_returns_nothing_and_lets_the_next_job_go() -> None:
    pool = AcceleratorPool(1)
    pool.acquire("running", 1, cancel=threading.Event())
    cancel = threading.Event()
    first, first_result = acquire_in_thread(pool, "first", 1, cancel)
    time.sleep(0.1)
    second, second_result = acquire_in_thread(pool, "second", 1)
    cancel.set()
    first.join(5)
    assert first_result[1] is None
    pool.release("running")
    second.join(5)
    assert second_result[1] == [0]


def test_asking_for_more_than_the_node_has_is_refused() -> None:
    with pytest.raises(ValueError, match="this node has 2"):
        AcceleratorPool(2).acquire("big", 3, cancel=threading.Event())


def fake_nvidia_smi(directory: Path, listing: str) -> None:
    smi = directory / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '{listing}'\n")
    smi.chmod(0o755)


class FakeNvml(types.ModuleType):
    """What ``pynvml`` offers the agent, for two H200s; ``broken``: no driver loaded."""

    class NVMLError(Exception):
        pass

    def __init__(self, broken: bool = False) -> None:
        super().__init__("pynvml")
        self.broken = broken
        self.shut_down = False

    def nvmlInit(self) -> None:
        if self.broken:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str | bytes:
        return "NVIDIA H200" if handle == 0 else b"NVIDIA H200"  # older bindings say bytes

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(total=143771 * 1024 * 1024)

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle}aaa"


H200S = [Gpu(0, "NVIDIA H200", 143771, "GPU-0aaa"), Gpu(1, "NVIDIA H200", 143771, "GPU-1aaa")]


@pytest.fixture
def no_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH with no nvidia-smi on it (the tests may put a fake one there)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    return tmp_path


def test_nvml_names_each_gpu_with_its_index_model_memory_and_uuid(
    no_smi: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert detect_gpus(env={}) == H200S
    assert nvml.shut_down
    assert H200S[0].to_json() == {
        "index": 0, "model": "NVIDIA H200", "memory_mb": 143771, "uuid": "GPU-0aaa",
    }  # fmt: skip


def test_without_a_working_nvml_nvidia_smi_is_asked(
    no_smi: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(broken=True))
    rows = ["0, NVIDIA H200, 143771, GPU-0aaa", "1, NVIDIA H200, 143771, GPU-1aaa"]
    fake_nvidia_smi(no_smi, "".join(f"{row}\\n" for row in rows))
    assert detect_gpus(env={}) == H200S


def test_a_host_without_nvml_nor_nvidia_smi_has_no_gpu(
    no_smi: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert detect_gpus(env={}) == []


def test_an_agent_confined_by_cuda_visible_devices_offers_those_gpus_numbered_from_0(
    no_smi: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    assert detect_gpus(env={"CUDA_VISIBLE_DEVICES": "GPU-1aaa"}) == [
        Gpu(0, "NVIDIA H200", 143771, "GPU-1aaa")
    ]
    assert [gpu.uuid for gpu in detect_gpus(env={"CUDA_VISIBLE_DEVICES": "1,0"})] == [
        "GPU-1aaa",
        "GPU-0aaa",
    ]
