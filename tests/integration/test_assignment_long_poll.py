"""An agent's long poll on its assignments (each store): an answer at once when they changed
since the agent's etag, else a wait that the node's own job events cut short."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app, end_long_requests
from api.identity.identities import ensure_admin_token
from api.scheduling.scheduler import Scheduler
from api.services import Services, build_services
from api.settings import Settings
from tests.support import node_headers

AGENT = {"X-Flexai-Agent-Id": "agent-0123456789abcdef"}
SPEC = {"repository_url": "/nowhere", "entry_point": ["train.py"]}


class Api:
    def __init__(self, client: TestClient, services: Services, token: str) -> None:
        self.client = client
        self.services = services
        self.headers = {"Authorization": f"Bearer {token}"}
        self.agent_headers = {**node_headers(services, "gpu-1"), **AGENT}
        """Node gpu-1's agent: the agent routes take its node token, not a user's."""
        registered = client.post(
            "/v1/agent/nodes", headers=self.agent_headers,
            json={"name": "gpu-1", "accels": 2, "accel_type": "cpu", "agent_id": AGENT[
                "X-Flexai-Agent-Id"]},
        )  # fmt: skip
        assert registered.status_code == 200, registered.text
        self.node_id = registered.json()["node_id"]

    def poll(self, **params: Any) -> tuple[dict[str, Any], float]:
        started = time.monotonic()
        path = f"/v1/agent/nodes/{self.node_id}/assignments"
        answer = self.client.get(path, headers=self.agent_headers, params=params)
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        assert answer.headers["ETag"] == f'"{body["etag"]}"'
        return body, time.monotonic() - started

    def poll_in_background(self, **params: Any) -> Future[tuple[dict[str, Any], float]]:
        future: Future[tuple[dict[str, Any], float]] = Future()
        threading.Thread(target=lambda: future.set_result(self.poll(**params))).start()
        time.sleep(0.3)  # the request is waiting by now (it would answer at once otherwise)
        assert not future.done()
        return future

    def submit_and_assign(self, name: str) -> None:
        answer = self.client.post("/v1/jobs", headers=self.headers, json={**SPEC, "name": name})
        assert answer.status_code == 201, answer.text
        Scheduler(self.services.scheduling()).run_once()


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[Api]:
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    services = build_services(settings)
    token, _ = ensure_admin_token(services.identities, settings.data_dir)
    with TestClient(create_app(services, background=False)) as client:
        yield Api(client, services, token)
    services.close()


def test_an_agent_whose_etag_is_stale_is_answered_at_once(api: Api) -> None:
    api.submit_and_assign("first")
    body, took = api.poll(wait=20, since="stale")
    assert [item["name"] for item in body["assignments"]] == ["first"]
    assert took < 10


def test_an_unchanged_answer_waits_for_as_long_as_asked(api: Api) -> None:
    first, _ = api.poll()
    again, took = api.poll(wait=0.5, since=first["etag"])
    assert again == first
    assert took >= 0.45


def test_a_job_assigned_to_the_node_ends_its_wait_at_once(api: Api) -> None:
    empty, _ = api.poll()
    waiting = api.poll_in_background(wait=25, since=empty["etag"])
    api.submit_and_assign("wakes-the-node")
    body, took = waiting.result(timeout=30)
    assert [item["name"] for item in body["assignments"]] == ["wakes-the-node"]
    assert body["etag"] != empty["etag"]
    assert took < 15  # far under the 25 s it would have waited


def test_a_stop_of_one_of_the_nodes_jobs_ends_its_wait(api: Api) -> None:
    api.submit_and_assign("to-stop")
    building, _ = api.poll()
    waiting = api.poll_in_background(wait=25, since=building["etag"])
    stopped = api.client.post("/v1/jobs/to-stop/stop", headers=api.headers)
    assert stopped.status_code == 202, stopped.text
    body, took = waiting.result(timeout=30)
    assert [item["status"] for item in body["assignments"]] == ["stop in progress"]
    assert took < 15


def test_another_nodes_job_does_not_wake_the_node(api: Api) -> None:
    empty, _ = api.poll()
    waiting = api.poll_in_background(wait=1.5, since=empty["etag"])
    api.client.post("/v1/jobs", headers=api.headers, json={**SPEC, "name": "unscheduled"})
    body, took = waiting.result(timeout=30)
    assert body == empty
    assert took >= 1.4


def test_a_stopping_server_answers_a_waiting_agent_at_once_and_every_later_poll_too(
    api: Api,
) -> None:
    empty, _ = api.poll()
    waiting = api.poll_in_background(wait=25, since=empty["etag"])
    assert api.client.portal is not None  # the event loop the requests run on
    api.client.portal.call(end_long_requests, api.services)  # what SIGTERM does
    body, took = waiting.result(timeout=30)
    assert body == empty
    assert took < 2  # far under the 25 s it would have waited
    _, again = api.poll(wait=25, since=empty["etag"])
    assert again < 2
