"""Secrets through the REST API (each store): a user creates, lists and deletes their own;
another user's are not found; a job carries names only, and the agent of its node gets the
values while the job builds or runs, and at no other time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.scheduling.scheduler import Scheduler
from api.services import Services, build_services
from api.settings import Settings
from tests.integration.test_api_problems import SPEC, assert_problem
from tests.integration.test_ledger_format import raw_states
from tests.support import node_headers, user_headers

AGENT = "agent-0123456789abcdef"
VALUE = "s3cr3t-V4lue-for-the-tests"


class Api:
    def __init__(self, client: TestClient, services: Services) -> None:
        self.client = client
        self.services = services
        self.alice = user_headers(services, "alice")
        self.bob = user_headers(services, "bob")

    def create(self, name: str, value: str = VALUE, headers: dict[str, str] | None = None
               ) -> Any:  # fmt: skip
        return self.client.post("/v1/secrets", headers=headers or self.alice,
                                json={"name": name, "value": value})  # fmt: skip

    def building_job(self, secrets: dict[str, str], name: str = "reader") -> str:
        """A job of alice's with ``secrets``, assigned to node gpu-1 (held by AGENT)."""
        self.node = node_headers(self.services, "gpu-1", AGENT)
        registered = self.client.post("/v1/agent/nodes", headers=self.node, json={
            "name": "gpu-1", "accels": 2, "accel_type": "cpu", "agent_id": AGENT})  # fmt: skip
        assert registered.status_code == 200, registered.text
        answer = self.client.post("/v1/jobs", headers=self.alice,
                                  json={**SPEC, "name": name, "secrets": secrets})  # fmt: skip
        assert answer.status_code == 201, answer.text
        Scheduler(self.services.scheduling()).run_once()
        job: dict[str, Any] = self.client.get(f"/v1/jobs/{name}", headers=self.alice).json()
        assert job["status"] == "building", job
        return str(job["id"])

    def job_secrets(self, job_id: str, headers: dict[str, str] | None = None) -> Any:
        return self.client.get(f"/v1/agent/jobs/{job_id}/secrets", headers=headers or self.node)


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[Api]:
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    services = build_services(settings)
    with TestClient(create_app(services, background=False)) as client:
        yield Api(client, services)
    services.close()


def test_a_created_secret_is_listed_by_name_and_dates_never_its_value(api: Api) -> None:
    created = api.create("hf-token")
    assert created.status_code == 201, created.text
    assert set(created.json()) == {"name", "created_at", "updated_at"}
    listed = api.client.get("/v1/secrets", headers=api.alice)
    assert listed.json()["count"] == 1 and listed.json()["secrets"][0]["name"] == "hf-token"
    assert VALUE not in created.text + listed.text


def test_creating_a_name_in_use_is_a_409_that_says_to_update_or_delete(api: Api) -> None:
    api.create("hf-token")
    body = assert_problem(api.create("hf-token", "another"), 409, "secret-exists")
    assert "flexai secret create hf-token --update" in body["detail"]
    assert "flexai secret delete hf-token" in body["detail"]
    replaced = api.client.put("/v1/secrets/hf-token", headers=api.alice, json={"value": "newer"})
    assert replaced.status_code == 200, replaced.text
    fresh = api.client.put("/v1/secrets/wandb", headers=api.alice, json={"value": "wandb-key"})
    assert fresh.status_code == 201, fresh.text


def test_another_users_secret_is_simply_not_found(api: Api) -> None:
    api.create("hf-token")
    assert api.client.get("/v1/secrets", headers=api.bob).json() == {"secrets": [], "count": 0}
    body = assert_problem(api.client.delete("/v1/secrets/hf-token", headers=api.bob), 404,
                          "secret-not-found")  # fmt: skip
    assert "flexai secret create hf-token" in body["detail"]
    assert api.create("hf-token", "bob's own", api.bob).status_code == 201
    deleted = api.client.delete("/v1/secrets/hf-token", headers=api.alice)
    assert deleted.status_code == 200 and deleted.json()["name"] == "hf-token"
    assert api.client.get("/v1/secrets", headers=api.bob).json()["count"] == 1


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "-bad", "value": "v"}, "name"),
    ({"name": "ok", "value": ""}, "value"),
    ({"name": "ok", "value": VALUE + "\x00"}, "value"),
    ({"name": "ok", "value": VALUE * 3000}, "value"),
    ({"name": "ok", "value": "abc"}, "at least 4"),
])  # fmt: skip
def test_a_bad_name_or_value_is_a_422_that_never_quotes_the_value(
    api: Api, body: dict[str, str], field: str
) -> None:
    answer = api.client.post("/v1/secrets", headers=api.alice, json=body)
    problem = assert_problem(answer, 422, "invalid-request")
    assert field in problem["detail"] and VALUE not in answer.text
    assert api.client.get("/v1/secrets", headers=api.alice).json()["count"] == 0


def test_a_job_carries_names_only_and_refuses_a_variable_also_given_with_env(api: Api) -> None:
    api.create("hf-token")
    job_id = api.building_job({"HF_TOKEN": "hf-token"})
    shown = api.client.get("/v1/jobs/reader", headers=api.alice)
    assert shown.json()["spec"]["secrets"] == {"HF_TOKEN": "hf-token"}
    audit = api.client.get(f"/v1/audit/jobs/{job_id}", headers=api.alice)
    assert audit.status_code == 200 and VALUE not in shown.text + audit.text
    both = api.client.post("/v1/jobs", headers=api.alice, json={
        **SPEC, "name": "both", "env": {"HF_TOKEN": "x"}, "secrets": {"HF_TOKEN": "hf-token"}})
    problem = assert_problem(both, 422, "invalid-request")
    assert "--env" in problem["detail"] and "--secret" in problem["detail"]


def test_the_agent_of_the_jobs_node_gets_the_owners_values_while_it_builds(api: Api) -> None:
    api.create("hf-token")
    api.create("hf-token", "bob's value", api.bob)
    job_id = api.building_job({"HF_TOKEN": "hf-token"})
    answer = api.job_secrets(job_id)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"secrets": {"HF_TOKEN": VALUE}}
    other = node_headers(api.services, "gpu-2", "agent-fedcba9876543210")
    refused = api.job_secrets(job_id, other)
    assert refused.status_code in (403, 404, 409) and VALUE not in refused.text
    assert api.job_secrets(job_id, api.alice).status_code == 403  # a user's token


def test_a_missing_secret_is_a_404_naming_it_and_a_finished_job_gets_nothing(api: Api) -> None:
    job_id = api.building_job({"HF_TOKEN": "hf-token"})
    body = assert_problem(api.job_secrets(job_id), 404, "secret-not-found")
    assert body["missing"] == ["hf-token"]
    assert "flexai secret create hf-token" in body["detail"]
    api.create("hf-token")
    report = {"node_id": api.services.queries.job(job_id)["node_id"], "type": "build_failed",
              "code": "secret_not_found", "message": "no secret 'hf-token'"}  # fmt: skip
    failed = api.client.post(f"/v1/agent/jobs/{job_id}/reports", headers=api.node, json=report)
    assert failed.status_code == 200, failed.text
    late = assert_problem(api.job_secrets(job_id), 409, "job-not-running")
    assert "'failed'" in late["detail"] and VALUE not in str(late)


def test_no_value_reaches_the_ledger_or_the_views(api: Api, database_url: str) -> None:
    api.create("hf-token")
    job_id = api.building_job({"HF_TOKEN": "hf-token"})
    assert api.job_secrets(job_id).status_code == 200
    states = raw_states(database_url)
    assert all(VALUE.encode() not in state for state in states)
    assert any(b"hf-token" in state for state in states)  # the name is there, plainly
    with api.services.database.transaction() as cursor:
        cursor.execute("SELECT * FROM job_list")
        assert VALUE not in repr(cursor.fetchall())
        cursor.execute("SELECT * FROM user_secrets")
        assert VALUE not in repr(cursor.fetchall())
