"""The debug session routes (each store): who may open one, when, and the relay between the
user's WebSocket and the agent's, recorded in the job's history."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from api.http.app import create_app, end_long_requests
from api.http.routes import debug
from api.identity.identities import ensure_admin_token
from api.scheduling.scheduler import Scheduler
from api.services import Services, build_services
from api.settings import Settings

AGENT_ID = "agent-0123456789abcdef"
SPEC = {"repository_url": "/nowhere", "entry_point": ["train.py"]}
PUBLIC_KEY = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
HOST_KEY = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()


class Api:
    admin: dict[str, str]

    def __init__(self, client: TestClient, services: Services) -> None:
        self.client, self.services = client, services
        identities = services.identities
        self.alice = _bearer(identities.create_user("alice", admin=False, by="admin").token)
        self.bob = _bearer(identities.create_user("bob", admin=False, by="admin").token)
        node_token = identities.issue_node_token("gpu-1", label="test", by="admin").token
        self.node = {**_bearer(node_token), "X-Flexai-Agent-Id": AGENT_ID}
        registered = client.post("/v1/agent/nodes", headers=self.node, json={
            "name": "gpu-1", "accels": 2, "accel_type": "cpu", "agent_id": AGENT_ID})  # fmt: skip
        assert registered.status_code == 200, registered.text
        self.node_id = registered.json()["node_id"]

    def job(self, name: str, running: bool = True) -> dict[str, Any]:
        answer = self.client.post("/v1/jobs", headers=self.alice, json={**SPEC, "name": name})
        assert answer.status_code == 201, answer.text
        Scheduler(self.services.scheduling()).run_once()
        if running:
            job_id = answer.json()["id"]
            built = self.client.post(f"/v1/agent/jobs/{job_id}/reports", headers=self.node,
                                     json={"node_id": self.node_id, "type": "built"})  # fmt: skip
            assert built.json()["status"] == "in progress", built.text
        return dict(self.client.get(f"/v1/jobs/{name}", headers=self.alice).json())

    def closed(self, path: str) -> dict[str, Any]:
        """The session once the relay saw its end (it takes a moment after a disconnect)."""
        deadline = time.monotonic() + 10
        while True:
            answer = dict(self.client.get(path, headers=self.alice).json())
            if answer["state"] == "closed" or time.monotonic() > deadline:
                return answer
            time.sleep(0.05)

    def open(self, name: str, headers: dict[str, str], **body: Any) -> Any:
        return self.client.post(f"/v1/jobs/{name}/debug-sessions", headers=headers,
                                json={"public_key": PUBLIC_KEY, **body})  # fmt: skip


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[Api]:
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    services = build_services(settings)
    admin, _ = ensure_admin_token(services.identities, settings.data_dir)
    with TestClient(create_app(services, background=False)) as client:
        api = Api(client, services)
        api.admin = _bearer(admin)
        yield api
    services.close()


def test_another_users_job_is_not_found_and_a_finished_one_is_a_conflict(api: Api) -> None:
    api.job("alices-job")
    refused = api.open("alices-job", api.bob)
    assert refused.status_code == 404
    assert refused.json()["type"].endswith("/job-not-found")
    api.job("still-building", running=False)
    waiting = api.open("still-building", api.alice)
    assert waiting.status_code == 409
    problem = waiting.json()
    assert problem["type"].endswith("/job-not-running")
    assert problem["current_status"] == "building"
    assert "'building'" in problem["detail"]
    assert "wait until it is 'in progress'" in problem["detail"]
    assert api.open("alices-job", api.alice, node_index=3).status_code == 422
    assert api.open("alices-job", api.alice, public_key="ssh-rsa AAAA").status_code == 422


def test_the_relay_passes_bytes_both_ways_and_the_history_records_the_session(api: Api) -> None:
    job = api.job("relayed")
    opened = api.open("relayed", api.alice)
    assert opened.status_code == 201, opened.text
    session = opened.json()
    assert (session["state"], session["node"], session["node_index"]) == ("waiting", "gpu-1", 0)

    offers = api.client.get(f"/v1/agent/nodes/{api.node_id}/debug-sessions",
                            headers=api.node, params={"wait": 5}).json()  # fmt: skip
    assert offers["sessions"] == [{"id": session["id"], "job_id": job["id"], "node_index": 0,
                                   "public_key": PUBLIC_KEY}]  # fmt: skip
    path = f"/v1/jobs/relayed/debug-sessions/{session['id']}"
    with api.client.websocket_connect(f"/v1/agent/debug-sessions/{session['id']}",
                                      headers=api.node) as agent:  # fmt: skip
        agent.send_json({"host_key": HOST_KEY})
        ready = api.client.get(path, headers=api.alice, params={"wait": 5}).json()
        assert (ready["state"], ready["host_key"]) == ("ready", HOST_KEY)
        with pytest.raises(WebSocketDenialResponse) as denied, \
                api.client.websocket_connect(f"{path}/stream", headers=api.bob):
            pass
        assert denied.value.status_code == 404
        with api.client.websocket_connect(f"{path}/stream", headers=api.alice) as user:
            user.send_bytes(b"SSH-2.0-client\r\n")
            assert agent.receive_bytes() == b"SSH-2.0-client\r\n"
            agent.send_bytes(b"SSH-2.0-node\r\n")
            assert user.receive_bytes() == b"SSH-2.0-node\r\n"
        closed = api.closed(path)
    assert closed["state"] == "closed"
    # the test client may cancel the request as it leaves, before the disconnect is read
    assert closed["reason"] in ("the SSH client disconnected", "the connection broke")

    deadline = time.monotonic() + 10
    while True:  # the end is recorded just after the session closed
        inspected = api.client.get("/v1/jobs/relayed", headers=api.alice).json()
        seen = [entry["event"] for entry in inspected["history"]]
        if "DebugSessionClosed" in seen or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert inspected["status"] == "in progress"
    events = {entry["event"]: entry for entry in inspected["history"]}
    assert events["DebugSessionOpened"]["facts"]["session_id"] == session["id"]
    assert events["DebugSessionOpened"]["by"] == {"kind": "user", "id": "alice"}
    assert events["DebugSessionOpened"]["facts"]["node"] == "gpu-1"
    assert events["DebugSessionOpened"]["facts"]["relay"] == api.services.presence.instance_id
    assert events["DebugSessionClosed"]["facts"]["reason"] == closed["reason"]
    verified = api.client.post("/v1/admin/verify", headers=api.admin, json={}).json()
    assert verified["ok"], verified  # the chain and the views agree with the sessions' events


def test_a_session_the_node_refuses_ends_with_its_reason(api: Api) -> None:
    api.job("refused")
    session = api.open("refused", api.alice).json()
    with api.client.websocket_connect(f"/v1/agent/debug-sessions/{session['id']}",
                                      headers=api.node) as agent:  # fmt: skip
        agent.send_json({"refused": "the job is not running on this node"})
    answer = api.client.get(f"/v1/jobs/refused/debug-sessions/{session['id']}",
                            headers=api.alice, params={"wait": 5}).json()  # fmt: skip
    assert answer["state"] == "closed"
    assert "the job is not running on this node" in answer["reason"]


def test_a_stopping_server_answers_the_agents_offers_poll_and_ends_a_relay_with_its_reason(
    api: Api,
) -> None:
    api.job("stopping")
    session = api.open("stopping", api.alice).json()
    path = f"/v1/jobs/stopping/debug-sessions/{session['id']}"
    offers: Future[tuple[dict[str, Any], float]] = Future()

    def poll() -> None:
        started = time.monotonic()
        answer = api.client.get(f"/v1/agent/nodes/{api.node_id}/debug-sessions",
                                headers=api.node, params={"wait": 30})  # fmt: skip
        offers.set_result((answer.json(), time.monotonic() - started))

    with api.client.websocket_connect(f"/v1/agent/debug-sessions/{session['id']}",
                                      headers=api.node) as agent:  # fmt: skip
        agent.send_json({"host_key": HOST_KEY})
        ready = api.client.get(path, headers=api.alice, params={"wait": 5}).json()
        assert ready["state"] == "ready"
        with api.client.websocket_connect(f"{path}/stream", headers=api.alice) as user:
            user.send_bytes(b"SSH-2.0-client\r\n")
            assert agent.receive_bytes() == b"SSH-2.0-client\r\n"
            threading.Thread(target=poll, daemon=True).start()
            time.sleep(0.3)  # the poll is held by now: no session waits for the node
            assert not offers.done()
            assert api.client.portal is not None  # the event loop the requests run on
            api.client.portal.call(end_long_requests, api.services)  # what SIGTERM does
            body, took = offers.result(timeout=5)
            with pytest.raises(WebSocketDisconnect):
                user.receive_bytes()
    assert body == {"sessions": []}
    assert took < 2
    assert api.client.get(path, headers=api.alice).json()["reason"] == "the control plane stopped"
    api.client.portal.call(debug.settle)
    history = api.client.get("/v1/jobs/stopping", headers=api.alice).json()["history"]
    closed = [entry for entry in history if entry["event"] == "DebugSessionClosed"]
    assert [entry["facts"]["reason"] for entry in closed] == ["the control plane stopped"]
    assert closed[0]["by"] == {"kind": "scheduler", "id": "scheduler"}
