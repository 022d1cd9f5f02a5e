"""Logs and outputs per attempt, on every store (local files, an S3 bucket) and database: a job
retried after its first attempt keeps each attempt's log and output apart. Reads name the
attempt (``attempt``, ``--attempt K``; default: the last), the first attempt's stay where every
job's always were, and an attempt the job never had is a 404 problem naming those it had."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest
import uvicorn

from common.attempts import attempt_key
from tests.integration.artifact_api import (
    AGENT,
    OUTPUT,
    SPEC,
    Api,
    api,
    sha256,
    store_settings,
    zip_of,
)
from tests.integration.test_api_problems import assert_problem
from tests.s3 import SeaweedFS
from tests.support import wait_until

__all__ = ["api", "store_settings"]  # fixtures

FIRST_LOG = b"attempt 1: step 1\nattempt 1: step 2, then killed\n"
SECOND_LOG = b"attempt 2: resumed from step 2\n"
SECOND_OUTPUT = zip_of({"weights.bin": os.urandom(100_000), "eval.json": b'{"accuracy": 0.95}'})


def retrying_job(api: Api) -> str:
    """A job of the admin's that is retried once after exit code 137, its first attempt
    running on node gpu-1 (held by AGENT)."""
    api.node_id = api.client.post("/v1/agent/nodes", headers=api.agent, json={
        "name": "gpu-1", "accels": 2, "agent_id": AGENT}).json()["node_id"]  # fmt: skip
    submitted = api.client.post("/v1/jobs", headers=api.user, json={
        **SPEC, "name": "trainer", "max_retries": 1, "retry_on_exit_codes": [137]})  # fmt: skip
    assert submitted.status_code == 201, submitted.text
    job_id: str = submitted.json()["id"]
    api.services.jobs.begin_scheduling(UUID(job_id))
    run_again(api, job_id)
    return job_id


def run_again(api: Api, job_id: str) -> None:
    placed = api.services.jobs.assign(UUID(job_id), api.node_id, "gpu-1")
    api.services.projector.wait(placed.position)
    api.report(job_id, "built", commit="c0ffee")


def retried(api: Api, job_id: str) -> None:
    """The attempt ends with exit code 137: the job is retried, and its next attempt runs."""
    api.report(job_id, "exited", exit_code=137)
    document = api.services.queries.job(job_id)
    assert document is not None and document["status"] == "scheduling"
    run_again(api, job_id)


def ship(api: Api, job_id: str, offset: int, data: bytes, attempt: int | None = None) -> None:
    """Log bytes as the agent ships them (the first attempt's without ``attempt``)."""
    params: dict[str, Any] = {"offset": offset}
    if attempt is not None:
        params["attempt"] = attempt
    shipped = api.client.post(f"/v1/agent/jobs/{job_id}/logs", params=params, headers=api.agent,
                              content=data)  # fmt: skip
    assert shipped.status_code == 200, shipped.text
    assert shipped.json()["size"] == offset + len(data)


def send_output(api: Api, job_id: str, data: bytes, attempt: int | None = None) -> Any:
    """An output archive uploaded as the agent does (the first attempt's without ``attempt``);
    the completion's answer."""
    params = {} if attempt is None else {"attempt": attempt}
    begun = api.client.post(f"/v1/agent/jobs/{job_id}/uploads", headers=api.agent,
                            params=params, json={"kind": "output", "node_id": api.node_id,
                                                 "node_index": 0, "size_hint": len(data)})
    assert begun.status_code == 201, begun.text
    upload_id, size = begun.json()["id"], begun.json()["part_size"]
    pieces = [data[start : start + size] for start in range(0, len(data), size)]
    asked = api.client.post(f"/v1/agent/uploads/{upload_id}/parts", headers=api.agent,
                            json={"numbers": list(range(1, len(pieces) + 1))})  # fmt: skip
    parts = []
    for target, piece in zip(asked.json()["parts"], pieces, strict=True):
        if target["url"].startswith("/"):
            sent = api.client.put(target["url"], headers=api.agent, content=piece)
            etag = sent.json()["etag"]
        else:  # the store itself, presigned
            sent = httpx.put(target["url"], headers=target["headers"], content=piece)
            etag = sent.headers["ETag"]
        assert sent.status_code == 200, sent.text
        parts.append({"number": target["number"], "etag": etag})
    return api.client.post(f"/v1/agent/uploads/{upload_id}/complete", headers=api.agent,
                           json={"parts": parts, "size": len(data),
                                 "sha256": hashlib.sha256(data).hexdigest()})  # fmt: skip


def logs(api: Api, **params: Any) -> httpx.Response:
    return api.client.get("/v1/jobs/trainer/logs", headers=api.user, params=params)


def test_each_attempts_log_is_read_back_by_its_attempt_and_the_default_is_the_last(
    api: Api,
) -> None:
    job_id = retrying_job(api)
    ship(api, job_id, 0, FIRST_LOG[:18])
    ship(api, job_id, 18, FIRST_LOG[18:])
    retried(api, job_id)

    ship(api, job_id, 0, SECOND_LOG, attempt=2)  # each attempt's log starts at byte 0

    latest = logs(api)
    assert latest.content == SECOND_LOG and latest.headers["x-flexai-attempt"] == "2"
    assert logs(api, attempt=1).content == FIRST_LOG
    assert logs(api, attempt=2).content == SECOND_LOG
    assert logs(api, attempt=1, offset=18).content == FIRST_LOG[18:]
    # The first attempt's log is where every job's always was.
    assert api.services.artifacts.read_log(job_id, 0) == FIRST_LOG
    assert api.services.artifacts.read_log(attempt_key(job_id, 2), 0) == SECOND_LOG


def test_following_an_attempt_the_job_moved_on_from_sends_it_all_then_ends(api: Api) -> None:
    job_id = retrying_job(api)
    ship(api, job_id, 0, FIRST_LOG)
    retried(api, job_id)

    followed = logs(api, attempt=1, follow="true")  # the job runs on: only the attempt ended

    assert followed.status_code == 200 and followed.content == FIRST_LOG
    assert followed.headers["x-flexai-attempt"] == "1"


def test_an_attempt_the_job_never_had_is_a_404_problem_naming_those_it_had(api: Api) -> None:
    job_id = retrying_job(api)
    assert_problem(logs(api, attempt=2), 404, "attempt-not-found")
    retried(api, job_id)

    for answer in (logs(api, attempt=3), logs(api, attempt=3, follow="true"),
                   api.client.get("/v1/jobs/trainer/outputs/0", headers=api.user,
                                  params={"attempt": 3})):  # fmt: skip
        problem = assert_problem(answer, 404, "attempt-not-found")
        assert problem["attempts"] == [1, 2]
        assert "attempts 1 to 2, not attempt 3" in problem["detail"]
    assert_problem(logs(api, attempt=0), 422, "invalid-request")
    refused = api.client.post(f"/v1/agent/jobs/{job_id}/logs", headers=api.agent,
                              params={"offset": 0, "attempt": 1001}, content=b"x")  # fmt: skip
    assert_problem(refused, 422, "invalid-request")


def test_a_node_the_job_does_not_run_on_is_a_404_problem_naming_its_nodes(api: Api) -> None:
    job_id = retrying_job(api)  # one node
    ship(api, job_id, 0, FIRST_LOG)
    for answer in (logs(api, node_index=1), logs(api, node_index=5, follow="true"),
                   api.client.get("/v1/jobs/trainer/outputs/1", headers=api.user)):  # fmt: skip
        problem = assert_problem(answer, 404, "node-not-found")
        assert problem["nodes"] == 1
        assert "runs on node 0 only" in problem["detail"]
    assert logs(api, node_index=0).content == FIRST_LOG


def test_a_job_that_ended_before_it_ran_has_no_output_and_is_not_told_to_wait(
    api: Api,
) -> None:
    submitted = api.client.post("/v1/jobs", headers=api.user, json={**SPEC, "name": "early"})
    assert submitted.status_code == 201, submitted.text
    waiting = api.client.get("/v1/jobs/early/outputs/0", headers=api.user)
    assert "no output for node 0 yet" in assert_problem(waiting, 404, "not-found")["detail"]
    stopped = api.client.post("/v1/jobs/early/stop", headers=api.user)
    assert stopped.status_code == 202 and stopped.json()["status"] == "stopped", stopped.text

    problem = assert_problem(api.client.get("/v1/jobs/early/outputs/0", headers=api.user), 404,
                             "not-found")  # fmt: skip
    assert problem["title"] == "No output"
    assert "(stopped) ended before its entry point ran" in problem["detail"]
    assert "yet" not in problem["detail"]


def fetched(api: Api, **params: Any) -> httpx.Response:
    query = "".join(f"?attempt={value}" for value in params.values())
    return api.download(f"/v1/jobs/trainer/outputs/0{query}", api.user)


def test_each_attempts_output_is_fetched_by_its_attempt_and_the_default_is_the_last_recorded(
    api: Api,
) -> None:
    job_id = retrying_job(api)
    first = send_output(api, job_id, OUTPUT)
    assert first.status_code == 200, first.text
    retried(api, job_id)
    waiting = fetched(api)  # attempt 2 recorded no output yet: attempt 1's
    assert waiting.content == OUTPUT and waiting.headers["x-flexai-sha256"] == sha256(OUTPUT)

    second = send_output(api, job_id, SECOND_OUTPUT, attempt=2)
    api.report(job_id, "exited", exit_code=0)

    assert second.status_code == 200, second.text
    assert second.json()["sha256"] == sha256(SECOND_OUTPUT)
    for latest in (fetched(api), fetched(api, attempt=2)):
        assert latest.status_code == 200 and latest.content == SECOND_OUTPUT
        assert latest.headers["x-flexai-sha256"] == sha256(SECOND_OUTPUT)
    earlier = fetched(api, attempt=1)
    assert earlier.status_code == 200 and earlier.content == OUTPUT
    assert earlier.headers["x-flexai-size"] == str(len(OUTPUT))
    assert api.stored_keys(f"jobs/{job_id}/") == sorted([
        f"jobs/{job_id}/outputs/output_0.zip",  # the first attempt's, where it always was
        f"jobs/{job_id}/attempts/2/outputs/output_0.zip",
    ])  # fmt: skip


def test_admin_verify_finds_each_attempts_output_under_its_own_key(api: Api) -> None:
    job_id = retrying_job(api)
    send_output(api, job_id, OUTPUT)
    retried(api, job_id)
    send_output(api, job_id, SECOND_OUTPUT, attempt=2)
    api.report(job_id, "exited", exit_code=0)

    def verify() -> dict[str, Any]:
        answer = api.client.post("/v1/admin/verify", headers=api.user,
                                 json={"artifacts": "deep"})  # fmt: skip
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    whole = verify()
    assert (whole["ok"], whole["artifacts_checked"], whole["artifact_problems"]) == (True, 2, [])
    second = f"jobs/{job_id}/attempts/2/outputs/output_0.zip"
    api.behind_the_servers_back(second, None)
    assert [(p["key"], p["problem"]) for p in verify()["artifact_problems"]] == [
        (second, "missing from the artifact store")]


def test_deleting_a_jobs_artifacts_takes_every_attempts_logs_and_outputs(api: Api) -> None:
    job_id = retrying_job(api)
    ship(api, job_id, 0, FIRST_LOG)
    retried(api, job_id)
    if api.services.artifacts.kind == "s3":  # the ended attempt's log goes to the bucket first
        wait_until(lambda: api.stored_keys(f"jobs/{job_id}/logs/"), timeout=5)
    ship(api, job_id, 0, SECOND_LOG, attempt=2)
    send_output(api, job_id, SECOND_OUTPUT, attempt=2)

    api.services.artifacts.delete_job(job_id)

    assert api.services.artifacts.log_size(job_id) == 0
    assert api.services.artifacts.log_size(attempt_key(job_id, 2)) == 0
    assert api.stored_keys(f"jobs/{job_id}/") == []


def log_parts(s3_server: SeaweedFS, bucket: str, prefix: str) -> list[bytes]:
    client = s3_server.client()
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"routes/{prefix}logs/")
    return [client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            for item in sorted(listed.get("Contents", ()), key=lambda item: item["Key"])]


@pytest.mark.parametrize("store_settings", ["s3"], indirect=True)
def test_every_attempts_last_log_lines_go_to_the_bucket_once_the_attempt_ends(
    api: Api, s3_server: SeaweedFS, s3_bucket: str
) -> None:
    job_id = retrying_job(api)
    first, second = f"jobs/{job_id}/", f"jobs/{job_id}/attempts/2/"
    ship(api, job_id, 0, FIRST_LOG)
    retried(api, job_id)
    wait_until(lambda: log_parts(s3_server, s3_bucket, first), timeout=5)
    ship(api, job_id, 0, SECOND_LOG, attempt=2)
    assert log_parts(s3_server, s3_bucket, second) == []  # less than a part: held for now

    api.report(job_id, "exited", exit_code=0)

    wait_until(lambda: log_parts(s3_server, s3_bucket, second), timeout=5)
    assert log_parts(s3_server, s3_bucket, first) == [FIRST_LOG]
    assert log_parts(s3_server, s3_bucket, second) == [SECOND_LOG]
    assert logs(api, attempt=1).content == FIRST_LOG and logs(api).content == SECOND_LOG


# -- the CLI against the control plane, served ------------------------------------------------


@pytest.fixture
def served(api: Api, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """The same app on a real port, the CLI pointed at it with the admin's token."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(api.client.app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout=10)
    url = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("FLEXAI_CONFIG", str(tmp_path / "absent-config.json"))
    monkeypatch.setenv("FLEXAI_API_URL", url)
    monkeypatch.setenv("FLEXAI_TOKEN", api.user["Authorization"].removeprefix("Bearer "))
    yield url
    server.should_exit = True
    thread.join(timeout=10)


def test_the_cli_reads_the_log_and_fetches_the_output_of_the_attempt_asked(
    api: Api, served: str, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    from cli.main import main

    job_id = retrying_job(api)
    ship(api, job_id, 0, FIRST_LOG)
    send_output(api, job_id, OUTPUT)
    retried(api, job_id)
    ship(api, job_id, 0, SECOND_LOG, attempt=2)
    send_output(api, job_id, SECOND_OUTPUT, attempt=2)

    assert main(["training", "logs", "trainer"]) == 0
    assert capsysbinary.readouterr().out == SECOND_LOG
    assert main(["training", "logs", "trainer", "--attempt", "1"]) == 0
    assert capsysbinary.readouterr().out == FIRST_LOG
    assert main(["training", "logs", "trainer", "--attempt", "3"]) == 1
    assert b"attempts 1 to 2, not attempt 3" in capsysbinary.readouterr().err
    assert main(["training", "logs", "trainer", "--attempt", "0"]) == 2
    assert b"must be a whole number from 1 to 1000, not '0'" in capsysbinary.readouterr().err

    assert main(["training", "fetch", "trainer", "--attempt", "1", "-o", str(tmp_path)]) == 0
    assert (tmp_path / "output_0.zip").read_bytes() == OUTPUT
    assert main(["training", "fetch", "trainer", "-o", str(tmp_path)]) == 0
    assert (tmp_path / "output_0.zip").read_bytes() == SECOND_OUTPUT


def test_following_the_current_attempt_ends_when_the_job_moves_on_saying_how_to_follow_on(
    api: Api, served: str, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    from cli.main import main

    job_id = retrying_job(api)
    ship(api, job_id, 0, FIRST_LOG)
    followed: list[int] = []
    follower = threading.Thread(
        target=lambda: followed.append(main(["training", "logs", "trainer", "--follow"])))
    follower.start()
    wait_until(lambda: api.services.log_followers.count == 1, timeout=10)

    retried(api, job_id)
    ship(api, job_id, 0, SECOND_LOG, attempt=2)  # the next attempt's bytes are not shown
    follower.join(timeout=20)

    assert followed == [0]
    shown = capsysbinary.readouterr()
    assert shown.out == FIRST_LOG
    assert shown.err.decode().strip() == (
        "attempt 1 ended (exit code 137); follow attempt 2 with --attempt 2: "
        "flexai training logs trainer --follow --attempt 2"
    )
