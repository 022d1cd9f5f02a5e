"""Runtimes through the REST API (each store): admins make and delete them, every user lists
them; a job that names one has its image and registry secret pinned in its spec (the agent's
assignment carries them, whatever becomes of the runtime), one that names none or ``host``
runs as before, and an unknown one is a 422 naming those there are. The agent building the
job, and it alone, reads the registry's login (an admin's secret)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.scheduling.scheduler import Scheduler
from api.services import Services, build_services
from api.settings import Settings
from tests.integration.test_api_problems import SPEC, assert_problem
from tests.support import node_headers, user_headers

AGENT = "agent-0123456789abcdef"
IMAGE = "docker://nvcr.io/nvidia/pytorch:25.06-py3"
LOGIN = "$oauthtoken:nvapi-S3cr3t-for-the-tests"
DIGEST = "sha256:" + "0123456789abcdef" * 4


class Api:
    def __init__(self, client: TestClient, services: Services) -> None:
        self.client, self.services = client, services
        self.root = user_headers(services, "root", admin=True)
        self.alice = user_headers(services, "alice")

    def create(self, name: str, image: str = IMAGE, headers: dict[str, str] | None = None,
               **more: Any) -> Any:  # fmt: skip
        return self.client.post("/v1/admin/runtimes", headers=headers or self.root,
                                json={"name": name, "image": image, **more})  # fmt: skip

    def listed(self) -> list[dict[str, Any]]:
        answer = self.client.get("/v1/runtimes", headers=self.alice)
        assert answer.status_code == 200, answer.text
        runtimes: list[dict[str, Any]] = answer.json()["runtimes"]
        return runtimes

    def submit(self, name: str, **spec: Any) -> Any:
        return self.client.post("/v1/jobs", headers=self.alice, json={**SPEC, "name": name, **spec})

    def assigned(self, name: str, **spec: Any) -> dict[str, Any]:
        """Alice's job ``name`` submitted and assigned to gpu-1: its assignment."""
        self.node = node_headers(self.services, "gpu-1", AGENT)
        registered = self.client.post("/v1/agent/nodes", headers=self.node, json={
            "name": "gpu-1", "accels": 2, "accel_type": "cpu", "agent_id": AGENT})  # fmt: skip
        assert registered.status_code == 200, registered.text
        submitted = self.submit(name, **spec)
        assert submitted.status_code == 201, submitted.text
        Scheduler(self.services.scheduling()).run_once()
        node_id = registered.json()["node_id"]
        polled = self.client.get(f"/v1/agent/nodes/{node_id}/assignments", headers=self.node)
        assert polled.status_code == 200, polled.text
        found: dict[str, Any] = next(item for item in polled.json()["assignments"]
                                     if item["name"] == name)  # fmt: skip
        return found

    def credentials(self, job_id: str, headers: dict[str, str] | None = None) -> Any:
        return self.client.get(f"/v1/agent/jobs/{job_id}/registry-credentials",
                               headers=headers or self.node)  # fmt: skip


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[Api]:
    services = build_services(Settings(data_dir=tmp_path / "data", database_url=database_url))
    with TestClient(create_app(services, background=False)) as client:
        yield Api(client, services)
    services.close()


def test_an_admins_runtime_is_listed_to_every_user_until_it_is_deleted(api: Api) -> None:
    made = api.create("nvidia-25.06", "nvcr.io/nvidia/pytorch:25.06-py3")
    assert made.status_code == 201, made.text
    assert made.json()["image"] == IMAGE  # docker:// written out
    [listed] = api.listed()
    assert (listed["name"], listed["image"]) == ("nvidia-25.06", IMAGE)
    assert listed["created_by"] == "root"
    assert (listed["digest"], listed["nodes"], listed["registry_secret"]) == (None, [], None)
    again = assert_problem(api.create("nvidia-25.06"), 409, "runtime-exists")
    assert "flexai admin runtime delete nvidia-25.06" in again["detail"]
    deleted = api.client.delete("/v1/admin/runtimes/nvidia-25.06", headers=api.root)
    assert deleted.status_code == 200 and deleted.json()["name"] == "nvidia-25.06"
    assert api.listed() == []
    gone = api.client.delete("/v1/admin/runtimes/nvidia-25.06", headers=api.root)
    assert_problem(gone, 404, "runtime-not-found")


def test_only_an_admin_makes_or_deletes_a_runtime(api: Api) -> None:
    assert_problem(api.create("mine", headers=api.alice), 403, "admin-only")
    api.create("nvidia-25.06")
    refused = api.client.delete("/v1/admin/runtimes/nvidia-25.06", headers=api.alice)
    assert_problem(refused, 403, "admin-only")
    assert [runtime["name"] for runtime in api.listed()] == ["nvidia-25.06"]


@pytest.mark.parametrize(("body", "said"), [
    ({"name": "ubuntu", "image": "ubuntu:24.04"}, "the registry's host is needed"),
    ({"name": "x", "image": "oci:///images/x"}, "another transport"),
    ({"name": "bad name", "image": IMAGE}, "letters, digits"),
    ({"name": "x", "image": IMAGE, "registry_secret": "-no"}, "registry_secret"),
])  # fmt: skip
def test_an_image_or_name_out_of_form_is_a_422_saying_the_form(
    api: Api, body: dict[str, str], said: str
) -> None:
    answer = api.client.post("/v1/admin/runtimes", headers=api.root, json=body)
    assert said in assert_problem(answer, 422, "invalid-request")["detail"]
    assert api.listed() == []


def test_a_registry_secret_must_be_the_admins_own_login(api: Api) -> None:
    missing = assert_problem(api.create("ngc", registry_secret="ngc-login"), 422,
                             "registry-secret-not-found")  # fmt: skip
    assert "flexai secret create ngc-login" in missing["detail"]
    api.client.post("/v1/secrets", headers=api.root, json={"name": "token", "value": "no-colon"})
    bad = assert_problem(api.create("ngc", registry_secret="token"), 422,
                         "registry-secret-not-a-login")  # fmt: skip
    assert "USER:PASSWORD" in bad["detail"] and "no-colon" not in bad["detail"]
    api.client.post("/v1/secrets", headers=api.root, json={"name": "ngc-login", "value": LOGIN})
    made = api.create("ngc", registry_secret="ngc-login")
    assert made.status_code == 201, made.text
    assert (made.json()["registry_secret"], made.json()["registry_secret_owner"]) == (
        "ngc-login", "root")
    assert LOGIN not in made.text + str(api.listed())


def test_an_unknown_runtime_is_a_422_naming_those_there_are(api: Api) -> None:
    none = assert_problem(api.submit("first", runtime="nvidia-25.06"), 422, "runtime-not-found")
    assert "flexai admin runtime create" in none["detail"] and none["field"] == "runtime"
    api.create("nvidia-25.06")
    api.create("rocm-6")
    body = assert_problem(api.submit("second", runtime="cuda-12"), 422, "runtime-not-found")
    assert "'cuda-12'" in body["detail"]
    assert "nvidia-25.06, rocm-6" in body["detail"] and "flexai runtime list" in body["detail"]


def test_a_jobs_runtime_image_and_secret_are_pinned_in_its_assignment(api: Api) -> None:
    api.client.post("/v1/secrets", headers=api.root, json={"name": "ngc-login", "value": LOGIN})
    api.create("nvidia-25.06", registry_secret="ngc-login")
    assignment = api.assigned("trainer", runtime="nvidia-25.06")
    spec = assignment["spec"]
    assert spec["runtime"] == "nvidia-25.06" and spec["runtime_image"] == IMAGE
    assert (spec["registry_secret"], spec["registry_secret_owner"]) == ("ngc-login", "root")
    api.client.delete("/v1/admin/runtimes/nvidia-25.06", headers=api.root)
    shown = api.client.get("/v1/jobs/trainer", headers=api.alice).json()
    assert shown["spec"]["runtime_image"] == IMAGE  # the runtime gone, the job keeps its image
    login = api.credentials(assignment["job_id"])
    assert login.status_code == 200, login.text
    assert login.json() == {"image": IMAGE, "username": "$oauthtoken",
                            "password": "nvapi-S3cr3t-for-the-tests"}  # fmt: skip
    assert api.credentials(assignment["job_id"], api.alice).status_code == 403
    other = node_headers(api.services, "gpu-2", "agent-fedcba9876543210")
    refused = api.credentials(assignment["job_id"], other)
    assert refused.status_code in (403, 404, 409) and LOGIN not in refused.text


def test_a_job_without_a_runtime_or_with_host_keeps_the_shape_of_its_spec(api: Api) -> None:
    plain = api.assigned("plain")
    assert not {"runtime", "runtime_image", "registry_secret"} & set(plain["spec"])
    hosted = api.submit("hosted", runtime="host")
    assert hosted.status_code == 201, hosted.text
    shown = api.client.get("/v1/jobs/hosted", headers=api.alice).json()
    assert "runtime_image" not in shown["spec"] and "runtime" not in shown["spec"]
    assert_problem(api.credentials(plain["job_id"]), 404, "no-registry-secret")


def test_the_digest_the_node_built_in_is_recorded_and_shown_with_the_job(api: Api) -> None:
    api.create("nvidia-25.06")
    assignment = api.assigned("trainer", runtime="nvidia-25.06")
    node_id = api.services.queries.job(assignment["job_id"])["node_id"]
    report = {"node_id": node_id, "type": "built", "commit": "c0ffee"}
    path = f"/v1/agent/jobs/{assignment['job_id']}/reports"
    bad = api.client.post(path, headers=api.node, json={**report, "image_digest": "sha256:xyz"})
    assert_problem(bad, 422, "invalid-request")
    built = api.client.post(path, headers=api.node, json={**report, "image_digest": DIGEST})
    assert built.status_code == 200, built.text
    shown = api.client.get("/v1/jobs/trainer", headers=api.alice).json()
    assert shown["image_digest"] == DIGEST and shown["placements"][0]["image_digest"] == DIGEST
    [entry] = [entry for entry in shown["history"] if entry["event"] == "Built"]
    assert entry["facts"]["image_digest"] == DIGEST
    assert api.services.jobs.job(UUID(assignment["job_id"])).status == "in progress"


def test_a_built_report_without_a_digest_records_none(api: Api) -> None:
    assignment = api.assigned("plain")
    node_id = api.services.queries.job(assignment["job_id"])["node_id"]
    built = api.client.post(f"/v1/agent/jobs/{assignment['job_id']}/reports", headers=api.node,
                            json={"node_id": node_id, "type": "built", "commit": "c0ffee"})
    assert built.status_code == 200, built.text
    [event] = [event for event in api.services.jobs.history(UUID(assignment["job_id"]))
               if type(event).__name__ == "Built"]  # fmt: skip
    assert event.image_digest is None
    assert api.client.get("/v1/jobs/plain", headers=api.alice).json()["image_digest"] is None
