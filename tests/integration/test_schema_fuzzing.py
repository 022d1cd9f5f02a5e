"""Schemathesis fuzzes every operation of the API's own OpenAPI schema, on each store: no
request, valid or not, gets a server error (5xx but the documented 503s that pass by
themselves) or an answer that breaks the schema (status code, media type, body).

Requests are sent in-process (a Starlette test client over the ASGI app), with the admin token
on users' routes and a node token on agents' routes. Each operation gets values the schema
allows and values it refuses, some of them aimed at a job, node and agent that exist (so that
the routes get past "not found" to the values themselves), and the upload routes hostile zip
archives (climbing out, absolute names, links, bombs). Nothing may be written outside the data
directory.

The run is bounded: ``FLEXAI_FUZZ_EXAMPLES`` examples per operation (default 10, about 20 s a
store on two cores). For a longer hunt (each store a few minutes per 100):
``FLEXAI_FUZZ_EXAMPLES=1000 ./scripts/test tests/integration/test_schema_fuzzing.py``.
The default run draws the same cases each time; ``FLEXAI_FUZZ_SEED=N`` draws others (and
replays run N).
"""

from __future__ import annotations

import io
import os
import stat
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.http.app import create_app
from api.identity.identities import ensure_admin_token
from api.services import build_services
from api.settings import Limits, Settings
from tests.integration.test_hostile_input_contained import tree_outside

pytestmark = [  # schemathesis' own strategies; nothing of this project's
    pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies"),
    pytest.mark.filterwarnings("ignore:Generating overly large repr"),
]
EXAMPLES = int(os.environ.get("FLEXAI_FUZZ_EXAMPLES", "10"))
SEED = os.environ.get("FLEXAI_FUZZ_SEED")
AGENT_ID = "fuzz-agent-0123456789abcdef"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]  # fmt: skip
PASSING_503 = {"database-unavailable", "storage-unavailable", "views-halted", "views-behind",
               "too-many-followers"}  # fmt: skip
"""The 503s a client retries: the design's, never a crash."""


@dataclass
class Target:
    """A node held by the fuzzing agent and a job placed on it, and the tokens to reach them:
    the admin's for users' routes, the node's for agents' routes."""

    job_name: str
    job_id: str
    node_id: str
    admin: dict[str, str]
    node: dict[str, str]

    def headers_for(self, path: str) -> dict[str, str]:
        return self.node if path.startswith("/v1/agent/") else self.admin


@pytest.fixture
def fuzzed(database_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, Target]]:
    small = Limits(request_bytes=256 * 1024, archive_entries=100,
                   archive_unpacked_bytes=10 * 2**20)  # fmt: skip
    config = Settings(data_dir=tmp_path / "a" / "data", database_url=database_url, limits=small)
    services = build_services(config)
    token, _ = ensure_admin_token(services.identities, config.data_dir)
    node_token = services.identities.issue_node_token("fuzz-node", label="fuzz", by="admin")
    app = create_app(services, background=False)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, _target(client, services, token, node_token.token)
    services.close()


def _target(client: TestClient, services: Any, admin: str, node_token: str) -> Target:
    """Job ``target``, run to its end on node fuzz-node, with a line of log."""
    admin_headers = {"Authorization": f"Bearer {admin}"}
    node_headers = {"Authorization": f"Bearer {node_token}", "X-Flexai-Agent-Id": AGENT_ID}
    node = client.post("/v1/agent/nodes", headers=node_headers,
                       json={"name": "fuzz-node", "accels": 8, "agent_id": AGENT_ID})
    job = client.post("/v1/jobs", headers=admin_headers, json={
        "name": "target", "repository_url": "/r", "entry_point": ["t.py"]})  # fmt: skip
    assert node.status_code == 200 and job.status_code == 201, (node.text, job.text)
    job_id, node_id = job.json()["id"], node.json()["node_id"]
    services.jobs.begin_scheduling(UUID(job_id))
    services.jobs.assign(UUID(job_id), node_id, "fuzz-node")
    services.projector.catch_up()
    reports = f"/v1/agent/jobs/{job_id}/reports"
    answers = [
        client.post(reports, headers=node_headers,
                    json={"node_id": node_id, "type": "built", "commit": "c0ffee"}),
        client.post(f"/v1/agent/jobs/{job_id}/logs", params={"offset": 0},
                    headers=node_headers, content=b"a line\n"),
        client.post(reports, headers=node_headers,
                    json={"node_id": node_id, "type": "exited", "exit_code": 0}),
    ]  # fmt: skip
    assert [answer.status_code for answer in answers] == [200] * 3, [a.text for a in answers]
    return Target("target", job_id, node_id, admin_headers, node_headers)


def _known(target: Target) -> dict[str, str]:
    return {"name": target.job_name, "job_id": target.job_id, "node_id": target.node_id}


@schemathesis.serializer("application/zip")
def _zip_body(context: Any, value: Any) -> dict[str, bytes]:
    data = getattr(value, "data", value)
    return {"data": data if isinstance(data, bytes) else str(data).encode()}


def _zip(files: dict[str, bytes], *, link: bool = False) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            if link:
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, data)
    return buffer.getvalue()


ARCHIVES = [
    _zip({"model.bin": b"\x00" * 64, "config.json": b'{"architectures": ["X"]}',
          "trainer_state.json": b'{"global_step": 99999999999999999999999}'}),
    _zip({"../../escape.txt": b"x"}), _zip({"/etc/escape": b"x"}), _zip({"a\\b": b"x"}),
    _zip({"link": b"/etc/passwd"}, link=True), _zip({"zeros.bin": bytes(11 * 2**20)}),
    _zip({f"f{i}": b"" for i in range(101)}), b"PK\x05\x06" + bytes(18), b"not a zip",
]  # fmt: skip
"""Zip bodies: a checkpoint, archives that climb out, a link, bombs, empty, not a zip."""


def _strategies(operation: Any, target: Target) -> st.SearchStrategy[Any]:
    """Values the schema allows and refuses, generated freely and aimed at the target (with
    hostile archives where the body is a zip)."""
    names = {parameter.name for parameter in operation.path_parameters}
    aimed = {key: value for key, value in _known(target).items() if key in names}
    if operation.method.upper() == "DELETE":
        aimed = {}  # the target stays for the other operations
    headers = {"X-Flexai-Agent-Id": AGENT_ID}  # fixed: so that the node's holder asks
    kinds = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        kinds.append(operation.as_strategy(generation_mode=mode))
        kinds.append(operation.as_strategy(generation_mode=mode, path_parameters=aimed,
                                           headers=headers))  # fmt: skip
    if _takes_zip(operation):
        kinds.append(st.sampled_from(range(len(ARCHIVES))).flatmap(
            lambda index: operation.as_strategy(path_parameters=aimed, headers=headers,
                                                body=ARCHIVES[index], media_type="application/zip")
        ))  # fmt: skip
    return st.one_of(kinds)


def _takes_zip(operation: Any) -> bool:
    body = operation.definition.raw.get("requestBody") or {}
    return "application/zip" in (body.get("content") or {})


def _tamed(case: Any, target: Target) -> None:
    """No request may wait long: ``follow`` only the target's log (it has ended, so the
    stream ends; another job's would stream until that job ends), long polls of 50 ms."""
    query = case.query if isinstance(case.query, dict) else None
    if query is None:
        return
    if "follow" in query and case.path_parameters.get("name") != target.job_name:
        del query["follow"]
    try:
        long = float(query.get("wait", 0)) > 0.05
    except (TypeError, ValueError):
        long = False
    if long:
        query["wait"] = 0.05


def _send(client: TestClient, case: Any, target: Target) -> Any:
    _tamed(case, target)
    request = case.as_transport_kwargs(base_url=str(client.base_url))
    request.pop("cookies", None)
    headers = {**request.pop("headers", {})}
    headers.setdefault("Authorization", target.headers_for(case.path)["Authorization"])
    if isinstance(request.get("data"), bytes | str):  # requests' raw body is httpx's content
        request["content"] = request.pop("data")
    return client.request(headers=headers, **request)


def _fuzz(operation: Any, client: TestClient, target: Target) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=SEED is None,
              phases=[Phase.explicit, Phase.generate, Phase.target, Phase.shrink],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=_strategies(operation, target))
    def run(case: Any) -> None:
        response = _send(client, case, target)
        if response.status_code == 503 and _slug(response) in PASSING_503:
            return
        case.validate_response(response, checks=CHECKS)

    if SEED is not None:
        run = seed(int(SEED))(run)
    run()


def _slug(response: Any) -> str:
    try:
        return str(response.json().get("type", "")).rsplit("/", 1)[-1]
    except ValueError:
        return ""


def test_no_request_to_any_operation_makes_a_server_error_or_breaks_the_schema(
    fuzzed: tuple[TestClient, Target], tmp_path: Path
) -> None:
    client, target = fuzzed
    before = tree_outside(tmp_path, tmp_path / "a" / "data")
    schema = schemathesis.openapi.from_dict(client.get("/openapi.json").json())
    failures, operations = [], 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        try:
            _fuzz(operation, client, target)
        except (Exception, BaseExceptionGroup) as error:  # every operation, every failure
            failures.append(f"{operation.label}:\n{error}")
    assert operations >= 25
    assert not failures, "\n\n".join(failures)
    assert tree_outside(tmp_path, tmp_path / "a" / "data") == before
