"""The artifact routes on every store (local files, an S3 bucket on SeaweedFS) and database: an
agent's upload session, its parts and its completion record a checkpoint or an output with its
size and SHA-256, once; downloads say what the bytes must be, from the store or the server; an
ended job's log goes to the bucket at once, or once the bucket is back."""

from __future__ import annotations

import io
import time
import zipfile
from uuid import UUID

import httpx
import pytest

from api.artifacts import settling
from domain.datasets import Dataset
from domain.ids import checkpoint_id
from tests.integration.artifact_api import (
    CHECKPOINT,
    OUTPUT,
    SPEC,
    Api,
    api,
    sha256,
    store_settings,
)
from tests.integration.test_api_problems import assert_problem
from tests.s3 import SeaweedFS
from tests.support import wait_until

__all__ = ["api", "store_settings"]  # fixtures


def test_a_checkpoint_sent_in_parts_is_recorded_with_its_archive_size_and_sha256(api: Api) -> None:
    job_id = api.running_job()

    answer = api.send(job_id, CHECKPOINT, name="checkpoint-7")

    assert answer.status_code == 200, answer.text
    recorded = answer.json()
    assert (recorded["name"], recorded["step"]) == ("checkpoint-7", 7)
    assert (recorded["archive_size"], recorded["sha256"]) == (len(CHECKPOINT), sha256(CHECKPOINT))
    listed = api.client.get("/v1/jobs/trainer/checkpoints", headers=api.user).json()
    assert listed["checkpoints"] == [recorded]


def test_a_checkpoint_the_ledger_holds_before_the_views_show_it_completes_all_the_same(
    api: Api,
) -> None:
    """An earlier completion recorded it, and its answer was lost (the database went away
    after the commit): the views may not show it yet when the agent completes again."""
    job_id = api.running_job()
    checkpoint = {"id": checkpoint_id(UUID(job_id), "checkpoint-7", 0), "name": "checkpoint-7",
                  "node": "gpu-1", "node_index": 0, "step": 7,
                  "archive_size": len(CHECKPOINT), "sha256": sha256(CHECKPOINT)}  # fmt: skip
    recorded = api.services.jobs.record_checkpoint(UUID(job_id), api.node_id, checkpoint)
    assert recorded.position is not None  # in the ledger, not yet in the views
    assert api.services.queries.checkpoints(job_id) == []

    answer = api.send(job_id, CHECKPOINT, name="checkpoint-7")

    assert answer.status_code == 200, answer.text
    assert (answer.json()["id"], answer.json()["step"]) == (checkpoint["id"], 7)
    assert api.events(job_id).count("CheckpointRecorded") == 1


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


def log_parts(s3_server: SeaweedFS, bucket: str, job_id: str) -> list[bytes]:
    """The parts of a job's log in the bucket, oldest first."""
    client = s3_server.client()
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"routes/jobs/{job_id}/logs/")
    return [client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            for item in sorted(listed.get("Contents", ()), key=lambda item: item["Key"])]


def ship_log(api: Api, job_id: str, offset: int, data: bytes) -> None:
    shipped = api.client.post(f"/v1/agent/jobs/{job_id}/logs", params={"offset": offset},
                              headers=api.agent, content=data)  # fmt: skip
    assert shipped.status_code == 200, shipped.text


@pytest.mark.parametrize("store_settings", ["s3"], indirect=True)
def test_an_ended_jobs_last_log_lines_are_in_the_bucket_as_soon_as_it_ends(
    api: Api, s3_server: SeaweedFS, s3_bucket: str
) -> None:
    job_id = api.running_job()
    ship_log(api, job_id, 0, b"epoch 1\n")
    ship_log(api, job_id, 8, b"the last line\n")
    assert log_parts(s3_server, s3_bucket, job_id) == []  # less than a part: held for now

    api.report(job_id, "exited", exit_code=0)

    wait_until(lambda: log_parts(s3_server, s3_bucket, job_id), timeout=5)
    assert log_parts(s3_server, s3_bucket, job_id) == [b"epoch 1\nthe last line\n"]
    read = api.client.get("/v1/jobs/trainer/logs", headers=api.user)
    assert read.content == b"epoch 1\nthe last line\n"


@pytest.mark.parametrize("store_settings", ["s3"], indirect=True)
def test_an_ended_jobs_log_waits_while_the_bucket_is_away_and_goes_once_it_is_back(
    api: Api, s3_server: SeaweedFS, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settling, "RETRY_MOST_S", 0.5)  # retried often: the test is short
    job_id = api.running_job()
    ship_log(api, job_id, 0, b"the only line\n")

    with s3_server.stopped():
        started = time.monotonic()
        api.report(job_id, "exited", exit_code=0)
        assert time.monotonic() - started < 2  # the end's report never waits on the bucket
        time.sleep(1.5)  # settles were tried meanwhile, and failed
        read = api.client.get("/v1/jobs/trainer/logs", headers=api.user)
        assert read.status_code == 200 and read.content == b"the only line\n"

    wait_until(lambda: log_parts(s3_server, s3_bucket, job_id), timeout=20)
    assert log_parts(s3_server, s3_bucket, job_id) == [b"the only line\n"]
