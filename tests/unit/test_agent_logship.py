"""Log shipping against a tiny real HTTP server that implements the log offset contract."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from email.message import Message
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from node_agent.client import ControlPlaneClient
from node_agent.logs import shipper as logship
from node_agent.logs.shipper import LogShipper
from tests.fake_http import serve_json, server_url
from tests.support import wait_until


class LogStore:
    """``POST /v1/agent/jobs/{id}/logs?offset=N`` as design.md defines it."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.requests = 0
        self.fail_next = 0  # answer this many requests with 503
        self.storage_down = False  # answer 503 storage-unavailable until it is back
        self.chunk_limit: int | None = None  # answer 413 to bigger chunks
        self.chunks: list[int] = []  # the sizes of the chunks taken
        self.retry_after = "0"
        self.times: list[float] = []  # when each request came
        self.node_indices: set[int] = set()  # the log streams written to
        self.lock = threading.Lock()

    def append(self, offset: int, body: bytes) -> tuple[int, dict[str, object], dict[str, str]]:
        with self.lock:
            self.requests += 1
            self.times.append(time.monotonic())
            if self.fail_next:
                self.fail_next -= 1
                return 503, {"title": "unavailable"}, {}
            if self.storage_down:
                return 503, STORAGE_UNAVAILABLE, {"Retry-After": self.retry_after}
            if self.chunk_limit is not None and len(body) > self.chunk_limit:
                too_large = {
                    "type": "https://flexai.dev/problems/payload-too-large",
                    "status": 413,
                    "detail": f"the log chunk is over {self.chunk_limit} bytes",
                    "limit": self.chunk_limit,
                }
                return 413, too_large, {}
            if offset > len(self.data):
                return 409, {
                    "type": "https://flexai.dev/problems/log-offset-mismatch",
                    "title": "Log offset mismatch",
                    "status": 409,
                    "detail": f"offset {offset} is past the end",
                    "expected_offset": len(self.data),
                }, {}  # fmt: skip
            self.data.extend(body[len(self.data) - offset :])
            self.chunks.append(len(body))
            return 200, {"size": len(self.data)}, {}


STORAGE_UNAVAILABLE = {
    "type": "https://flexai.dev/problems/storage-unavailable",
    "title": "Storage unavailable",
    "status": 503,
    "detail": "the artifact disk refuses writes (disk full)",
}


def serve(store: LogStore) -> ThreadingHTTPServer:
    def answer(
        method: str, path: str, headers: Message, body: bytes
    ) -> tuple[int, dict[str, object], dict[str, str]]:
        url = urlparse(path)
        assert method == "POST"
        assert headers["Authorization"] == "Bearer t0ken"
        assert url.path == "/v1/agent/jobs/job-1/logs"
        query = parse_qs(url.query)
        store.node_indices.add(int(query["node_index"][0]))
        return store.append(int(query["offset"][0]), body)

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

    def recording(job_id: str, offset: int, data: bytes, node_index: int) -> int:
        sizes.append(len(data))
        assert data.endswith(b"\n")
        return original(job_id, offset, data, node_index)

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


def test_what_the_job_appends_to_the_file_by_itself_is_shipped_on_its_nodes_stream(
    tmp_path: Path, store: LogStore, client: ControlPlaneClient
) -> None:
    path = tmp_path / "job.log"
    shipper = LogShipper(client, "job-1", path, flush_interval=0.01, node_index=1)
    shipper.write_line("[agent] running train.py")
    with path.open("ab") as job:  # the entry point holds the log file, not a pipe
        job.write(b"epoch 1\n")
        job.flush()
        wait_until(lambda: bytes(store.data).endswith(b"epoch 1\n"))
        job.write(b"epoch 2\n")
    shipper.write_line("[agent] the entry point exited with code 0")
    assert shipper.close(timeout=30)
    assert bytes(store.data) == (
        b"[agent] running train.py\nepoch 1\nepoch 2\n"
        b"[agent] the entry point exited with code 0\n"
    )
    assert store.node_indices == {1}


def test_an_agent_line_after_output_without_a_newline_starts_a_line_of_its_own(
    tmp_path: Path, store: LogStore, client: ControlPlaneClient
) -> None:
    path = tmp_path / "job.log"
    shipper = LogShipper(client, "job-1", path, flush_interval=0.01)
    shipper.write_line("[agent] running train.py")
    with path.open("ab") as job:  # the entry point's last print had end=""
        job.write(b"step 9\nno newline at the end")
    shipper.write_line("[agent] the entry point exited with code 3")
    shipper.write_line("[agent] stopped")
    assert shipper.close(timeout=30)
    expected = (b"[agent] running train.py\nstep 9\nno newline at the end\n"
                b"[agent] the entry point exited with code 3\n[agent] stopped\n")  # fmt: skip
    assert bytes(store.data) == expected and path.read_bytes() == expected


def test_an_agent_that_restarted_resumes_the_log_where_the_server_holds_it(
    tmp_path: Path, store: LogStore, client: ControlPlaneClient
) -> None:
    path = tmp_path / "job.log"
    lines = b"".join(f"line {i:05d}\n".encode() for i in range(1000))
    path.write_bytes(lines)
    store.data.extend(lines[:7000])  # shipped before the agent died
    shipper = LogShipper(client, "job-1", path, max_batch=1000, resume=True)
    shipper.write_line("[agent] found the job running again")
    assert shipper.close(timeout=30)
    assert bytes(store.data) == lines + b"[agent] found the job running again\n"
    assert path.read_bytes() == bytes(store.data)  # not truncated
    assert sum(store.chunks) <= len(store.data) - 7000 + 1000  # one batch resent at most


def test_a_log_file_the_job_replaced_with_a_link_is_not_resumed(
    tmp_path: Path, client: ControlPlaneClient
) -> None:
    (tmp_path / "secret").write_text("the agent's\n")
    (tmp_path / "job.log").symlink_to(tmp_path / "secret")
    with pytest.raises(OSError):
        LogShipper(client, "job-1", tmp_path / "job.log", resume=True)


def test_close_gives_up_after_its_timeout_when_the_server_is_gone(tmp_path: Path) -> None:
    client = ControlPlaneClient("http://127.0.0.1:9", "t0ken", retry_for=0.2)
    shipper = LogShipper(client, "job-1", tmp_path / "job.log")
    shipper.write_line("nobody listens")
    assert shipper.close(timeout=0.5) is False
    client.close()


def test_a_small_server_chunk_limit_shrinks_the_batches_and_every_byte_arrives(
    tmp_path: Path, store: LogStore, client: ControlPlaneClient
) -> None:
    store.chunk_limit = 4096
    shipper = LogShipper(client, "job-1", tmp_path / "job.log")
    lines = [f"{i:05d} {'x' * 994}\n".encode() for i in range(100)]
    shipper.write(b"".join(lines))
    assert shipper.close(timeout=30)
    assert bytes(store.data) == b"".join(lines)
    assert max(store.chunks) <= 4096


class Unavailability:
    """The ``logs_unavailable`` reports a supervisor would send: (message, offset, written)."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, int, int]] = []

    def __call__(self, message: str, offset: int, written: int) -> bool:
        self.reports.append((message, offset, written))
        return True


def test_logs_the_server_cannot_store_are_reported_unavailable_once_then_shipped_when_it_can(
    tmp_path: Path, store: LogStore, client: ControlPlaneClient
) -> None:
    store.data.extend(b"stored\n")
    store.storage_down = True
    report = Unavailability()
    log_file = tmp_path / "job.log"
    shipper = LogShipper(
        client, "job-1", log_file, flush_interval=0.01, unavailable_after=0.3,
        on_unavailable=report,
    )  # fmt: skip
    shipper.write(b"stored\n")
    shipper.write(b"not stored yet\n")
    wait_until(lambda: report.reports, timeout=10)
    requests = store.requests
    wait_until(lambda: store.requests >= requests + 2, timeout=10)  # it keeps trying
    assert len(report.reports) == 1  # once for the offset it is stuck at
    message, offset, written = report.reports[0]
    assert (offset, written) == (0, 22)
    assert "storage-unavailable: the artifact disk refuses writes (disk full)" in message
    assert str(log_file) in message
    store.storage_down = False
    assert shipper.close(timeout=30)
    assert bytes(store.data) == b"stored\nnot stored yet\n"


def shipping_attempts(
    store: LogStore, tmp_path: Path, seconds: float, retry_after: str = "0"
) -> list[float]:
    """The gaps between the shipper's tries while the server cannot store logs."""
    store.storage_down = True
    store.retry_after = retry_after
    server = serve(store)
    client = ControlPlaneClient(server_url(server), "t0ken", retry_for=0)  # no quick retries
    shipper = LogShipper(client, "job-1", tmp_path / "job.log", flush_interval=0.01)
    shipper.write(b"line\n")
    time.sleep(seconds)
    shipper.close(timeout=0)
    client.close()
    server.shutdown()
    return [later - earlier for earlier, later in itertools.pairwise(store.times)]


def test_while_the_server_cannot_store_logs_the_shipper_backs_off_up_to_a_cap(
    tmp_path: Path, store: LogStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 0.1, 0.2, 0.4, 0.8, 1.6, then 1.6 again where doubling on would wait 3.2. The lower
    # bounds hold however loaded the machine (a wait never ends early); the upper ones leave
    # 0.8 s or more of slack for a slow request (a fresh clone's full suite once saw a first
    # gap of 0.73 s, against 0.45 s with a cap of 0.8 s).
    monkeypatch.setattr(logship, "FIRST_RETRY", 0.1)
    monkeypatch.setattr(logship, "LONGEST_RETRY", 1.6)
    gaps = shipping_attempts(store, tmp_path, 6.0)
    assert len(gaps) >= 6, gaps
    assert gaps[0] < 0.9, gaps  # it starts well under the cap...
    floors = (0.09, 0.18, 0.36, 0.72, 1.45, 1.45)
    assert all(gap >= floor for gap, floor in zip(gaps[:6], floors, strict=True)), gaps
    assert max(gaps) < 2.6, gaps  # ...and stops doubling at it


def test_the_shipper_waits_as_long_as_retry_after_asks(
    tmp_path: Path, store: LogStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logship, "FIRST_RETRY", 0.05)
    gaps = shipping_attempts(store, tmp_path, 1.5, retry_after="0.6")
    assert gaps and all(gap >= 0.55 for gap in gaps), gaps
