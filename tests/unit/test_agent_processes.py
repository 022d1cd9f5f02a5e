"""Process groups: output capture, and stops that leave no process behind."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from node_agent.models import MARKER_VARIABLE
from node_agent.run import processes
from node_agent.run.processes import GroupProcess, exit_code, run_command
from tests.support import STUBBORN_GROUP, alive


def collect(lines: list[bytes], count: int, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(lines) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return [int(line.split()[1]) for line in lines[:count]]  # b"PID <pid>\n"


def test_stopping_a_group_that_ignores_sigterm_leaves_no_process(tmp_path: Path) -> None:
    lines: list[bytes] = []
    process = GroupProcess(
        [sys.executable, "-c", STUBBORN_GROUP], cwd=tmp_path, env=os.environ, on_output=lines.append
    )
    try:
        pids = collect(lines, 3)
        assert len(pids) == 3 and all(alive(pid) for pid in pids)
        started = time.monotonic()
        survivors = process.end(grace=0.3)
    finally:
        process.end(grace=0)  # even when the test fails, nothing is left running
    assert survivors == []
    assert not any(alive(pid) for pid in pids)
    assert 0.3 <= time.monotonic() - started < 5


def test_a_group_that_obeys_sigterm_ends_without_waiting_for_the_grace(tmp_path: Path) -> None:
    process = GroupProcess(["sleep", "600"], cwd=tmp_path, env=os.environ, on_output=lambda _: None)
    started = time.monotonic()
    assert process.end(grace=30) == []
    assert time.monotonic() - started < 5
    assert exit_code(process.wait(1) or 0) == 128 + 15


def test_output_reaches_the_callback_line_by_line_in_order(tmp_path: Path) -> None:
    lines: list[bytes] = []
    script = "import sys\nfor i in range(500): print(i); print('e', i, file=sys.stderr)"
    process = GroupProcess(
        [sys.executable, "-u", "-c", script], cwd=tmp_path, env=os.environ, on_output=lines.append
    )
    assert process.wait(10) == 0
    process.finish_output()
    expected = [line for i in range(500) for line in (f"{i}\n".encode(), f"e {i}\n".encode())]
    assert lines == expected


def test_run_command_returns_the_exit_code_and_the_decoded_lines(tmp_path: Path) -> None:
    lines: list[str] = []
    code = run_command(
        ["sh", "-c", "echo one; echo two >&2; exit 3"],
        cwd=tmp_path,
        env=os.environ,
        on_line=lines.append,
        cancel=threading.Event(),
    )
    assert code == 3
    assert lines == ["one", "two"]


def test_a_cancelled_command_is_ended_and_returns_none(tmp_path: Path) -> None:
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    code = run_command(
        ["sleep", "600"], cwd=tmp_path, env=os.environ, on_line=lambda _: None, cancel=cancel
    )
    assert code is None
    assert time.monotonic() - started < 5


def test_a_scan_reads_each_settled_unmarked_process_once_and_still_finds_new_marked_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Scans of a busy host stay cheap: an old process without a marker is not read again."""
    reads: list[int] = []
    real = processes.marker_of

    def counting(pid: int) -> str | None:
        reads.append(pid)
        return real(pid)

    monkeypatch.setattr(processes, "marker_of", counting)
    monkeypatch.setattr(processes, "_UNMARKED", set())
    processes.job_processes("no-such-job")
    first = len(reads)
    reads.clear()
    processes.job_processes("no-such-job")
    assert len(reads) < first  # the settled ones were not read again
    env = {**os.environ, MARKER_VARIABLE: "a-job:0"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env,
                             start_new_session=True)  # fmt: skip
    try:
        time.sleep(0.2)
        assert child.pid in processes.job_processes("a-job:0")
    finally:
        child.kill()
        child.wait()
