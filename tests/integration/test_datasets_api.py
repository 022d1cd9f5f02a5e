"""Datasets through the REST API (each store): push versions, list and inspect them, a job
pinned to the version it was submitted with, and the agent's download of that version only."""

from __future__ import annotations

import hashlib
import io
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.identity.identities import ensure_admin_token
from api.scheduling.scheduler import Scheduler
from api.services import Services, build_services
from api.settings import Limits, Settings
from tests.integration.test_api_problems import SPEC, assert_problem
from tests.support import node_headers

AGENT = "agent-0123456789abcdef"
OTHER_AGENT = "agent-fedcba9876543210"


def zip_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


class Api:
    def __init__(self, client: TestClient, services: Services, token: str) -> None:
        self.client = client
        self.services = services
        self.headers = {"Authorization": f"Bearer {token}"}
        self.node_headers = node_headers(services, "gpu-1")
        """Node gpu-1's token: the agent routes refuse users' tokens."""

    def push(self, name: str, data: bytes) -> Any:
        return self.client.put(f"/v1/datasets/{name}", headers=self.headers, content=data)

    def submit(self, name: str, datasets: list[str]) -> dict[str, Any]:
        answer = self.client.post("/v1/jobs", headers=self.headers,
                                  json={**SPEC, "name": name, "datasets": datasets})  # fmt: skip
        assert answer.status_code == 201, answer.text
        job: dict[str, Any] = answer.json()
        return job

    def assigned_job(self, datasets: list[str]) -> tuple[str, dict[str, str]]:
        """A job with ``datasets`` assigned to node gpu-1 (held by AGENT); its id and pins."""
        registered = self.client.post(
            "/v1/agent/nodes", headers={**self.node_headers, "X-Flexai-Agent-Id": AGENT},
            json={"name": "gpu-1", "accels": 2, "accel_type": "cpu", "agent_id": AGENT},
        )  # fmt: skip
        assert registered.status_code == 200, registered.text
        job = self.submit("reader", datasets)
        Scheduler(self.services.scheduling()).run_once()
        return job["id"], job["spec"].get("dataset_hashes") or {}

    def download(self, job_id: str, content_hash: str, agent_id: str = AGENT) -> Any:
        headers = {**self.node_headers, "X-Flexai-Agent-Id": agent_id}
        return self.client.get(f"/v1/agent/jobs/{job_id}/datasets/{content_hash}", headers=headers)


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[Api]:
    limits = Limits(upload_bytes=64 * 1024, archive_entries=50)
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url, limits=limits)
    services = build_services(settings)
    token, _ = ensure_admin_token(services.identities, settings.data_dir)
    with TestClient(create_app(services, background=False)) as client:
        yield Api(client, services, token)
    services.close()


FIRST = zip_of({"rows.csv": b"a,b\n", "sub/more.txt": b"more"})
SECOND = zip_of({"rows.csv": b"a,b\nc,d\n"})


def test_a_push_answers_the_dataset_with_its_hash_size_and_files(api: Api) -> None:
    answer = api.push("mnist", FIRST)
    assert answer.status_code == 200, answer.text
    dataset = answer.json()
    assert dataset["content_hash"] == hashlib.sha256(FIRST).hexdigest()
    assert (dataset["name"], dataset["version"], dataset["size"], dataset["files"]) == (
        "mnist", 1, 8, 2,
    )  # fmt: skip
    assert dataset["changed"] is True and dataset["pushed_by"] == "admin"
    listed = api.client.get("/v1/datasets", headers=api.headers).json()
    assert listed["count"] == 1
    assert listed["datasets"][0]["content_hash"] == dataset["content_hash"]


def test_pushing_again_makes_a_version_and_the_same_content_changes_nothing(api: Api) -> None:
    api.push("mnist", FIRST)
    again = api.push("mnist", FIRST).json()
    assert (again["version"], again["changed"]) == (1, False)
    second = api.push("mnist", SECOND).json()
    assert (second["version"], second["changed"]) == (2, True)
    detail = api.client.get("/v1/datasets/mnist", headers=api.headers).json()
    assert [version["content_hash"] for version in detail["versions"]] == [
        hashlib.sha256(SECOND).hexdigest(), hashlib.sha256(FIRST).hexdigest(),
    ]  # fmt: skip
    stored = api.services.artifacts.root / "datasets"
    assert sorted(path.name for path in stored.glob("*.zip")) == sorted(
        f"{hashlib.sha256(data).hexdigest()}.zip" for data in (FIRST, SECOND)
    )


def test_identical_content_under_two_names_is_stored_once(api: Api) -> None:
    api.push("mnist", FIRST)
    api.push("mnist-copy", FIRST)
    assert len(list((api.services.artifacts.root / "datasets").glob("*.zip"))) == 1
    assert api.client.get("/v1/datasets", headers=api.headers).json()["count"] == 2


def test_a_job_is_pinned_to_the_version_it_was_submitted_with(api: Api) -> None:
    api.push("mnist", FIRST)
    first = api.submit("first", ["mnist", "never-pushed"])
    api.push("mnist", SECOND)
    second = api.submit("second", ["mnist"])
    assert first["spec"]["dataset_hashes"] == {"mnist": hashlib.sha256(FIRST).hexdigest()}
    assert second["spec"]["dataset_hashes"] == {"mnist": hashlib.sha256(SECOND).hexdigest()}
    again = api.client.get("/v1/jobs/first", headers=api.headers).json()
    assert again["spec"]["dataset_hashes"] == first["spec"]["dataset_hashes"]


def test_a_dataset_given_twice_is_refused_naming_the_second(api: Api) -> None:
    api.push("mnist", FIRST)
    body = {**SPEC, "name": "twice", "datasets": ["mnist", "mnist"]}
    answer = api.client.post("/v1/jobs", headers=api.headers, json=body)
    body = assert_problem(answer, 422, "invalid-request")
    assert "datasets: [1] 'mnist' is given twice: give each dataset once" in body["detail"]
    assert api.client.get("/v1/jobs/twice", headers=api.headers).status_code == 404


def test_the_agent_of_the_jobs_node_downloads_the_pinned_version_and_nothing_else(
    api: Api,
) -> None:
    api.push("mnist", FIRST)
    api.push("other", SECOND)
    job_id, pins = api.assigned_job(["mnist"])
    answer = api.download(job_id, pins["mnist"])
    assert answer.status_code == 200 and answer.content == FIRST
    unpinned = api.download(job_id, hashlib.sha256(SECOND).hexdigest())
    assert "no dataset version" in assert_problem(unpinned, 404, "dataset-not-found")["detail"]
    assert_problem(api.download(job_id, pins["mnist"], OTHER_AGENT), 409, "wrong-node")
    as_user = api.client.get(f"/v1/agent/jobs/{job_id}/datasets/{pins['mnist']}",
                             headers={**api.headers, "X-Flexai-Agent-Id": AGENT})  # fmt: skip
    assert_problem(as_user, 403, "node-token-needed")
    assert_problem(api.download(job_id, "../../admin.token"), 404, "not-found")
    assert_problem(api.download(job_id, "A" * 64), 422, "invalid-request")


def test_a_version_gone_from_storage_is_a_404_that_says_to_push_it_again(api: Api) -> None:
    api.push("mnist", FIRST)
    job_id, pins = api.assigned_job(["mnist"])
    (api.services.artifacts.root / "datasets" / f"{pins['mnist']}.zip").unlink()
    body = assert_problem(api.download(job_id, pins["mnist"]), 404, "dataset-not-found")
    assert "flexai dataset push mnist PATH" in body["detail"]


def test_an_unknown_dataset_is_a_404_that_says_how_to_push_it(api: Api) -> None:
    body = assert_problem(api.client.get("/v1/datasets/nope", headers=api.headers), 404,
                          "dataset-not-found")  # fmt: skip
    assert "flexai dataset push nope PATH" in body["detail"]


def link_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        info = zipfile.ZipInfo("link")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(info, "/etc/passwd")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("data", "status", "said"),
    [
        (zip_of({"../escape": b"x"}), 422, "leaves the dataset"),
        (link_zip(), 422, "link"),
        (b"not a zip", 422, "not a zip"),
        (zip_of({f"f{i}": b"" for i in range(60)}), 413, "entries"),
    ],
)
def test_an_archive_that_is_unsafe_or_too_large_is_refused_and_not_recorded(
    api: Api, data: bytes, status: int, said: str
) -> None:
    body = assert_problem(api.push("mnist", data), status,
                          "invalid-request" if status == 422 else "payload-too-large")  # fmt: skip
    assert said in body["detail"]
    assert api.client.get("/v1/datasets", headers=api.headers).json()["count"] == 0
    stored = api.services.artifacts.root / "datasets"
    assert list(stored.glob("*.zip")) == [] and list(stored.glob("uploads/*")) == []


def test_a_bad_name_and_a_body_over_the_upload_limit_are_refused(api: Api) -> None:
    bad = assert_problem(api.push("-bad", FIRST), 422, "invalid-request")
    assert bad["field"] == "name" and "letters, digits" in bad["detail"]
    big = zip_of({"big.bin": bytes(range(256)) * 400})
    assert_problem(api.push("mnist", big), 413, "payload-too-large")

    def chunked() -> Iterator[bytes]:
        for _ in range(4):
            yield bytes(range(256)) * 100

    streamed = api.client.put("/v1/datasets/mnist", headers=api.headers, content=chunked())
    assert_problem(streamed, 413, "payload-too-large")
    assert api.client.get("/v1/datasets", headers=api.headers).json()["count"] == 0
