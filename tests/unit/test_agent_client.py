"""The agent's HTTP client against a real local server: Retry-After, and the node-taken stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from email.message import Message
from typing import Any

import pytest

from node_agent.client import ApiUnavailable, ControlPlaneClient, NodeTaken
from tests.fake_http import serve_json, server_url

STORAGE_UNAVAILABLE = {
    "type": "https://flexai.dev/problems/storage-unavailable",
    "status": 503,
    "detail": "the artifact disk refuses writes (disk full)",
}
NODE_TAKEN = {
    "type": "https://flexai.dev/problems/node-taken",
    "status": 409,
    "detail": "another live agent holds node gpu-1",
}


class Server:
    """Answers each request with the next of ``answers`` (the last one forever)."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, Any], dict[str, str]]] = []
        self.times: list[float] = []
        self.paths: list[str] = []  # each request's path and query
        self.lock = threading.Lock()

    def answer(
        self, method: str, path: str, headers: Message, body: bytes
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        with self.lock:
            self.times.append(time.monotonic())
            self.paths.append(path)
            return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


@pytest.fixture
def server() -> Iterator[tuple[Server, str]]:
    state = Server()
    http = serve_json(state.answer)
    yield state, server_url(http)
    http.shutdown()


def test_a_503_with_retry_after_is_waited_out_before_the_next_try(
    server: tuple[Server, str],
) -> None:
    state, url = server
    state.answers = [(503, STORAGE_UNAVAILABLE, {"Retry-After": "1"}), (200, {"status": "x"}, {})]
    client = ControlPlaneClient(url, "t0ken", retry_for=10)
    assert client.report("job-1", {"type": "built"}) == {"status": "x"}
    first, second = state.times
    assert 1.0 <= second - first < 3.0  # not the 0.1 s of its own backoff


def test_a_retry_after_beyond_the_budget_gives_up_at_once_saying_what_the_server_said(
    server: tuple[Server, str],
) -> None:
    state, url = server
    state.answers = [(503, STORAGE_UNAVAILABLE, {"Retry-After": "30"})]
    client = ControlPlaneClient(url, "t0ken", retry_for=5)
    started = time.monotonic()
    with pytest.raises(ApiUnavailable) as caught:
        client.report("job-1", {"type": "built"})
    assert time.monotonic() - started < 1.0
    assert caught.value.retry_after == 30
    assert "503 storage-unavailable: the artifact disk refuses writes (disk full)" in str(
        caught.value
    )


def test_after_a_node_taken_answer_no_request_leaves_the_client(
    server: tuple[Server, str],
) -> None:
    state, url = server
    state.answers = [(409, NODE_TAKEN, {})]
    client = ControlPlaneClient(url, "t0ken")
    told: list[NodeTaken] = []
    client.when_node_taken(told.append)
    with pytest.raises(NodeTaken):
        client.heartbeat("node-1")
    with pytest.raises(NodeTaken):
        client.report("job-1", {"type": "stopped"})
    assert len(state.times) == 1
    assert [error.slug for error in told] == ["node-taken"]


def test_a_later_attempts_logs_and_outputs_name_it_and_the_first_ones_do_not(
    server: tuple[Server, str],
) -> None:
    state, url = server
    state.answers = [(200, {"size": 3, "id": "u", "part_size": 5}, {})]
    client = ControlPlaneClient(url, "t0ken", retry_for=1)
    client.append_logs("job-1", 0, b"abc")
    client.append_logs("job-1", 0, b"abc", 1, attempt=2)
    client.begin_upload("job-1", {"kind": "output"})
    client.begin_upload("job-1", {"kind": "output"}, attempt=3)
    assert state.paths == [
        "/v1/agent/jobs/job-1/logs?offset=0&node_index=0",
        "/v1/agent/jobs/job-1/logs?offset=0&node_index=1&attempt=2",
        "/v1/agent/jobs/job-1/uploads",
        "/v1/agent/jobs/job-1/uploads?attempt=3",
    ]
