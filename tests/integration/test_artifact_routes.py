"""The artifact routes on every store (local files, an S3 bucket on SeaweedFS) and database: an
agent's upload session, its parts and its completion record a checkpoint or an output with its
size and SHA-256, once; downloads say what the bytes must be, from the store or the server."""

from __future__ import annotations

import hashlib
import io
import os
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.identity.identities import ensure_admin_token
from api.services import Services, build_services
from api.settings import Settings
from domain.datasets import Dataset
from tests.integration.test_api_problems import assert_problem
from tests.s3 import REGION, SeaweedFS
from tests.support import node_headers, send_archive

AGENT = "artifact-agent-0123456789"
SPEC = {"repository_url": "https://example.com/org/repo.git", "entry_point": ["train.py"]}


def zip_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


CHECKPOINT = zip_of({"model.safetensors": os.urandom(200_000),
                     "trainer_state.json": b'{"global_step": 7}'})  # fmt: skip
OUTPUT = zip_of({"weights.bin": os.urandom(300_000), "eval.json": b'{"accuracy": 0.9}'})


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Api:
    client: TestClient
    services: Services
    user: dict[str, str]
    agent: dict[str, str]
    node_id: str = ""

    def running_job(self, name: str = "trainer") -> str:
        """A job of the admin's, started on node gpu-1 (held by AGENT)."""
        self.node_id = self.client.post("/v1/agent/nodes", headers=self.agent, json={
            "name": "gpu-1", "accels": 2, "agent_id": AGENT}).json()["node_id"]  # fmt: skip
        job_id = self.client.post("/v1/jobs", headers=self.user,
                                  json={**SPEC, "name": name}).json()["id"]  # fmt: skip
        self.services.jobs.begin_scheduling(UUID(job_id))
        placed = self.services.jobs.assign(UUID(job_id), self.node_id, "gpu-1")
        self.services.projector.wait(placed.position)
        self.report(job_id, "built", commit="c0ffee")
        return job_id

    def report(self, job_id: str, kind: str, **facts: Any) -> None:
        answer = self.client.post(f"/v1/agent/jobs/{job_id}/reports", headers=self.agent,
                                  json={"node_id": self.node_id, "type": kind, **facts})
        assert answer.status_code == 200, answer.text

    def send(self, job_id: str, data: bytes, name: str | None = None) -> Any:
        return send_archive(self.client, self.agent, job_id, self.node_id, data, name=name)

    def begin(self, job_id: str, name: str | None = None) -> Any:
        return self.client.post(f"/v1/agent/jobs/{job_id}/uploads", headers=self.agent, json={
            "kind": "output" if name is None else "checkpoint", "name": name,
            "node_id": self.node_id, "node_index": 0})  # fmt: skip

    def events(self, job_id: str) -> list[str]:
        return [type(event).__name__ for event in self.services.jobs.history(UUID(job_id))]

    def download(self, path: str, headers: dict[str, str]) -> httpx.Response:
        """The route's answer, and the store's when it redirects there (without the token)."""
        answer = self.client.get(path, headers=headers, follow_redirects=False)
        if answer.status_code != 307:
            return answer
        fetched = httpx.get(answer.headers["location"])
        fetched.headers.update({k: v for k, v in answer.headers.items() if k.startswith("x-")})
        return fetched


@pytest.fixture(params=["local", "s3"])
def store_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "local":
        return {}
    server: SeaweedFS = request.getfixturevalue("s3_server")
    bucket: str = request.getfixturevalue("s3_bucket")
    return {"artifact_store": f"s3://{bucket}/routes", "s3_endpoint_url": server.endpoint_url,
            "s3_region": REGION}  # fmt: skip


@pytest.fixture
def api(database_url: str, tmp_path: Path, store_settings: dict[str, Any]) -> Iterator[Api]:
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url, **store_settings)
    services = build_services(settings)
    token, _ = ensure_admin_token(services.identities, settings.data_dir)
    with TestClient(create_app(services, background=False)) as client:
        yield Api(client, services, {"Authorization": f"Bearer {token}"},
                  node_headers(services, "gpu-1", AGENT))  # fmt: skip
    services.close()


def test_a_checkpoint_sent_in_parts_is_recorded_with_its_archive_size_and_sha256(api: Api) -> None:
    job_id = api.running_job()

    answer = api.send(job_id, CHECKPOINT, name="checkpoint-7")

    assert answer.status_code == 200, answer.text
    recorded = answer.json()
    assert (recorded["name"], recorded["step"]) == ("checkpoint-7", 7)
    assert (recorded["archive_size"], recorded["sha256"]) == (len(CHECKPOINT), sha256(CHECKPOINT))
    listed = api.client.get("/v1/jobs/trainer/checkpoints", headers=api.user).json()
    assert listed["checkpoints"] == [recorded]


def test_an_upload_completed_again_or_begun_again_records_nothing_more(api: Api) -> None:
    job_id = api.running_job()
    first = api.send(job_id, CHECKPOINT, name="checkpoint-7")
    events = api.events(job_id)
    with api.services.database.transaction() as cursor:
        cursor.execute("SELECT id FROM artifact_uploads WHERE answer IS NOT NULL")
        completed = cursor.fetchone()
    assert completed is not None

    again = api.client.post(f"/v1/agent/uploads/{completed['id']}/complete", headers=api.agent,
                            json={"parts": [{"number": 1, "etag": "whatever"}],
                                  "size": len(CHECKPOINT), "sha256": sha256(CHECKPOINT)})
    begun = api.begin(job_id, name="checkpoint-7")  # an agent restarted after it went through

    assert again.status_code == 200 and again.json() == first.json()
    assert begun.status_code == 200
    assert begun.json() == {"id": None, "part_size": None, "recorded": first.json()}
    assert api.events(job_id) == events


def test_an_output_is_recorded_once_and_fetched_with_its_size_and_sha256(api: Api) -> None:
    job_id = api.running_job()
    answer = api.send(job_id, OUTPUT)
    api.report(job_id, "exited", exit_code=0)
    resent = api.send(job_id, OUTPUT)  # begun again: answered from the ledger

    assert answer.json() == {"node_index": 0, "size": len(OUTPUT), "sha256": sha256(OUTPUT)}
    assert resent.json()["recorded"] == answer.json()
    assert api.events(job_id).count("OutputsRecorded") == 1
    job = api.client.get("/v1/jobs/trainer", headers=api.user).json()
    assert [{k: v for k, v in o.items() if k != "at"} for o in job["outputs"]] == [answer.json()]
    answered = api.client.get("/v1/jobs/trainer/outputs/0", headers=api.user,
                              follow_redirects=False)  # fmt: skip
    fetched = api.download("/v1/jobs/trainer/outputs/0", api.user)
    assert answered.status_code == (307 if api.services.artifacts.kind == "s3" else 200)
    assert fetched.status_code == 200 and fetched.content == OUTPUT
    assert fetched.headers["x-flexai-size"] == str(len(OUTPUT))
    assert fetched.headers["x-flexai-sha256"] == sha256(OUTPUT)


def test_a_store_that_gives_the_bytes_itself_answers_a_range_from_the_byte_reached(
    api: Api,
) -> None:
    job_id = api.running_job()
    api.send(job_id, OUTPUT)
    path = "/v1/jobs/trainer/outputs/0"
    first = api.client.get(path, headers=api.user, follow_redirects=False)
    if first.status_code == 307:
        rest = httpx.get(first.headers["location"], headers={"Range": "bytes=1000-"})
    else:
        rest = api.client.get(path, headers={**api.user, "Range": "bytes=1000-"})
    assert rest.status_code == 206 and rest.content == OUTPUT[1000:]


def test_an_ended_job_without_output_gives_the_empty_archive_with_its_hash(api: Api) -> None:
    job_id = api.running_job()
    api.report(job_id, "exited", exit_code=0)

    fetched = api.client.get("/v1/jobs/trainer/outputs/0", headers=api.user)

    assert fetched.status_code == 200
    assert zipfile.ZipFile(io.BytesIO(fetched.content)).namelist() == []
    assert fetched.headers["x-flexai-sha256"] == sha256(fetched.content)


def test_an_agent_restarted_mid_upload_begins_again_and_the_old_upload_is_gone(
    api: Api,
) -> None:
    job_id = api.running_job()
    old = api.begin(job_id).json()["id"]

    answer = api.send(job_id, OUTPUT)  # the restarted agent's new upload
    late = api.client.post(f"/v1/agent/uploads/{old}/parts", headers=api.agent,
                           json={"numbers": [1]})  # fmt: skip

    assert answer.status_code == 200, answer.text
    assert_problem(late, 404, "upload-not-found")


def test_parts_short_of_the_archive_are_refused_and_nothing_is_recorded(api: Api) -> None:
    job_id = api.running_job()
    upload_id = api.begin(job_id).json()["id"]
    target = api.client.post(f"/v1/agent/uploads/{upload_id}/parts", headers=api.agent,
                             json={"numbers": [1]}).json()["parts"][0]  # fmt: skip
    half = OUTPUT[: len(OUTPUT) // 2]
    if target["url"].startswith("/"):
        etag = api.client.put(target["url"], headers=api.agent, content=half).json()["etag"]
    else:
        etag = httpx.put(target["url"], content=half).headers["etag"]

    answer = api.client.post(f"/v1/agent/uploads/{upload_id}/complete", headers=api.agent,
                             json={"parts": [{"number": 1, "etag": etag}], "size": len(OUTPUT),
                                   "sha256": sha256(OUTPUT)})  # fmt: skip

    assert "not the" in assert_problem(answer, 409, "upload-incomplete")["detail"]
    assert "OutputsRecorded" not in api.events(job_id)
    assert api.client.get("/v1/jobs/trainer/outputs/0", headers=api.user).status_code == 404


def test_a_checkpoint_of_a_job_that_ended_is_refused_before_a_byte_is_sent(api: Api) -> None:
    job_id = api.running_job()
    api.report(job_id, "exited", exit_code=0)

    refused = api.begin(job_id, name="checkpoint-9")

    assert "checkpoints are taken only while it runs" in assert_problem(
        refused, 409, "conflict")["detail"]  # fmt: skip


def test_an_input_checkpoint_comes_with_its_size_and_sha256(api: Api) -> None:
    job_id = api.running_job("first")
    checkpoint = api.send(job_id, CHECKPOINT, name="checkpoint-7").json()
    api.report(job_id, "exited", exit_code=0)
    api.client.post("/v1/jobs", headers=api.user,
                    json={**SPEC, "name": "second", "checkpoint": "checkpoint-7"})  # fmt: skip
    second = api.client.get("/v1/jobs/second", headers=api.user).json()["id"]
    api.services.jobs.begin_scheduling(UUID(second))
    placed = api.services.jobs.assign(UUID(second), api.node_id, "gpu-1")
    api.services.projector.wait(placed.position)

    fetched = api.download(f"/v1/agent/checkpoints/{checkpoint['id']}", api.agent)

    assert fetched.status_code == 200 and fetched.content == CHECKPOINT
    assert fetched.headers["x-flexai-sha256"] == sha256(CHECKPOINT)


def test_a_pushed_dataset_records_its_archive_size_and_comes_with_its_hash(api: Api) -> None:
    pushed = api.client.put("/v1/datasets/rows", headers=api.user, content=OUTPUT)
    assert pushed.status_code == 200, pushed.text
    content_hash = pushed.json()["content_hash"]
    dataset = api.services.jobs.repository.get(Dataset.create_id("admin", "rows"))
    api.running_job()  # node gpu-1, held by the agent
    api.client.post("/v1/jobs", headers=api.user,
                    json={**SPEC, "name": "reader", "datasets": ["rows"]})  # fmt: skip
    reader = api.client.get("/v1/jobs/reader", headers=api.user).json()["id"]
    api.services.jobs.begin_scheduling(UUID(reader))
    placed = api.services.jobs.assign(UUID(reader), api.node_id, "gpu-1")
    api.services.projector.wait(placed.position)

    fetched = api.download(f"/v1/agent/jobs/{reader}/datasets/{content_hash}", api.agent)

    assert content_hash == sha256(OUTPUT)
    assert dataset.latest["archive_size"] == len(OUTPUT)
    assert fetched.status_code == 200 and fetched.content == OUTPUT
    assert fetched.headers["x-flexai-sha256"] == content_hash


@pytest.mark.parametrize("store_settings", ["s3"], indirect=True)
def test_a_download_while_the_store_is_away_is_a_quick_503_with_retry_after(
    api: Api, s3_server: SeaweedFS
) -> None:
    job_id = api.running_job()
    api.send(job_id, OUTPUT)

    with s3_server.stopped():
        started = time.monotonic()
        answer = api.client.get("/v1/jobs/trainer/outputs/0", headers=api.user,
                                follow_redirects=False)  # fmt: skip
        took = time.monotonic() - started

    assert_problem(answer, 503, "storage-unavailable")
    assert answer.headers["retry-after"] and took < 5
