"""How each node keeps jobs apart, as its agent registers it (each store): the nodes list and
`flexai admin node list` show it, a server run with --require-isolation places jobs only on
nodes that sandbox them, and a dataset given as NAME=MOUNT is kept as a mount of the job's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from api.scheduling.scheduler import Scheduler
from cli.commands.admin.node import COLUMNS
from cli.output.datasets import dataset_pins
from cli.output.tables import render_table
from tests.integration.test_api_problems import assert_problem
from tests.integration.test_hostile_requests import AGENT_A, SPEC, Api, open_api
from tests.support import node_headers

__all__ = ["open_api"]  # its fixture applies here too

SANDBOX = {"level": "sandbox", "detail": "each job runs in a sandbox of its own", "limits": True}
SHARED = {"level": "user", "detail": "bubblewrap is not installed, so every job runs as the "
                                     "same user and sees the others", "limits": False}  # fmt: skip


def register(api: Api, name: str, isolation: dict[str, Any] | None) -> str:
    body: dict[str, Any] = {"name": name, "accels": 2, "accel_type": "cpu", "agent_id": AGENT_A}
    if isolation is not None:
        body["isolation"] = isolation
    answer = api.client.post("/v1/agent/nodes", headers=node_headers(api.services, name),
                             json=body)  # fmt: skip
    assert answer.status_code == 200, answer.text
    node_id: str = answer.json()["node_id"]
    api.services.state.heartbeat(node_id)
    return node_id


def test_the_nodes_list_shows_how_each_node_keeps_jobs_apart(
    open_api: Callable[..., Api],
) -> None:
    api = open_api()
    register(api, "gpu-1", SANDBOX)
    register(api, "gpu-2", SHARED)
    register(api, "gpu-3", None)  # an agent from before isolation levels
    register(api, "gpu-1", {**SANDBOX, "limits": False})  # registered again: it changed
    api.services.projector.catch_up()
    nodes = {node["name"]: node for node in api.client.get(
        "/v1/nodes", headers=api.headers).json()["nodes"]}  # fmt: skip
    assert nodes["gpu-1"]["isolation"] == {**SANDBOX, "limits": False}
    assert nodes["gpu-2"]["isolation"] == SHARED
    assert nodes["gpu-3"]["isolation"] is None
    shown = render_table(COLUMNS, [])  # the CLI's table: its header
    assert shown.split() == ["NAME", "ACCELS", "TYPE", "BUSY", "ALIVE", "ISOLATION", "LIMITS"]


def test_an_isolation_level_the_agent_cannot_have_is_refused(
    open_api: Callable[..., Api],
) -> None:
    api = open_api()
    body = {"name": "gpu-1", "accels": 2, "agent_id": AGENT_A,
            "isolation": {**SANDBOX, "level": "chroot"}}  # fmt: skip
    answer = api.client.post("/v1/agent/nodes", headers=node_headers(api.services, "gpu-1"),
                             json=body)  # fmt: skip
    assert_problem(answer, 422, "invalid-request")


def test_with_require_isolation_only_a_sandboxing_node_gets_jobs(
    open_api: Callable[..., Api],
) -> None:
    api = open_api(require_isolation=True, scheduling_patience_s=3600)
    register(api, "shared", SHARED)
    register(api, "sandboxed", SANDBOX)
    for name in ("first", "second"):
        answer = api.client.post("/v1/jobs", headers=api.headers, json={**SPEC, "name": name})
        assert answer.status_code == 201, answer.text
    api.services.projector.catch_up()
    Scheduler(api.services.scheduling()).run_once()
    api.services.projector.catch_up()
    for name in ("first", "second"):
        job = api.client.get(f"/v1/jobs/{name}", headers=api.headers).json()
        assert (job["status"], job["node"]) == ("building", "sandboxed"), job


def test_a_dataset_given_as_name_equals_mount_is_kept_as_its_mount(
    open_api: Callable[..., Api],
) -> None:
    api = open_api()
    answer = api.client.post("/v1/jobs", headers=api.headers, json={
        **SPEC, "name": "mounted", "datasets": ["imagenet=train", "labels"]})  # fmt: skip
    assert answer.status_code == 201, answer.text
    spec = answer.json()["spec"]
    assert spec["datasets"] == ["imagenet", "labels"]
    assert spec["dataset_mounts"] == {"imagenet": "train"}
    assert dataset_pins(spec) == ["imagenet at /input/train", "labels"]
    job = api.services.jobs.job(UUID(answer.json()["id"]))
    assert job.spec["dataset_mounts"] == {"imagenet": "train"}
    for datasets, field in ((["a=b=c"], "datasets"), (["a=x", "b=x"], "datasets"),
                            (["a=", "a"], "datasets")):  # fmt: skip
        refused = api.client.post("/v1/jobs", headers=api.headers,
                                  json={**SPEC, "name": "bad", "datasets": datasets})
        assert_problem(refused, 422, "invalid-request")
        assert refused.json()["field"].startswith(field), refused.json()
