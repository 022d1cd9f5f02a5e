"""Placement knows images (each store): agents' heartbeats say which images their nodes hold,
the runtimes' list shows each one's digest and the live nodes holding it, the scheduler
prefers a node that holds a job's image, and ``inspect`` of a job building where its image is
not yet says it is pulled there."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.scheduling.scheduler import Scheduler
from api.services import Services, build_services
from api.settings import Settings
from tests.support import node_headers, user_headers

IMAGE = "docker://registry.example.com/team/train:1"
DIGEST = "sha256:" + "ab" * 32


def held(*images: tuple[str, str]) -> dict[str, Any]:
    return {"images": [{"reference": ref, "digest": digest} for ref, digest in images]}


class Api:
    def __init__(self, client: TestClient, services: Services) -> None:
        self.client, self.services = client, services
        self.root = user_headers(services, "root", admin=True)
        self.alice = user_headers(services, "alice")
        self.nodes: dict[str, tuple[str, dict[str, str]]] = {}

    def register(self, name: str, accels: int = 2) -> str:
        agent = f"agent-{name.encode().hex():0<16}"
        headers = node_headers(self.services, name, agent)
        registered = self.client.post("/v1/agent/nodes", headers=headers, json={
            "name": name, "accels": accels, "accel_type": "cpu", "agent_id": agent})  # fmt: skip
        assert registered.status_code == 200, registered.text
        node_id = str(registered.json()["node_id"])
        self.nodes[name] = node_id, headers
        return node_id

    def beat(self, name: str, body: dict[str, Any] | None = None) -> None:
        node_id, headers = self.nodes[name]
        beat = self.client.post(f"/v1/agent/nodes/{node_id}/heartbeat", headers=headers,
                                json=body if body is not None else {})  # fmt: skip
        assert beat.status_code == 200, beat.text


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[Api]:
    services = build_services(Settings(data_dir=tmp_path / "data", database_url=database_url))
    with TestClient(create_app(services, background=False)) as client:
        yield Api(client, services)
    services.close()


def test_a_heartbeat_keeps_the_images_a_node_last_said_it_holds_until_it_leaves(api: Api) -> None:
    node_id = api.register("gpu-1")
    api.beat("gpu-1", held(("registry.example.com/team/train:1", DIGEST),
                           ("docker://docker.io/ubuntu", DIGEST.replace("ab", "cd")),
                           ("no image at all", DIGEST), ("docker://r.io/x:1", "md5:1")))
    ubuntu = "docker://docker.io/library/ubuntu:latest"
    images = {IMAGE: DIGEST, ubuntu: DIGEST.replace("ab", "cd")}
    assert api.services.state.images() == {node_id: images}
    api.beat("gpu-1")  # nothing changed: nothing said
    assert api.services.state.images() == {node_id: images}
    api.beat("gpu-1", held())
    assert api.services.state.images() == {node_id: {}}
    api.beat("gpu-1", held((IMAGE, DIGEST)))
    _, headers = api.nodes["gpu-1"]
    left = api.client.post(f"/v1/agent/nodes/{node_id}/leave", headers=headers, json={})
    assert left.status_code == 200, left.text
    assert api.services.state.images() == {}


def runtime(api: Api) -> None:
    api.services.runtimes.create("trainer", IMAGE, None, by="root")


def submitted(api: Api, name: str, **spec: Any) -> str:
    answer = api.client.post("/v1/jobs", headers=api.alice, json={
        "repository_url": "/nowhere", "entry_point": ["train.py"], "name": name, **spec})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def node_of(api: Api, job_id: str) -> str:
    api.services.projector.catch_up()
    document = api.services.queries.job(job_id)
    assert document is not None
    return str(document["placements"][0]["node"])


def test_the_scheduler_places_a_job_on_a_node_holding_its_image_and_others_as_before(
    api: Api,
) -> None:
    runtime(api)
    for name in ("gpu-a", "gpu-b"):
        api.register(name)
    api.beat("gpu-b", held((IMAGE, DIGEST)))
    pulled = submitted(api, "pulled", runtime="trainer")
    Scheduler(api.services.scheduling()).run_once()
    plain = submitted(api, "plain")
    Scheduler(api.services.scheduling()).run_once()
    assert (node_of(api, pulled), node_of(api, plain)) == ("gpu-b", "gpu-a")


def test_the_runtimes_list_shows_the_digest_said_last_and_the_live_nodes_holding_it(
    api: Api,
) -> None:
    runtime(api)
    newer = DIGEST.replace("ab", "ef")
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        api.register(name)
    api.beat("gpu-c", held(("registry.example.com/team/other:2", DIGEST)))

    def listed() -> tuple[Any, Any]:
        answer = api.client.get("/v1/runtimes", headers=api.alice)
        assert answer.status_code == 200, answer.text
        [trainer] = answer.json()["runtimes"]
        return trainer["digest"], trainer["nodes"]

    assert listed() == (None, [])
    api.beat("gpu-b", held((IMAGE, DIGEST)))
    time.sleep(0.01)  # the next says so later
    api.beat("gpu-a", held(("registry.example.com/team/train:1", newer)))
    assert listed() == (newer, ["gpu-a", "gpu-b"])
    silent, _ = api.nodes["gpu-a"]
    with api.services.database.transaction(write=True) as cursor:
        cursor.execute("UPDATE node_heartbeats SET last_seen = ? WHERE node_id = ?",
                       ("2000-01-01T00:00:00+00:00", silent))  # fmt: skip
    assert listed() == (newer, ["gpu-b"])


def test_inspect_of_a_job_building_where_its_image_is_not_yet_says_it_is_pulled_there(
    api: Api,
) -> None:
    runtime(api)
    api.register("gpu-a")
    submitted(api, "pulled", runtime="trainer")
    Scheduler(api.services.scheduling()).run_once()
    api.services.projector.catch_up()

    def inspected() -> dict[str, Any]:
        answer = api.client.get("/v1/jobs/pulled", headers=api.alice)
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "building"
        return dict(answer.json())

    waiting = inspected()["waiting"]
    assert waiting["reason"] == f"pulling the image {IMAGE} on node gpu-a"
    api.beat("gpu-a", held((IMAGE, DIGEST)))
    assert inspected().get("waiting") is None
