"""The REST API in-process on each store: problem details for every error, never a trace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.identity.identities import ensure_admin_token
from api.services import build_services
from api.settings import Settings
from tests.support import node_headers

PROBLEM = "application/problem+json"
SPEC = {"repository_url": "/nowhere", "entry_point": ["train.py"]}


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    services = build_services(settings)
    token, _ = ensure_admin_token(services.identities, settings.data_dir)
    with TestClient(create_app(services, background=False)) as client:
        yield client, {"Authorization": f"Bearer {token}"}
    services.close()


def assert_problem(response: Any, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = response.json()
    assert body["type"].endswith(f"/{slug}") and body["status"] == status
    assert body["detail"] and "Traceback" not in body["detail"]
    return body


def test_a_request_without_a_valid_token_is_refused_saying_how_to_authenticate(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    client, _ = api
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        for answer in (client.get("/v1/jobs", headers=headers),
                       client.post("/v1/jobs", headers=headers, json={})):  # fmt: skip
            body = assert_problem(answer, 401, "unauthorized")
            assert "Bearer" in body["detail"]
            assert answer.headers["WWW-Authenticate"].startswith("Bearer ")  # RFC 9110 11.6.1


def test_an_unknown_job_is_a_404_problem_that_points_to_the_list(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    client, headers = api
    body = assert_problem(client.get("/v1/jobs/ghost", headers=headers), 404, "job-not-found")
    assert "flexai training list" in body["detail"]


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("accels", True, "accels: must be a whole number"),
        ("accels", "2", "accels: must be a whole number"),
        ("accels", 2.0, "accels: must be a whole number"),
        ("time_limit_s", "60", "time_limit_s: must be a whole number"),
        ("max_retries", True, "max_retries: must be a whole number"),
        ("preemptible", "yes", "preemptible: must be true or false"),
        ("preemptible", 1, "preemptible: must be true or false"),
    ],
)
def test_a_value_of_another_type_is_refused_not_converted(
    api: tuple[TestClient, dict[str, str]], field: str, value: object, says: str
) -> None:
    """``"accels": true`` was taken for 1 and ``"preemptible": "yes"`` for true."""
    client, headers = api
    job = {**SPEC, "name": "typed", field: value}
    answer = client.post("/v1/jobs", headers=headers, json=job)
    assert says in assert_problem(answer, 422, "invalid-request")["detail"]
    listed = client.post("/v1/jobs", headers=headers, json=[job])
    assert listed.status_code == 207 and listed.json()["results"][0]["status"] == 422
    assert client.get("/v1/jobs/typed", headers=headers).status_code == 404


def test_an_invalid_body_is_a_422_problem_naming_the_field(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    client, headers = api
    response = client.post("/v1/jobs", headers=headers, json={"name": "ok-name", "accels": 0})
    body = assert_problem(response, 422, "invalid-request")
    assert "accels" in body["detail"] and "repository_url" in body["detail"]
    assert set(body["fields"]) == {"repository_url", "entry_point", "accels"}
    assert body["field"] == body["fields"][0]
    assert "accels: must be at least 1" in body["detail"]
    assert "repository_url: is required" in body["detail"]
    one = client.post("/v1/jobs", headers=headers, json={**SPEC, "name": "a"})
    said = assert_problem(one, 422, "invalid-request")
    assert said["field"] == "name"
    assert "name: 'a' is 1 character long; use 3 to 63" in said["detail"]
    worded = client.post("/v1/jobs", headers=headers, json={
        **SPEC, "name": "ok-name", "time_limit_s": 10**9, "priority": "mid", "nodes": "two"})
    detail = assert_problem(worded, 422, "invalid-request")["detail"]
    assert "time_limit_s: must be at most 31622400" in detail
    assert "priority: must be 'low', 'normal' or 'high'" in detail
    assert "nodes: must be a whole number" in detail
    assert "Input should" not in detail and "Value error" not in detail
    env = client.post("/v1/jobs", headers=headers, json={**SPEC, "name": "ok-name",
                                                         "env": {"KEY": "x\x00y"}})  # fmt: skip
    assert assert_problem(env, 422, "invalid-request")["field"] == "env"
    limit = client.get("/v1/jobs?limit=0", headers=headers)
    body = assert_problem(limit, 422, "invalid-request")
    assert body["field"] == "limit" and "fields" not in body
    listed = client.post("/v1/jobs", headers=headers, json=[{**SPEC, "name": "x"}])
    assert listed.status_code == 207
    [result] = listed.json()["results"]
    assert result["problem"]["field"] == "name" and result["problem"]["status"] == 422


def test_a_body_that_is_not_json_is_a_400_saying_where_it_breaks(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    client, headers = api
    json_headers = {**headers, "Content-Type": "application/json"}
    for body in (b'{"name":', b"x", b'{"name": "a",}'):
        answer = client.post("/v1/jobs", headers=json_headers, content=body)
        problem = assert_problem(answer, 400, "invalid-request")
        assert problem["title"] == "Unreadable body"
        assert "could not be read as JSON" in problem["detail"]
        assert "at character" in problem["detail"] and "Content-Type" in problem["detail"]
    verify = client.post("/v1/admin/verify", headers=json_headers, content=b"x")
    assert assert_problem(verify, 400, "invalid-request")["title"] == "Unreadable body"


def test_a_method_a_route_has_not_is_a_405_naming_those_it_has(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    client, headers = api
    answer = client.put("/v1/jobs", headers=headers)
    body = assert_problem(answer, 405, "method-not-allowed")
    assert answer.headers["Allow"] == "GET, HEAD, POST"
    assert "PUT is not a method of /v1/jobs" in body["detail"] and "GET" in body["detail"]


def test_identity_bodies_take_only_their_own_fields_names_and_types(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    """Names are matched whole (a valid name inside another is no name), a flag is a JSON
    boolean (``"yes"`` and ``1`` give no admin), and an unknown field is refused."""
    client, headers = api
    for node in ("../../etc/passwd", "a b", "gpu\x01x", "ok-node!"):
        answer = client.post("/v1/admin/node-tokens", headers=headers, json={"node": node})
        assert assert_problem(answer, 422, "invalid-request")["field"] == "node", node
    for name in ("bob\x01", "Xbob", "bob/", "-bob"):
        answer = client.post("/v1/admin/users", headers=headers, json={"name": name})
        assert assert_problem(answer, 422, "invalid-request")["field"] == "name", name
        answer = client.post("/v1/tokens", headers=headers, json={"user": name})
        assert assert_problem(answer, 422, "invalid-request")["field"] == "user", name
    assert client.get("/v1/tokens?user=Xbob", headers=headers).status_code == 422
    for admin in ("yes", 1, "true", None):
        answer = client.post("/v1/admin/users", headers=headers,
                             json={"name": "dave", "admin": admin})  # fmt: skip
        assert assert_problem(answer, 422, "invalid-request")["field"] == "admin", admin
    extra = client.post("/v1/admin/users", headers=headers, json={"name": "dave", "x": 1})
    assert assert_problem(extra, 422, "invalid-request")["field"] == "x"
    verify = client.post("/v1/admin/verify", headers=headers, json={"extra": 1})
    assert assert_problem(verify, 422, "invalid-request")["field"] == "extra"
    made = client.post("/v1/admin/users", headers=headers, json={"name": "dave", "admin": True})
    assert made.status_code == 201 and made.json()["user"]["admin"] is True
    node = client.post("/v1/admin/node-tokens", headers=headers, json={"node": "gpu-01.rack2"})
    assert node.status_code == 201, node.text


def test_a_bad_name_and_a_taken_name_are_refused_with_the_rule_or_the_way_out(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    client, headers = api
    bad = client.post("/v1/jobs", headers=headers, json={**SPEC, "name": "a!"})
    assert "3 to 63" in assert_problem(bad, 422, "invalid-request")["detail"]
    first = client.post("/v1/jobs", headers=headers, json={**SPEC, "name": "taken"})
    assert first.status_code == 201
    again = client.post("/v1/jobs", headers=headers, json={**SPEC, "name": "taken"})
    assert "delete" in assert_problem(again, 409, "name-taken")["detail"]


def test_deleting_a_live_job_is_a_409_problem_that_says_to_stop_it_first(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    client, headers = api
    client.post("/v1/jobs", headers=headers, json={**SPEC, "name": "alive"})
    body = assert_problem(client.delete("/v1/jobs/alive", headers=headers), 409, "job-not-terminal")
    assert "flexai training stop alive" in body["detail"]


def test_stopping_a_job_no_node_holds_yet_stops_it_at_once_with_no_accelerators(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    client, headers = api
    client.post("/v1/jobs", headers=headers, json={**SPEC, "name": "early"})
    stopped = client.post("/v1/jobs/early/stop", headers=headers)
    assert stopped.status_code == 202
    document = stopped.json()
    assert [entry["status"] for entry in document["history"]] == [
        "pending", "stop in progress", "stopped",
    ]  # fmt: skip
    assert document["stop"]["accelerators_allocated"] is False
    again = client.post("/v1/jobs/early/stop", headers=headers)
    body = assert_problem(again, 409, "illegal-transition")
    assert (body["current_status"], body["attempted_status"]) == ("stopped", "stop in progress")


def test_a_log_upload_past_the_end_is_refused_with_the_offset_to_resend_from(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    client, headers = api
    services = client.app.state.services
    job_id = client.post("/v1/jobs", headers=headers, json={**SPEC, "name": "logs"}).json()["id"]
    agent = "agent-0123456789abcdef"
    headers = node_headers(services, "gpu-1", agent_id=agent)  # the job's node's agent
    registered = client.post("/v1/agent/nodes", headers=headers, json={
        "name": "gpu-1", "accels": 1, "accel_type": "cpu", "agent_id": agent,
    })  # fmt: skip
    assert registered.status_code == 200, registered.text
    services.jobs.begin_scheduling(UUID(job_id))
    placed = services.jobs.assign(UUID(job_id), registered.json()["node_id"], "gpu-1")
    services.projector.wait(placed.position)
    path = f"/v1/agent/jobs/{job_id}/logs"
    assert client.post(f"{path}?offset=0", headers=headers, content=b"one\n").json() == {"size": 4}
    assert client.post(f"{path}?offset=0", headers=headers, content=b"one\n").json() == {"size": 4}
    body = assert_problem(
        client.post(f"{path}?offset=9", headers=headers, content=b"x"), 409, "log-offset-mismatch"
    )
    assert body["expected_offset"] == 4


def test_unknown_routes_are_problems_and_the_openapi_docs_are_served(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    client, _ = api
    assert_problem(client.get("/v1/nope"), 404, "not-found")
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/jobs", "/v1/jobs/{name}/logs", "/v1/audit/jobs/{job_id}"} <= set(paths)
