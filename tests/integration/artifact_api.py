"""The control plane's app on each artifact store (local files, an S3 bucket on SeaweedFS) and
each database, and what an agent and a user do with it: the ``api`` fixture of the artifact
route tests."""

from __future__ import annotations

import hashlib
import io
import os
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
from tests.s3 import REGION, SeaweedFS, s3_client
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

    def behind_the_servers_back(self, key: str, data: bytes | None) -> None:
        """Replace the object at ``key`` with ``data`` (None: delete it), straight in the
        store: the server is not told."""
        settings = self.services.settings
        location = settings.s3_location
        if location is None:
            path = settings.data_dir.joinpath("artifacts", *key.split("/"))
            if data is None:
                path.unlink()
            else:
                path.write_bytes(data)
            return
        assert location.endpoint_url is not None
        client, full = s3_client(location.endpoint_url), location.prefix + key
        if data is None:
            client.delete_object(Bucket=location.bucket, Key=full)
        else:
            client.put_object(Bucket=location.bucket, Key=full, Body=data)

    def stored_keys(self, prefix: str) -> list[str]:
        """The keys the store holds under ``prefix`` (files or objects), asked directly."""
        settings = self.services.settings
        location = settings.s3_location
        if location is None:
            root = settings.data_dir / "artifacts"
            return sorted(path.relative_to(root).as_posix()
                          for path in (root / prefix).rglob("*") if path.is_file())  # fmt: skip
        assert location.endpoint_url is not None
        listed = s3_client(location.endpoint_url).list_objects_v2(
            Bucket=location.bucket, Prefix=location.prefix + prefix)  # fmt: skip
        return sorted(item["Key"].removeprefix(location.prefix)
                      for item in listed.get("Contents", ()))  # fmt: skip

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
