"""One bad request never takes the control plane down: bounds, limits, a poisoned ledger, a
second agent under a live node's name, a broken artifact disk (each store)."""

from __future__ import annotations

import io
import shutil
import time
import zipfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.identity.identities import ensure_admin_token
from api.services import Services, build_services
from api.settings import Limits, Settings
from domain.actors import user
from domain.job import TrainingJob
from tests.integration.test_api_problems import SPEC, assert_problem
from tests.support import node_headers, send_archive

AGENT_A = "agent-a-0123456789abcdef"
AGENT_B = "agent-b-0123456789abcdef"


class Api:
    def __init__(self, client: TestClient, services: Services, token: str) -> None:
        self.client = client
        self.services = services
        self.headers = {"Authorization": f"Bearer {token}"}
        self.node_headers = node_headers(services, "gpu-1")
        """Node gpu-1's token: the agent routes refuse users' tokens."""

    def agent_headers(self, agent_id: str = AGENT_A) -> dict[str, str]:
        return {**self.node_headers, "X-Flexai-Agent-Id": agent_id}

    def register(self, name: str = "gpu-1", agent_id: str = AGENT_A) -> Any:
        """Registers node ``name`` with node gpu-1's token."""
        body = {"name": name, "accels": 2, "accel_type": "cpu", "agent_id": agent_id}
        return self.client.post("/v1/agent/nodes", headers=self.node_headers, json=body)

    def running_job(self, name: str = "victim") -> tuple[str, str]:
        """A job assigned to node gpu-1 (held by agent A) and started there."""
        node_id = self.register().json()["node_id"]
        job_id = self.client.post("/v1/jobs", headers=self.headers, json={**SPEC, "name": name})
        job_id = job_id.json()["id"]
        jobs = self.services.jobs
        jobs.begin_scheduling(UUID(job_id))
        placed = jobs.assign(UUID(job_id), node_id, "gpu-1")
        self.services.projector.wait(placed.position)  # a node token reaches placed jobs only
        built = self.report(job_id, node_id, "built", commit="c0ffee")
        assert built.status_code == 200, built.text
        return job_id, node_id

    def report(self, job_id: str, node_id: str, kind: str, **facts: Any) -> Any:
        return self.client.post(
            f"/v1/agent/jobs/{job_id}/reports", headers=self.agent_headers(),
            json={"node_id": node_id, "type": kind, **facts},
        )  # fmt: skip


@pytest.fixture
def open_api(database_url: str, tmp_path: Path) -> Iterator[Callable[..., Api]]:
    """Opens the API on the store under test (several times: a restart); closes them all."""
    opened: list[tuple[TestClient, Services]] = []

    def open_one(**settings: Any) -> Api:
        config = Settings(data_dir=tmp_path / "data", database_url=database_url, **settings)
        services = build_services(config)
        token, _ = ensure_admin_token(services.identities, config.data_dir)
        client = TestClient(create_app(services, background=False))
        client.__enter__()
        opened.append((client, services))
        return Api(client, services, token)

    yield open_one
    for client, services in reversed(opened):
        client.__exit__(None, None, None)
        services.close()


@pytest.fixture
def api(open_api: Callable[..., Api]) -> Api:
    small = Limits(request_bytes=64 * 1024, log_chunk_bytes=4096, archive_entries=50,
                   archive_unpacked_bytes=1_000_000)  # fmt: skip
    return open_api(limits=small)


# -- bounds -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"accels": 2**70}, "accels"),
        ({"nodes": -1}, "nodes"),
        ({"env": {"K": "a\x00b"}}, "env"),
        ({"entry_point": ["train.py", "\x1b[2J"]}, "entry_point"),
        ({"repository_revision": "--upload-pack=evil"}, "repository_revision"),
    ],
)
def test_a_value_the_views_could_not_hold_is_a_422_naming_its_field(
    api: Api, change: dict[str, Any], field: str
) -> None:
    response = api.client.post("/v1/jobs", headers=api.headers,
                               json={**SPEC, "name": "bad-value", **change})  # fmt: skip
    body = assert_problem(response, 422, "invalid-request")
    assert field in body["detail"]
    assert api.client.get("/v1/jobs", headers=api.headers).json()["count"] == 0
    assert api.client.get("/health").json()["ok"] is True


def test_a_node_name_or_checkpoint_name_with_a_nul_byte_is_refused_before_it_is_stored(
    api: Api,
) -> None:
    assert_problem(api.register(name="gpu\x00evil"), 422, "invalid-request")
    job_id, node_id = api.running_job()
    response = send_archive(api.client, api.agent_headers(), job_id, node_id,
                            zip_of({"a.txt": b"x"}), name="ck\x00pt")  # fmt: skip
    assert assert_problem(response, 422, "invalid-request")["field"] == "name"
    assert api.client.get("/v1/jobs/victim/checkpoints", headers=api.headers).json() == {
        "checkpoints": []
    }
    assert api.client.get("/health").json()["ok"] is True


# -- limits -------------------------------------------------------------------------------


def test_the_token_is_checked_before_a_large_body_is_read_then_the_size(api: Api) -> None:
    big = b"{" + b" " * (200 * 1024)
    anonymous = api.client.post("/v1/jobs", content=big,
                                headers={"Content-Type": "application/json"})  # fmt: skip
    assert_problem(anonymous, 401, "unauthorized")
    json_headers = {**api.headers, "Content-Type": "application/json"}
    declared = api.client.post("/v1/jobs", content=big, headers=json_headers)
    body = assert_problem(declared, 413, "payload-too-large")
    assert body["limit"] == 64 * 1024 and "request body" in body["detail"]

    def chunked() -> Iterator[bytes]:
        for _ in range(50):
            yield b" " * 8192

    streamed = api.client.post("/v1/jobs", content=chunked(), headers=json_headers)
    assert_problem(streamed, 413, "payload-too-large")


def test_a_spec_of_200000_env_keys_is_refused_and_agents_never_see_it(api: Api) -> None:
    env = {f"K{i}": "v" for i in range(200_000)}
    response = api.client.post("/v1/jobs", headers=api.headers,
                               json={**SPEC, "name": "wide", "env": env})  # fmt: skip
    assert_problem(response, 413, "payload-too-large")


def test_the_ledger_refuses_a_spec_too_large_for_every_agent_poll(
    open_api: Callable[..., Api],
) -> None:
    api = open_api(limits=Limits(request_bytes=8 * 2**20))
    env = {f"K{i}": "v" * 200 for i in range(1000)}
    response = api.client.post("/v1/jobs", headers=api.headers,
                               json={**SPEC, "name": "wide", "env": env})  # fmt: skip
    body = assert_problem(response, 422, "invalid-request")
    assert body["field"] == "spec" and "bytes as JSON" in body["detail"]


def test_a_log_chunk_over_the_limit_is_a_413_and_nothing_is_appended(api: Api) -> None:
    job_id, _ = api.running_job()
    path = f"/v1/agent/jobs/{job_id}/logs"
    too_big = api.client.post(path, params={"offset": 0}, headers=api.agent_headers(),
                              content=b"x" * 5000)  # fmt: skip
    assert assert_problem(too_big, 413, "payload-too-large")["limit"] == 4096
    fits = api.client.post(path, params={"offset": 0}, headers=api.agent_headers(),
                           content=b"line\n")  # fmt: skip
    assert fits.json() == {"size": 5}


def zip_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("files", "says"),
    [
        ({"zeros.bin": bytes(20_000_000)}, "unpacks to 20000000 bytes"),
        ({f"f{i}.txt": b"" for i in range(60)}, "holds 60 entries"),
    ],
)
def test_a_zip_bomb_checkpoint_is_refused_without_being_unpacked_or_kept(
    api: Api, files: dict[str, bytes], says: str
) -> None:
    job_id, node_id = api.running_job()
    bomb = zip_of(files)
    assert len(bomb) < 100_000
    response = send_archive(api.client, api.agent_headers(), job_id, node_id, bomb, name="ck-1")
    assert says in assert_problem(response, 413, "payload-too-large")["detail"]
    job_dir = api.services.artifacts.root / "jobs" / job_id
    assert [p.name for p in job_dir.rglob("*") if p.is_file()] == []
    assert api.client.get("/v1/jobs/victim/checkpoints", headers=api.headers).json() == {
        "checkpoints": []
    }


# -- a poisoned ledger --------------------------------------------------------------------


def inject_poison(services: Services) -> int:
    """An event the views cannot apply, written past the model's guards (as an older server
    without today's bounds did)."""
    job = TrainingJob(owner="admin", name="poison", by=user("admin"),
                      spec={**SPEC, "accels": 2**70, "nodes": 1})  # fmt: skip
    recordings = services.jobs.save(job)
    return max(recording.notification.id for recording in recordings)


def test_an_event_the_views_cannot_apply_halts_them_loudly_and_the_server_still_starts(
    open_api: Callable[..., Api],
) -> None:
    api = open_api()
    assert api.client.post("/v1/jobs", headers=api.headers,
                           json={**SPEC, "name": "before"}).status_code == 201  # fmt: skip
    position = inject_poison(api.services)
    after = api.client.post("/v1/jobs", headers=api.headers, json={**SPEC, "name": "after"})
    assert assert_problem(after, 503, "views-halted")["halted_at"] == position
    assert after.headers["Retry-After"]

    health = api.client.get("/health")
    assert health.status_code == 503 and health.json()["ok"] is False
    halted = health.json()["views_halted"]
    assert (halted["position"], halted["topic"]) == (position, "TrainingJob.Submitted")
    assert f"--skip-event {position}" in health.json()["detail"]
    metrics = api.client.get("/metrics").text
    assert "flexai_views_halted 1.0" in metrics
    assert f"flexai_views_halted_position {float(position)}" in metrics

    refused = api.client.post("/v1/jobs", headers=api.headers, json={**SPEC, "name": "later"})
    assert_problem(refused, 503, "views-halted")
    listed = api.client.get("/v1/jobs", headers=api.headers).json()
    assert [job["name"] for job in listed["jobs"]] == ["before"]  # reads still answer

    restarted = open_api()  # a new server on the same ledger starts, and says the same
    assert restarted.client.get("/health").json()["views_halted"]["position"] == position
    fixed = open_api(skip_events=frozenset({position}))
    assert fixed.client.get("/health").json()["ok"] is True
    again = fixed.client.post("/v1/jobs", headers=fixed.headers, json={**SPEC, "name": "later"})
    assert again.status_code == 201
    names = {job["name"] for job in fixed.client.get("/v1/jobs", headers=fixed.headers)
             .json()["jobs"]}  # fmt: skip
    assert names == {"before", "after", "later"}  # the write answered 503 was not lost
    assert "flexai_views_halted 0.0" in fixed.client.get("/metrics").text


# -- one agent per node -------------------------------------------------------------------


def test_a_second_agent_under_a_live_node_name_is_refused_and_never_gets_its_jobs(
    open_api: Callable[..., Api],
) -> None:
    api = open_api(node_timeout_s=0.5)
    node_id = api.register(agent_id=AGENT_A).json()["node_id"]
    second = assert_problem(api.register(agent_id=AGENT_B), 409, "node-taken")
    assert "gpu-1" in second["detail"] and "--name" in second["detail"]
    for method, path in (("POST", f"/v1/agent/nodes/{node_id}/heartbeat"),
                         ("GET", f"/v1/agent/nodes/{node_id}/assignments")):  # fmt: skip
        answer = api.client.request(method, path, headers=api.agent_headers(AGENT_B))
        assert_problem(answer, 409, "node-taken")
    assert api.register(agent_id=AGENT_A).status_code == 200  # the holder may come back

    time.sleep(0.7)  # the first agent fell silent: the node may pass on
    assert api.register(agent_id=AGENT_B).status_code == 200
    stale = api.client.post(f"/v1/agent/nodes/{node_id}/heartbeat",
                            headers=api.agent_headers(AGENT_A))  # fmt: skip
    assert_problem(stale, 409, "node-taken")


# -- a broken artifact disk ---------------------------------------------------------------


def test_logs_that_cannot_be_stored_are_a_503_and_the_reason_shows_in_inspect(api: Api) -> None:
    job_id, node_id = api.running_job()
    jobs_dir = api.services.artifacts.root / "jobs"
    shutil.rmtree(jobs_dir, ignore_errors=True)
    jobs_dir.write_text("not a directory")  # writes under it fail, even for root
    path = f"/v1/agent/jobs/{job_id}/logs"
    refused = api.client.post(path, params={"offset": 0}, headers=api.agent_headers(),
                              content=b"line\n")  # fmt: skip
    body = assert_problem(refused, 503, "storage-unavailable")
    assert refused.headers["Retry-After"] and "nothing was lost" in body["detail"]

    message = f"{body['detail']}; the whole log is kept on node gpu-1"
    for _ in range(2):  # a resend records nothing new
        noted = api.report(job_id, node_id, "logs_unavailable", message=message, offset=0,
                           written=5)  # fmt: skip
        assert noted.status_code == 200
    job = api.client.get("/v1/jobs/victim", headers=api.headers).json()
    assert job["status"] == "in progress"
    assert job["logs_unavailable"]["message"] == message
    assert (job["logs_unavailable"]["offset"], job["logs_unavailable"]["written"]) == (0, 5)
    assert [e["event"] for e in job["history"]].count("LogsUnavailable") == 1

    jobs_dir.unlink()  # the disk is repaired: the agent's resend goes through
    again = api.client.post(path, params={"offset": 0}, headers=api.agent_headers(),
                            content=b"line\n")  # fmt: skip
    assert again.json() == {"size": 5}


def test_a_stop_that_races_an_exit_0_keeps_the_exit_code_in_the_history(api: Api) -> None:
    job_id, node_id = api.running_job()
    assert api.client.post("/v1/jobs/victim/stop", headers=api.headers).status_code == 202
    assert api.report(job_id, node_id, "stopped", exit_code=0).status_code == 200
    job = api.client.get("/v1/jobs/victim", headers=api.headers).json()
    assert job["status"] == "stopped"
    assert job["history"][-1]["facts"]["exit_code"] == 0
    assert job["stop"]["exit_code"] == 0 and job["stop"]["accelerators_allocated"] is True


def test_the_end_a_node_dates_is_the_jobs_end_within_its_start_and_its_report(api: Api) -> None:
    def job(name: str) -> dict[str, Any]:
        return dict(api.client.get(f"/v1/jobs/{name}", headers=api.headers).json())

    job_id, node_id = api.running_job()
    started = datetime.fromisoformat(job("victim")["started_at"])
    time.sleep(0.3)  # the outputs' upload, or an agent that was down, between end and report
    said = started + timedelta(seconds=0.1)
    for bad in ("yesterday", "2026-12-05T16:00:00"):  # no offset: whose clock?
        refused = api.report(job_id, node_id, "exited", exit_code=0, ended_at=bad)
        assert refused.status_code == 422 and refused.json()["field"] == "ended_at", refused.text
    ended = api.report(job_id, node_id, "exited", exit_code=0, ended_at=said.isoformat())
    assert ended.status_code == 200, ended.text
    done = job("victim")
    assert done["status"] == "succeeded"
    assert datetime.fromisoformat(done["ended_at"]) == said
    assert done["duration_seconds"] == pytest.approx(0.1, abs=0.002)
    assert done["history"][-1]["facts"]["ended_at"] == said.astimezone(UTC).isoformat()

    before, _ = api.running_job("early")  # a node clock behind: never before the start
    too_early = started - timedelta(hours=1)
    lost = api.report(before, node_id, "failed", code="node_lost", message="gone",
                      ended_at=too_early.isoformat())  # fmt: skip
    assert lost.status_code == 200, lost.text
    assert job("early")["ended_at"] == job("early")["started_at"]
