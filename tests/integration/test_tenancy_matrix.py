"""Every route x every kind of caller: users A and B, an admin, the tokens of two nodes, no
token, a revoked token. Each cell is checked, and afterwards user A's job, log, checkpoints
and secret are exactly as they were: no cross-tenant read or write.

The routes come from the application itself: a route this test does not know fails it, so a
new route is classified (user, agent, admin, open) before it ships.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.identity.identities import Caller, ensure_admin_token
from api.services import Services, build_services
from api.settings import Settings
from domain.actors import user
from domain.node import Node
from tests.support import node_headers, user_headers

AGENT_1, AGENT_2 = "agent-0123456789abcdef", "agent-fedcba9876543210"
OPEN = ("/health", "/metrics", "/docs", "/redoc", "/openapi.json")
ANY_CALLER = {("GET", "/v1/whoami")}
"""Routes any valid token may call (a node's too)."""
OWN_CREATE_OR_REPLACE = {("PUT", "/v1/secrets/{name}"), ("PUT", "/v1/datasets/{name}")}
"""User routes whose ``{name}`` is the caller's own to create: B acts on B's, never on A's."""


@dataclass
class World:
    client: TestClient
    services: Services
    callers: dict[str, dict[str, str]]
    job_id: str
    a_token_id: str

    def snapshot(self) -> dict[str, Any]:
        """What of user A's a cross-tenant request could change."""
        jobs = self.services.jobs
        history = [(type(event).__name__, event.originator_version)
                   for event in jobs.history(UUID(self.job_id))]  # fmt: skip
        log = self.services.artifacts.read_log(self.job_id, 0, 1 << 20, node_index=0)
        found, _ = self.services.secrets.values("alice", ["a-job"])
        tokens = self.services.identities.tokens("alice")
        return {"history": history, "log": log, "secret": found,
                "checkpoints": self.services.queries.checkpoints(self.job_id),
                "tokens": [(t["token_id"], t["revoked_at"]) for t in tokens]}  # fmt: skip


@pytest.fixture
def world(database_url: str, tmp_path: Path) -> Iterator[World]:
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    services = build_services(settings)
    admin_token, _ = ensure_admin_token(services.identities, settings.data_dir)
    callers = {
        "admin": {"Authorization": f"Bearer {admin_token}"},
        "A": user_headers(services, "alice"),
        "B": user_headers(services, "bob"),
        "node-1": node_headers(services, "node-1", AGENT_1),
        "node-2": node_headers(services, "node-2", AGENT_2),
        "none": {},
    }
    carol = services.identities.create_user("carol", admin=False, by="admin")
    services.identities.revoke(carol.token_id, Caller(token_id="-", user="admin", admin=True))
    callers["revoked"] = {"Authorization": f"Bearer {carol.token}"}
    with TestClient(create_app(services, background=False)) as client:
        for node, agent in (("node-1", AGENT_1), ("node-2", AGENT_2)):
            registered = client.post("/v1/agent/nodes", headers=callers[node], json={
                "name": node, "accels": 2, "agent_id": agent})  # fmt: skip
            assert registered.status_code == 200, registered.text
        for who, name in (("A", "a-job"), ("B", "b-job")):
            made = client.post("/v1/jobs", headers=callers[who], json={
                "name": name, "repository_url": "/nowhere", "entry_point": ["train.py"]})
            assert made.status_code == 201, made.text
        secret = client.post("/v1/secrets", headers=callers["A"],
                             json={"name": "a-job", "value": "alice's value"})  # fmt: skip
        assert secret.status_code in (200, 201), secret.text
        a_job = client.get("/v1/jobs/a-job", headers=callers["A"]).json()["id"]
        b_job = client.get("/v1/jobs/b-job", headers=callers["B"]).json()["id"]
        for job, node in ((a_job, "node-1"), (b_job, "node-2")):
            services.jobs.begin_scheduling(UUID(job))
            services.jobs.assign(UUID(job), str(Node.create_id(node)), node)
        services.projector.catch_up()
        a_tokens = services.identities.tokens("alice")
        yield World(client, services, callers, a_job, str(a_tokens[0]["token_id"]))
    services.close()


def routes(world: World) -> list[tuple[str, str]]:
    """Every HTTP route, as the OpenAPI schema documents it."""
    paths = world.client.get("/openapi.json").json()["paths"]
    return [(method.upper(), path) for path, operations in sorted(paths.items())
            for method in sorted(operations)]  # fmt: skip


def kind_of(method: str, path: str) -> str:
    if path.startswith(OPEN):
        return "open"
    if (method, path) in ANY_CALLER:
        return "any"
    if path.startswith("/v1/agent/"):
        return "agent"
    if path.startswith("/v1/admin/"):
        return "admin"
    if path.startswith(("/v1/jobs", "/v1/audit/", "/v1/datasets", "/v1/secrets", "/v1/tokens",
                        "/v1/nodes", "/v1/runtimes")):  # fmt: skip
        return "user"
    raise AssertionError(f"{method} {path}: a route this matrix does not know; classify it")


def concrete(world: World, path: str) -> str:
    """The route's path aimed at user A's things (its job, placed on node-1)."""
    values = {
        "name": "a-job", "job_id": world.job_id, "node_id": str(Node.create_id("node-1")),
        "node_index": "0", "checkpoint_name": "ck-1", "checkpoint_id": "ck-nope",
        "content_hash": "0" * 64, "token_id": world.a_token_id, "number": "1",
    }  # fmt: skip
    return re.sub(r"\{(\w+)(?::\w+)?\}", lambda match: values.get(match.group(1), "x1"), path)


def call(world: World, caller: str, method: str, path: str) -> Any:
    target = concrete(world, path)
    headers = dict(world.callers[caller])
    params: dict[str, Any] = {}
    body: dict[str, Any] | None = None
    content: bytes | None = None
    if "/v1/agent/" in path:
        params = {"node_id": str(Node.create_id("node-1")), "offset": 0, "node_index": 0}
    if (method, path) == ("POST", "/v1/jobs"):
        body = {"name": f"made-by-{caller.lower()}", "repository_url": "/nowhere",
                "entry_point": ["train.py"]}  # fmt: skip
    elif (method, path) == ("POST", "/v1/agent/nodes"):
        body = {"name": "node-1", "accels": 2, "agent_id": AGENT_1}
    elif (method, path) == ("POST", "/v1/admin/users"):
        body = {"name": f"made-by-{caller.lower()}"}
    elif (method, path) == ("POST", "/v1/admin/node-tokens"):
        body = {"node": "node-1"}
    elif path.startswith("/v1/secrets"):
        body = {"name": "other", "value": "v4lue"} if method == "POST" else {"value": "v4lue"}
    elif path.endswith("/debug-sessions"):
        body = {"public_key": "ssh-ed25519 " + "A" * 68, "node_index": 0}
    elif path.endswith("/reports"):
        body = {"type": "built", "node_id": str(Node.create_id("node-1")), "commit": "c0ffee"}
    elif path.endswith("/uploads"):
        body = {"kind": "output", "node_id": str(Node.create_id("node-1")), "node_index": 0}
    elif path.endswith("/uploads/{upload_id}/parts"):
        body = {"numbers": [1]}
    elif path.endswith("/complete"):
        body = {"parts": [{"number": 1, "etag": "e"}], "size": 1, "sha256": "0" * 64}
    elif re.search(r"/(logs|parts/\{number\})$", path) or path == "/v1/datasets/{name}":
        content = b"x"  # raw bodies: log bytes, zip archives and their parts
    elif method in ("POST", "PUT"):
        body = {}
    request: dict[str, Any] = {"headers": headers, "params": params}
    if body is not None and method in ("POST", "PUT"):
        request["json"] = body
    elif content is not None:
        request["content"] = content
    return world.client.request(method, target, **request)


def slug(response: Any) -> str:
    try:
        return str(response.json().get("type", "")).rsplit("/", 1)[-1]
    except ValueError:
        return ""


A_READS = ("/v1/jobs/{name}", "/v1/jobs/{name}/checkpoints", "/v1/jobs/{name}/logs")


def test_every_route_refuses_every_caller_it_must_and_no_tenant_reaches_another(
    world: World,
) -> None:
    before = world.snapshot()
    cells = 0
    strangers = ("none", "revoked", "B", "node-2")
    for caller in (*strangers, "node-1", "A", "admin"):
        if caller == "node-1":  # A's job's own node writes to it legitimately from here on
            assert world.snapshot() == before  # nothing of A's changed by the others
        for method, path in routes(world):
            kind = kind_of(method, path)
            if kind == "open":
                continue
            if caller in ("A", "admin") and method != "GET":
                continue  # A's own writes would change what the snapshot compares
            response = call(world, caller, method, path)
            cells += 1
            where = f"{caller}: {method} {path} -> {response.status_code} {response.text[:300]}"
            assert response.status_code < 500, where
            if caller == "none":
                assert (response.status_code, slug(response)) == (401, "unauthorized"), where
            elif caller == "revoked":
                assert (response.status_code, slug(response)) == (401, "token-revoked"), where
            elif kind == "any":
                assert response.status_code == 200, where
            elif kind == "admin":
                expected = 200 if caller == "admin" else 403
                assert response.status_code == expected, where
            elif kind == "agent":
                _agent_cell(caller, method, path, response, where)
            else:
                _user_cell(world, caller, method, path, response, where)
    assert cells > 150, cells


def _agent_cell(caller: str, method: str, path: str, response: Any, where: str) -> None:
    if caller in ("A", "B", "admin"):
        assert (response.status_code, slug(response)) == (403, "node-token-needed"), where
    elif caller == "node-2":  # A's job runs on node-1: node-2 reaches neither it nor node-1
        assert response.status_code in (403, 404), where
        assert response.status_code == 404 or slug(response) == "wrong-node", where
    else:  # node-1 is the job's node: its own routes answer it (maybe refusing the value)
        assert response.status_code not in (401, 403), where


def _user_cell(
    world: World, caller: str, method: str, path: str, response: Any, where: str
) -> None:
    if caller.startswith("node-"):
        assert (response.status_code, slug(response)) == (403, "user-token-needed"), where
        return
    aims_at_a = "{name}" in path or "{job_id}" in path or "{token_id}" in path
    if caller == "B" and aims_at_a and (method, path) not in OWN_CREATE_OR_REPLACE:
        assert response.status_code == 404, where  # not even its existence is revealed
    if caller == "B":  # no trace of A's in B's answers (but the id B itself sent)
        told = response.text.replace(world.job_id, "") if "{job_id}" in path else response.text
        assert world.job_id not in told and "alice" not in told, where
    if caller in ("A", "admin") and path in A_READS:
        # A reads its own job; the admin reads it with ?owner=alice (below), not by default.
        assert (response.status_code == 200) == (caller == "A"), where


def test_an_admin_acts_on_another_users_job_by_naming_its_owner(world: World) -> None:
    admin, alice = world.callers["admin"], world.callers["A"]
    seen = world.client.get("/v1/jobs/a-job", headers=admin, params={"owner": "alice"})
    assert seen.status_code == 200 and seen.json()["owner"] == "alice"
    every = world.client.get("/v1/jobs", headers=admin, params={"owner": "*"}).json()["jobs"]
    assert {(job["owner"], job["name"]) for job in every} >= {("alice", "a-job"), ("bob", "b-job")}
    refused = world.client.get("/v1/jobs", headers=alice, params={"owner": "bob"})
    assert (refused.status_code, slug(refused)) == (403, "admin-only")
    stopped = world.client.post("/v1/jobs/a-job/stop", headers=admin, params={"owner": "alice"})
    assert stopped.status_code == 202, stopped.text
    history = world.services.jobs.history(UUID(world.job_id))
    assert getattr(history[-1], "by", None) == user("admin")  # the ledger says who stopped it


def test_names_are_unique_per_owner_not_across_owners(world: World) -> None:
    spec = {"repository_url": "/nowhere", "entry_point": ["train.py"]}
    bob = world.client.post("/v1/jobs", headers=world.callers["B"], json={**spec, "name": "a-job"})
    assert bob.status_code == 201, bob.text
    again = world.client.post("/v1/jobs", headers=world.callers["A"],
                              json={**spec, "name": "a-job"})  # fmt: skip
    assert again.status_code == 409
    mine = world.client.get("/v1/jobs/a-job", headers=world.callers["B"]).json()
    assert mine["owner"] == "bob" and mine["id"] != world.job_id


def test_a_revoked_token_stops_working_at_once_though_it_was_just_used(world: World) -> None:
    made = world.client.post("/v1/tokens", headers=world.callers["A"], json={"label": "ci"})
    assert made.status_code == 201, made.text
    token = {"Authorization": f"Bearer {made.json()['token']}"}
    assert world.client.get("/v1/jobs", headers=token).status_code == 200  # now remembered
    listed = world.client.get("/v1/tokens", headers=world.callers["A"]).json()["tokens"]
    assert made.json()["token"] not in str(listed)  # never a value, only ids
    revoked = world.client.delete(f"/v1/tokens/{made.json()['token_id']}",
                                  headers=world.callers["A"])  # fmt: skip
    assert revoked.status_code == 200
    refused = world.client.get("/v1/jobs", headers=token)
    assert (refused.status_code, slug(refused)) == (401, "token-revoked")
    assert "flexai login" in refused.json()["detail"]


def test_tokens_are_stored_as_hashes_only(world: World) -> None:
    made = world.client.post("/v1/tokens", headers=world.callers["B"], json={}).json()["token"]
    with world.services.database.transaction() as cursor:
        cursor.execute("SELECT * FROM access_tokens")
        rows = cursor.fetchall()
    assert rows and all(made not in str(row) for row in rows)
