"""Property: whatever values a client sends, the API answers a problem or stores them, and
nothing it stores can stop the views (each store)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.http.app import create_app
from api.identity.identities import ensure_admin_token
from api.services import Services, build_services
from api.settings import Settings
from tests.support import node_headers, send_archive

AGENT = {"X-Flexai-Agent-Id": "fuzz-agent-0123456789"}
ACCEPTED = {200, 201, 404, 409, 413, 422}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)  # fmt: skip
hostile_text = st.text(
    alphabet=st.characters(codec="utf-8") | st.sampled_from("\x00\x1b\n\t\u2028\ud800"),
    max_size=80,
)
hostile_int = st.integers() | st.sampled_from([2**63, -(2**63) - 1, 2**64, 2**70])
field_values = json_values | hostile_text | hostile_int

SPEC_FIELDS = ["repository_url", "repository_revision", "requirements_path", "accels", "nodes",
               "env", "secrets", "datasets", "checkpoint", "entry_point"]  # fmt: skip
REPORT_FIELDS = ["commit", "master_port", "node_index", "exit_code", "code", "message",
                 "offset", "written"]
REPORT_TYPES = ["built", "build_failed", "exited", "failed", "stopped",
                "stop_failed", "logs_unavailable"]  # fmt: skip


class Fixture:
    def __init__(self, client: TestClient, services: Services, token: str) -> None:
        self.client = client
        self.services = services
        self.headers = {"Authorization": f"Bearer {token}"}
        self.agent_headers = {**node_headers(services, "fuzz-node"), **AGENT}
        """fuzz-node's agent's: the agent routes take its node token, not a user's."""
        node = client.post("/v1/agent/nodes", headers=self.agent_headers, json={
            "name": "fuzz-node", "accels": 8, "accel_type": "cpu", "agent_id": AGENT[
                "X-Flexai-Agent-Id"],
        }).json()  # fmt: skip
        self.node_id = node["node_id"]
        job = client.post("/v1/jobs", headers=self.headers, json={
            "name": "target", "repository_url": "/r", "entry_point": ["t.py"], "accels": 2,
        }).json()  # fmt: skip
        self.job_id = job["id"]
        services.jobs.begin_scheduling(UUID(self.job_id))
        placed = services.jobs.assign(UUID(self.job_id), self.node_id, "fuzz-node")
        services.projector.wait(placed.position)  # the node's token reaches placed jobs only

    def assert_views_run(self) -> None:
        self.services.projector.catch_up()
        assert self.services.projector.halted is None
        assert self.client.get("/health").json()["ok"] is True


@pytest.fixture
def fuzz(database_url: str, tmp_path: Path) -> Iterator[Fixture]:
    config = Settings(data_dir=tmp_path / "data", database_url=database_url)
    services = build_services(config)
    token, _ = ensure_admin_token(services.identities, config.data_dir)
    with TestClient(create_app(services, background=False), raise_server_exceptions=False) as c:
        yield Fixture(c, services, token)
    services.close()


FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])  # fmt: skip


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(SPEC_FIELDS), field_values, min_size=1,
                               max_size=3),
       name=st.text(max_size=70) | st.just("fuzzed-job"))  # fmt: skip
def test_any_job_submission_is_stored_or_refused_and_the_views_keep_running(
    fuzz: Fixture, changes: dict[str, Any], name: str
) -> None:
    body = {"name": name, "repository_url": "/r", "entry_point": ["t.py"], **changes}
    response = fuzz.client.post("/v1/jobs", headers=fuzz.headers, json=body)
    assert response.status_code in ACCEPTED, response.text
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith("application/problem+json")
    if response.status_code == 201:
        fuzz.client.post(f"/v1/jobs/{response.json()['name']}/stop", headers=fuzz.headers)
        fuzz.client.delete(f"/v1/jobs/{response.json()['name']}", headers=fuzz.headers)
    fuzz.assert_views_run()


@FUZZ
@given(kind=st.sampled_from(REPORT_TYPES),
       facts=st.dictionaries(st.sampled_from(REPORT_FIELDS), field_values, max_size=4),
       checkpoint=hostile_text.filter(bool))  # fmt: skip
def test_any_agent_report_or_checkpoint_name_is_recorded_or_refused_and_the_views_keep_running(
    fuzz: Fixture, kind: str, facts: dict[str, Any], checkpoint: str
) -> None:
    report = {"node_id": fuzz.node_id, "type": kind, **facts}
    response = fuzz.client.post(f"/v1/agent/jobs/{fuzz.job_id}/reports",
                                headers=fuzz.agent_headers, json=report)  # fmt: skip
    assert response.status_code in ACCEPTED, response.text
    uploaded = send_archive(fuzz.client, fuzz.agent_headers, fuzz.job_id, fuzz.node_id,
                            b"PK", name=checkpoint)  # fmt: skip
    assert uploaded.status_code in ACCEPTED, uploaded.text
    fuzz.assert_views_run()
