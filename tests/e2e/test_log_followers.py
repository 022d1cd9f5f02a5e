"""Hundreds of `logs --follow` clients on a quiet job cost the server no thread: everyone else
is still answered, disconnects free everything, and SIGTERM still stops it at once."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.followers import Holder, Server, raise_fd_limit

pytestmark = pytest.mark.e2e
FOLLOWERS = 300  # the old server ran out of worker threads at about 40


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    raise_fd_limit()
    running = Server(tmp_path)
    yield running
    running.close()


def test_hundreds_of_followers_leave_the_server_answering_and_are_freed_on_disconnect(
    server: Server,
) -> None:
    threads_before = server.threads()
    holder = Holder(server, FOLLOWERS)
    try:
        assert server.followers() == FOLLOWERS
        for name, send in server.requests().items():
            for _ in range(20):
                assert send().status_code == 200, name
        # Followers hold no thread: the server has about as many as before.
        assert server.threads() < threads_before + 45
        offset = server.ship_log(0, b"step 1 loss=0.5\n")
        assert server.ship_log(offset, b"step 2 loss=0.4\n") == 2 * offset
    finally:
        holder.close()
    deadline = time.monotonic() + 10
    while server.followers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.followers() == 0


def test_sigterm_stops_the_server_within_5_s_while_followers_are_open(server: Server) -> None:
    holder = Holder(server, FOLLOWERS)
    try:
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=15) == 0
        assert time.monotonic() - started < 5
    finally:
        holder.close()
