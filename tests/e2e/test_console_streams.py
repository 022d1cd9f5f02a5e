"""Two hundred open console job pages on a real server cost it no thread each, and a log line
the agent ships reaches every one of them."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.console import Holder, sign_in
from bench.followers import Server, raise_fd_limit

pytestmark = pytest.mark.e2e
PAGES = 200


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    raise_fd_limit()
    running = Server(tmp_path)
    yield running
    running.close()


def test_two_hundred_open_job_pages_hold_no_thread_each_and_each_gets_every_line(
    server: Server,
) -> None:
    threads_before = server.threads()
    holder = Holder(server, "console", PAGES, 0, sign_in(server.url, server.token))
    # The pages' streams wait on the event loop: the server has about as many threads as
    # before (its worker pool, bounded, may have grown while they opened).
    assert server.threads() < threads_before + 45
    offset = 0
    for index in range(3):
        offset = server.ship_log(offset, f"mark {index} {time.time():.6f}\n".encode())
        time.sleep(0.5)
    delays = holder.arrivals()
    assert len(delays) == 3 * PAGES
    assert statistics.median(delays) < 1.0, sorted(delays)[-10:]
