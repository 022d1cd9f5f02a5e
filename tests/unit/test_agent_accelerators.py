"""The node's accelerator pool: who holds which index, and who waits."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from node_agent.accelerators import AcceleratorPool, detect_gpus


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


def test_the_hosts_gpus_are_found_by_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path, "NVIDIA H200\\nNVIDIA H200\\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect_gpus() == ["NVIDIA H200", "NVIDIA H200"]


def test_a_host_without_nvidia_smi_has_no_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect_gpus() == []
