"""What an admin does with the artifacts the ledger names, on every store (local files, an S3
bucket on SeaweedFS) and database: `admin verify` finds each one missing or altered behind the
server's back; `admin purge` removes deleted jobs' artifacts once and records it, while a
deleted job's outputs stay fetchable by id until then."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from api.artifacts.store import checkpoint_key, dataset_key, output_key
from domain.ids import checkpoint_id
from tests.integration.artifact_api import (
    CHECKPOINT,
    OUTPUT,
    Api,
    api,
    sha256,
    store_settings,
)
from tests.integration.test_api_problems import assert_problem

__all__ = ["api", "store_settings"]  # fixtures


def ended_job_with_artifacts(api: Api, name: str = "trainer") -> str:
    job_id = api.running_job(name)
    assert api.send(job_id, CHECKPOINT, name="checkpoint-7").status_code == 200
    assert api.send(job_id, OUTPUT).status_code == 200
    api.report(job_id, "exited", exit_code=0)
    return job_id


def verify(api: Api, artifacts: str = "shallow") -> dict[str, Any]:
    answer = api.client.post("/v1/admin/verify", headers=api.user, json={"artifacts": artifacts})
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def purge(api: Api, before: datetime) -> list[dict[str, Any]]:
    answer = api.client.post("/v1/admin/purge", headers=api.user,
                             json={"deleted_before": before.isoformat()})  # fmt: skip
    assert answer.status_code == 200, answer.text
    return list(answer.json()["purged"])


def test_verify_names_each_artifact_missing_or_altered_behind_the_servers_back(api: Api) -> None:
    job_id = ended_job_with_artifacts(api)
    pushed = api.client.put("/v1/datasets/rows", headers=api.user, content=OUTPUT)
    assert pushed.status_code == 200, pushed.text
    checkpoint = checkpoint_key(job_id, checkpoint_id(UUID(job_id), "checkpoint-7"))
    output, dataset = output_key(job_id, 0), dataset_key(sha256(OUTPUT))
    whole = verify(api, "deep")
    assert (whole["ok"], whole["artifacts_checked"], whole["artifact_problems"]) == (True, 3, [])

    api.behind_the_servers_back(output, None)
    api.behind_the_servers_back(dataset, OUTPUT + b"tail")
    flipped = bytearray(CHECKPOINT)
    flipped[1000] ^= 0xFF  # the same size: only its SHA-256 tells
    api.behind_the_servers_back(checkpoint, bytes(flipped))
    shallow, deep = verify(api), verify(api, "deep")

    assert not shallow["ok"] and not deep["ok"]
    found = {(p["job"], p["name"], p["kind"], p["key"]): p["problem"]
             for p in deep["artifact_problems"]}  # fmt: skip
    assert found[(job_id, "trainer", "output", output)] == "missing from the artifact store"
    assert found[(None, "admin/rows", "dataset", dataset)].startswith(
        f"altered: {len(OUTPUT) + 4} bytes in the store, {len(OUTPUT)} recorded")
    assert found[(job_id, "trainer", "checkpoint", checkpoint)] == (
        f"altered: its SHA-256 is {sha256(bytes(flipped))}, the ledger recorded "
        f"{sha256(CHECKPOINT)}")  # fmt: skip
    assert len(found) == 3
    assert {p["kind"] for p in shallow["artifact_problems"]} == {"output", "dataset"}
    skipped = verify(api, "none")
    assert skipped["artifacts_checked"] == 0 and skipped["artifact_problems"] == []


def test_a_deleted_jobs_artifacts_stay_until_purged_once_then_fetching_says_when(
    api: Api,
) -> None:
    job_id = ended_job_with_artifacts(api)
    kept = ended_job_with_artifacts(api, "kept")  # ended, not deleted: never purged
    deleted = api.client.delete("/v1/jobs/trainer", headers=api.user)
    assert deleted.status_code == 200, deleted.text
    deleted_at = datetime.fromisoformat(deleted.json()["deleted_at"])
    by_id = f"/v1/audit/jobs/{job_id}/outputs/0"
    fetched = api.download(by_id, api.user)
    assert fetched.status_code == 200 and fetched.content == OUTPUT  # deleting keeps them
    assert fetched.headers["x-flexai-sha256"] == sha256(OUTPUT)
    assert purge(api, deleted_at - timedelta(seconds=1)) == []

    purged = purge(api, datetime.now(UTC) + timedelta(seconds=1))
    again = purge(api, datetime.now(UTC) + timedelta(seconds=1))

    assert [(job["id"], job["name"], job["objects"]) for job in purged] == [
        (job_id, "trainer", 2)]  # its checkpoint and its output
    assert again == []
    assert api.stored_keys(f"jobs/{job_id}/") == []
    assert api.stored_keys(f"jobs/{kept}/") == sorted([
        output_key(kept, 0), checkpoint_key(kept, checkpoint_id(UUID(kept), "checkpoint-7"))])
    history = api.services.jobs.history(UUID(job_id))
    facts = [(event.objects, event.by) for event in history
             if type(event).__name__ == "ArtifactsPurged"]  # fmt: skip
    assert facts == [(2, {"kind": "user", "id": "admin"})]
    gone = api.client.get(by_id, headers=api.user)
    detail = assert_problem(gone, 410, "artifacts-purged")["detail"]
    assert f"were purged on {history[-1].timestamp.isoformat()}" in detail
    assert verify(api)["ok"]  # a purged job's artifacts are gone on purpose
