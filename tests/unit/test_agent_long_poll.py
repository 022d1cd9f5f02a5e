"""The agent's long poll: the next poll follows an answer at once, a shutdown does not wait for
a held poll, and a control plane without long polls is asked every --poll-interval."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import node_agent.agent as agent_module
from node_agent.agent import Agent, AgentSettings
from node_agent.client import Listing
from node_agent.supervisor import SupervisorSettings
from tests.unit.test_agent_loop import FakeClient, FakeSupervisor


class LongPollingClient(FakeClient):
    """Answers each poll with the next etag of ``etags``, then holds the poll until released."""

    def __init__(self, etags: list[str]) -> None:
        super().__init__()
        self.etags = etags
        self.asked: list[tuple[str | None, float]] = []
        self.release = threading.Event()

    def poll_assignments(self, node_id: str, since: Any = None, wait: float = 0.0) -> Listing:
        self.asked.append((since, time.monotonic()))
        if len(self.asked) > len(self.etags):
            self.release.wait(wait)
            return Listing([], self.etags[-1])
        return Listing([], self.etags[len(self.asked) - 1])


def running_agent(tmp_path: Path, client: FakeClient, poll_interval: float) -> tuple[Agent, Any]:
    settings = AgentSettings(
        name="gpu-1", accels=1, poll_interval=poll_interval, heartbeat_interval=5,
        supervisor=SupervisorSettings(work_dir=tmp_path),
    )  # fmt: skip
    agent = Agent(client, settings)  # type: ignore[arg-type]
    agent.register()
    thread = threading.Thread(target=agent.run)
    thread.start()
    return agent, thread


@pytest.fixture(autouse=True)
def fake_supervisors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_module, "JobSupervisor", FakeSupervisor)


def test_each_answer_is_followed_by_a_poll_at_once_with_its_etag(tmp_path: Path) -> None:
    client = LongPollingClient(["a", "b", "c"])
    agent, thread = running_agent(tmp_path, client, poll_interval=30)
    deadline = time.monotonic() + 10
    while len(client.asked) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    agent.request_shutdown()
    client.release.set()
    thread.join(10)
    assert [since for since, _ in client.asked[:4]] == [None, "a", "b", "c"]
    assert client.asked[3][1] - client.asked[0][1] < 5  # no 30 s pause between them


def test_a_shutdown_does_not_wait_for_a_held_poll(tmp_path: Path) -> None:
    client = LongPollingClient(["a"])
    agent, thread = running_agent(tmp_path, client, poll_interval=30)
    while len(client.asked) < 2:
        time.sleep(0.01)
    started = time.monotonic()
    agent.request_shutdown()
    thread.join(10)
    assert not thread.is_alive()
    assert time.monotonic() - started < 3  # the held poll would have lasted 20 s
    client.release.set()


def test_a_control_plane_without_long_polls_is_asked_every_poll_interval(
    tmp_path: Path,
) -> None:
    client = LongPollingClient([""] * 100)  # no etag: an older control plane
    agent, thread = running_agent(tmp_path, client, poll_interval=0.3)
    time.sleep(1.0)
    agent.request_shutdown()
    thread.join(10)
    assert 2 <= len(client.asked) <= 5
