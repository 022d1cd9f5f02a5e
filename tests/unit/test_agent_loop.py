"""The agent's poll loop: what it does with each assignment, and how it outlives errors."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import node_agent.agent as agent_module
from node_agent.agent import Agent, AgentSettings
from node_agent.client import ApiError, ApiUnavailable, Listing
from node_agent.jobdirs import JobDirs
from node_agent.models import MARKER_VARIABLE, Assignment, JobSpec
from node_agent.run.processes import marked_processes
from node_agent.supervisor import SupervisorSettings
from tests.support import wait_until


class FakeSupervisor:
    def __init__(self, assignment: Assignment, adopting: bool = False, **_: Any) -> None:
        self.job_id = assignment.job_id
        self.attempt = assignment.attempt
        self.adopting = adopting
        self.calls: list[str] = []
        self.updates: list[str] = []  # the statuses the agent passed on
        self.alive = True

    def update(self, assignment: Assignment) -> None:
        self.updates.append(assignment.status)

    def start(self) -> None:
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")

    def abort(self, shutting_down: bool = True) -> None:
        self.calls.append("abort")
        self.alive = False

    def is_alive(self) -> bool:
        return self.alive

    def join(self, timeout: float | None = None) -> None:
        pass


class FakeClient:
    def __init__(self) -> None:
        self.listing: list[Assignment] | Exception = []
        self.registrations = 0
        self.reports: list[tuple[str, dict[str, Any]]] = []
        self.polls = 0
        self.etag = ""
        self.asked_since: list[str | None] = []
        self.left: list[str] = []
        self.beats: list[list[tuple[str, str]] | None] = []

    def register(self, name: str, accels: int, accel_type: str, **_: Any) -> str:
        self.registrations += 1
        return f"node-{self.registrations}"

    def heartbeat(self, node_id: str, images: list[tuple[str, str]] | None = None) -> None:
        self.beats.append(images)

    def leave(self, node_id: str) -> int:
        self.left.append(node_id)
        return 0

    def assignments(self, node_id: str) -> list[Assignment]:
        self.polls += 1
        if isinstance(self.listing, Exception):
            failure, self.listing = self.listing, []
            raise failure
        return self.listing

    def poll_assignments(self, node_id: str, since: Any = None, wait: float = 0.0) -> Listing:
        self.asked_since.append(since)
        return Listing(self.assignments(node_id), self.etag)  # "": no long polls

    def report(self, job_id: str, report: dict[str, Any], retry_for: Any = None) -> str:
        self.reports.append((job_id, report))
        return "stopped"

    def stop_retrying(self) -> None:
        pass

    def when_node_taken(self, callback: Any) -> None:
        pass


def assignment(job_id: str, status: str) -> Assignment:
    spec = JobSpec(repository_url="/repo", entry_point=("train.py",))
    return Assignment(job_id=job_id, name=job_id, status=status, spec=spec)


@pytest.fixture
def client() -> FakeClient:
    return FakeClient()


@pytest.fixture
def agent(tmp_path: Path, client: FakeClient, monkeypatch: pytest.MonkeyPatch) -> Agent:
    monkeypatch.setattr(agent_module, "JobSupervisor", FakeSupervisor)
    settings = AgentSettings(
        name="gpu-1",
        accels=2,
        poll_interval=0.01,
        heartbeat_interval=0.01,
        supervisor=SupervisorSettings(work_dir=tmp_path),
    )
    agent = Agent(client, settings)  # type: ignore[arg-type]
    agent.register()
    return agent


def supervisor(agent: Agent, job_id: str) -> FakeSupervisor:
    return agent.supervisors[job_id]  # type: ignore[return-value]


def test_a_new_building_job_gets_a_supervisor_once(agent: Agent, client: FakeClient) -> None:
    client.listing = [assignment("job-1", "building")]
    agent.poll_once()
    agent.poll_once()
    assert supervisor(agent, "job-1").calls == ["start"]
    assert not supervisor(agent, "job-1").adopting


def test_each_answer_reaches_the_jobs_supervisor_a_stop_and_the_go_included(
    agent: Agent, client: FakeClient
) -> None:
    client.listing = [assignment("job-1", "building")]
    agent.poll_once()
    client.listing = [assignment("job-1", "in progress")]
    agent.poll_once()
    client.listing = [assignment("job-1", "stop in progress")]
    agent.poll_once()
    assert supervisor(agent, "job-1").updates == ["in progress", "stop in progress"]
    assert client.reports == []


@pytest.mark.parametrize("status", ["in progress", "stop in progress"])
def test_a_running_job_no_supervisor_follows_is_found_again_by_one(
    agent: Agent, client: FakeClient, status: str
) -> None:
    client.listing = [assignment("job-1", status)]
    agent.poll_once()
    assert supervisor(agent, "job-1").calls == ["start"]
    assert supervisor(agent, "job-1").adopting  # it decides: follow, or report the end
    assert client.reports == []


def test_at_start_the_processes_of_jobs_no_longer_listed_are_ended_and_no_others(
    agent: Agent, client: FakeClient, tmp_path: Path
) -> None:
    def sleeper(marker: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, MARKER_VARIABLE: marker}
        return subprocess.Popen(["sleep", "600"], env=env, start_new_session=True)

    orphan = sleeper(JobDirs.for_job(tmp_path, "gone").marker)
    listed = sleeper(JobDirs.for_job(tmp_path, "job-1").marker)
    another_agents = sleeper(JobDirs.for_job(tmp_path / "other", "gone").marker)
    try:
        wait_until(lambda: marked_processes().keys() >= {orphan.pid, listed.pid})
        client.listing = [assignment("job-1", "in progress")]
        agent.poll_once()
        assert orphan.wait(10) == -signal.SIGTERM
        assert listed.poll() is None and another_agents.poll() is None
        client.listing = []
        agent.poll_once()  # once, at start only
        assert listed.poll() is None
    finally:
        for process in (orphan, listed, another_agents):
            process.kill()
            process.wait()


def test_a_finished_job_still_listed_by_a_stale_answer_is_not_started_again(
    agent: Agent, client: FakeClient
) -> None:
    client.listing = [assignment("job-1", "building")]
    agent.poll_once()
    supervisor(agent, "job-1").alive = False
    client.listing = [assignment("job-1", "in progress")]
    agent.poll_once()
    assert "job-1" not in agent.supervisors
    assert client.reports == []


def test_a_retried_job_listed_again_with_a_later_attempt_is_taken_anew(
    agent: Agent, client: FakeClient
) -> None:
    client.listing = [assignment("job-1", "building")]
    agent.poll_once()
    first = supervisor(agent, "job-1")
    first.alive = False  # the attempt failed here and was reported
    client.listing = [assignment("job-1", "in progress")]  # a stale answer
    agent.poll_once()
    assert "job-1" not in agent.supervisors
    client.listing = [replace(assignment("job-1", "building"), attempt=2)]
    agent.poll_once()
    second = supervisor(agent, "job-1")
    assert second is not first and second.attempt == 2 and second.calls == ["start"]


def test_a_retry_listed_while_the_earlier_attempt_still_ends_waits_for_it(
    agent: Agent, client: FakeClient
) -> None:
    client.listing = [assignment("job-1", "building")]
    agent.poll_once()
    first = supervisor(agent, "job-1")  # still reporting the end of attempt 1
    client.listing = [replace(assignment("job-1", "building"), attempt=2)]
    agent.poll_once()
    assert supervisor(agent, "job-1") is first and first.updates == []
    first.alive = False
    agent.poll_once()
    assert supervisor(agent, "job-1").attempt == 2


def test_the_next_attempt_of_a_preempted_job_goes_to_its_supervisor(
    agent: Agent, client: FakeClient
) -> None:
    client.listing = [assignment("job-1", "building")]
    agent.poll_once()
    first = supervisor(agent, "job-1")
    for status in ("enqueued", "in progress"):  # it waits with its build kept, then runs
        client.listing = [replace(assignment("job-1", status), attempt=2)]
        agent.poll_once()
    assert supervisor(agent, "job-1") is first
    assert first.updates == ["enqueued", "in progress"]


def test_a_job_no_longer_listed_for_two_polls_is_aborted(agent: Agent, client: FakeClient) -> None:
    client.listing = [assignment("job-1", "in progress")]
    agent.supervisors["job-1"] = FakeSupervisor(assignment("job-1", "in progress"))  # type: ignore[assignment]
    client.listing = []
    agent.poll_once()
    assert supervisor(agent, "job-1").calls == []
    agent.poll_once()
    assert supervisor(agent, "job-1").calls == ["abort"]


def test_a_job_missing_from_an_answer_is_asked_about_again_at_once(
    agent: Agent, client: FakeClient
) -> None:
    client.etag = "listed"
    client.listing = [assignment("job-1", "in progress")]
    agent.poll_once()
    agent.poll_once()  # a long poll: it waits for a change since "listed"
    client.etag, client.listing = "gone", []
    assert agent.poll_once()  # a change: the next poll follows at once...
    agent.poll_once()  # ...and does not wait on the control plane
    assert client.asked_since == [None, "listed", "listed", None]
    assert supervisor(agent, "job-1").calls == ["start", "abort"]


def test_an_unknown_node_registers_again(agent: Agent, client: FakeClient) -> None:
    client.listing = ApiError(404, {"type": "https://flexai.dev/problems/node-not-found"})
    with pytest.raises(ApiError):
        agent.poll_once()
    assert agent.node_id == "node-2"


def test_the_poll_loop_outlives_its_errors_and_stops_on_shutdown(
    agent: Agent, client: FakeClient
) -> None:
    client.listing = ApiUnavailable("cannot reach the control plane")
    loop = threading.Thread(target=agent.run)
    loop.start()
    deadline = time.monotonic() + 5
    while client.polls < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    agent.request_shutdown()
    loop.join(5)
    assert client.polls >= 3
    assert not loop.is_alive()
    assert client.left == [agent.node_id]  # it said it left, once its jobs' processes ended


def test_a_heartbeat_tells_the_images_held_only_when_they_changed_or_after_registering(
    agent: Agent, client: FakeClient, tmp_path: Path
) -> None:
    cache = agent.settings.supervisor.images.cache(tmp_path)

    def pulled(n: int) -> None:
        fill = lambda staging: (staging / "rootfs").mkdir() is None  # noqa: E731
        cache.ensure(f"sha256:{n:064x}", f"r.io/a:{n}", fill, threading.Event())

    agent.heartbeat()
    pulled(1)
    agent.heartbeat()
    agent.heartbeat()
    pulled(2)
    agent.heartbeat()
    agent.register()
    agent.heartbeat()
    one, two = ("r.io/a:1", f"sha256:{1:064x}"), ("r.io/a:2", f"sha256:{2:064x}")
    assert client.beats == [[], [one], None, [one, two], [one, two]]
