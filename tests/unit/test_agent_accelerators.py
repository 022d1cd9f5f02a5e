"""The node's accelerator pool: who holds which index, and who waits."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from node_agent.accelerators import AcceleratorPool, Gpu, detect_gpus


def test_an_index_the_control_plane_allocated_is_held_until_its_job_ends() -> None:
    pool = AcceleratorPool()
    assert pool.claim("a", [0, 1]) is None
    assert pool.held_by("a") == [0, 1]
    assert pool.claim("b", [1, 2]) == "accelerator 1 of this node is held by job a"
    assert pool.claim("c", [2, 3]) is None  # no index in common
    pool.release("a")
    assert pool.claim("b", [0, 1]) is None


def test_a_job_given_an_index_of_a_job_being_ended_here_waits_for_it() -> None:
    pool = AcceleratorPool()
    pool.claim("leaving", [0])
    threading.Timer(0.3, pool.release, args=("leaving",)).start()
    started = time.monotonic()
    assert pool.claim("coming", [0], patience=30) is None
    assert 0.2 < time.monotonic() - started < 10


def test_a_wait_for_an_index_ends_with_a_stop() -> None:
    pool = AcceleratorPool()
    pool.claim("leaving", [0])
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    assert pool.claim("coming", [0], patience=30, cancel=cancel) is not None


def test_processes_that_survived_sigkill_keep_their_indices_until_they_end() -> None:
    stuck = subprocess.Popen(["sleep", "600"])
    try:
        pool = AcceleratorPool()
        pool.claim("stuck", [0, 1])
        pool.release("stuck", survivors=[stuck.pid])
        assert pool.claim("next", [1], patience=0.3) == (
            f"accelerator 1 of this node is still held by processes {stuck.pid} of job stuck, "
            "which survived SIGKILL (stuck in the kernel)"
        )
    finally:
        stuck.kill()
        stuck.wait()
    assert pool.claim("next", [1]) is None


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
