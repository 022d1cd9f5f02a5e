"""The debug session routes (each store): who may open one, when, and the relay between the
user's WebSocket and the agent's, recorded in the job's history."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from api.app import create_app
from api.scheduler import Scheduler
from api.services import Services, build_services
from api.settings import Settings
from api.state import ensure_admin_token

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
        Scheduler(self.services).run_once()
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
