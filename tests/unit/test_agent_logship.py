"""Log shipping against a tiny real HTTP server that implements the log offset contract."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from email.message import Message
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from node_agent.client import ControlPlaneClient
from node_agent.logship import LogShipper
from tests.support import serve_json, server_url


class LogStore:
    """``POST /v1/agent/jobs/{id}/logs?offset=N`` as design.md defines it."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.requests = 0
        self.fail_next = 0  # answer this many requests with 503
        self.lock = threading.Lock()

    def append(self, offset: int, body: bytes) -> tuple[int, dict[str, object]]:
        with self.lock:
            self.requests += 1
            if self.fail_next:
                self.fail_next -= 1
                return 503, {"title": "unavailable"}
            if offset > len(self.data):
                return 409, {
                    "type": "https://flexai.dev/problems/log-offset-mismatch",
                    "title": "Log offset mismatch",
                    "status": 409,
                    "detail": f"offset {offset} is past the end",
                    "expected_offset": len(self.data),
                }
            self.data.extend(body[len(self.data) - offset :])
            return 200, {"size": len(self.data)}


def serve(store: LogStore) -> ThreadingHTTPServer:
    def answer(
        method: str, path: str, headers: Message, body: bytes
    ) -> tuple[int, dict[str, object]]:
        url = urlparse(path)
        assert method == "POST"
        assert headers["Authorization"] == "Bearer t0ken"
        assert url.path == "/v1/agent/jobs/job-1/logs"
        return store.append(int(parse_qs(url.query)["offset"][0]), body)

    return serve_json(answer)


@pytest.fixture
def store() -> LogStore:
    return LogStore()


@pytest.fixture
def client(store: LogStore) -> Iterator[ControlPlaneClient]:
    server = serve(store)
    client = ControlPlaneClient(server_url(server), "t0ken")
    yield client
    client.close()
    server.shutdown()


def test_twenty_thousand_lines_arrive_complete_in_order_in_few_requests(
    tmp_path: Path, store: LogStore, client: ControlPlaneClient
) -> None:
    shipper = LogShipper(client, "job-1", tmp_path / "job.log")
    lines = [f"step {i} loss {1 / (i + 1):.6f}\n".encode() for i in range(20_000)]
    for line in lines:
        shipper.write(line)
    assert shipper.close(timeout=30)
    assert bytes(store.data) == b"".join(lines)
    assert store.requests < 100, store.requests


def test_a_batch_that_is_full_ends_on_a_line_boundary(
    tmp_path: Path, store: LogStore, client: ControlPlaneClient
) -> None:
    sizes: list[int] = []
    original = client.append_logs

    def recording(job_id: str, offset: int, data: bytes) -> int:
        sizes.append(len(data))
        assert data.endswith(b"\n")
        return original(job_id, offset, data)

    client.append_logs = recording  # type: ignore[method-assign]
    shipper = LogShipper(client, "job-1", tmp_path / "job.log", max_batch=1000)
    shipper.write(b"".join(f"line {i:05d}\n".encode() for i in range(1000)))
    assert shipper.close(timeout=30)
    assert len(store.data) == 11_000
    assert max(sizes) <= 1000


def test_the_shipper_resends_from_the_offset_the_server_expects(
    tmp_path: Path, store: LogStore, client: ControlPlaneClient
) -> None:
    shipper = LogShipper(client, "job-1", tmp_path / "job.log", flush_interval=0.01)
    shipper.write(b"before the server lost its copy\n")
    while shipper.acknowledged < 32:
        threading.Event().wait(0.01)
    with store.lock:
        store.data.clear()
    shipper.write(b"after\n")
    assert shipper.close(timeout=30)
    assert bytes(store.data) == b"before the server lost its copy\nafter\n"


def test_server_errors_are_retried_without_losing_or_doubling_bytes(
    tmp_path: Path, store: LogStore, client: ControlPlaneClient
) -> None:
    store.fail_next = 3
    shipper = LogShipper(client, "job-1", tmp_path / "job.log")
    for i in range(100):
        shipper.write(f"{i}\n".encode())
    assert shipper.close(timeout=30)
    assert bytes(store.data) == b"".join(f"{i}\n".encode() for i in range(100))


def test_everything_written_is_also_kept_in_the_local_log_file(
    tmp_path: Path, client: ControlPlaneClient
) -> None:
    shipper = LogShipper(client, "job-1", tmp_path / "job.log")
    shipper.write_line("[build] cloning")
    shipper.write(b"partial line without newline")
    assert shipper.close(timeout=30)
    assert (tmp_path / "job.log").read_bytes() == b"[build] cloning\npartial line without newline"


def test_close_gives_up_after_its_timeout_when_the_server_is_gone(tmp_path: Path) -> None:
    client = ControlPlaneClient("http://127.0.0.1:9", "t0ken", retry_for=0.2)
    shipper = LogShipper(client, "job-1", tmp_path / "job.log")
    shipper.write_line("nobody listens")
    assert shipper.close(timeout=0.5) is False
    client.close()
