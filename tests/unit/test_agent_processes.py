"""Process groups: output capture, and stops that leave no process behind."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from node_agent.processes import GroupProcess, exit_code, run_command
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
