"""Many jobs in one ``POST /v1/jobs`` on each store: each job answered alone, in order, the
accepted ones created as single submissions are, a refused one failing by itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.identity.identities import ensure_admin_token
from api.services import build_services
from api.settings import Settings
from common.contract import MAX_SUBMISSIONS
from domain.actors import user
from domain.application import Outcome, TrainingJobs
from domain.errors import InvalidJobSpec, NameGivenTwice, NameTaken
from tests.integration.conftest import job_spec

SPEC = {"repository_url": "https://example.com/org/repo.git", "entry_point": ["train.py"]}
Api = tuple[TestClient, dict[str, str]]


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[Api]:
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    services = build_services(settings)
    token, _ = ensure_admin_token(services.identities, settings.data_dir)
    with TestClient(create_app(services, background=False)) as client:
        yield client, {"Authorization": f"Bearer {token}"}
    services.close()


def job(name: str, **fields: Any) -> dict[str, Any]:
    return {**SPEC, "name": name, **fields}


def listed_names(client: TestClient, headers: dict[str, str]) -> set[str]:
    answer = client.get("/v1/jobs", headers=headers, params={"limit": 500})
    return {row["name"] for row in answer.json()["jobs"]}


def test_a_list_of_valid_jobs_creates_each_as_a_single_submission_would(api: Api) -> None:
    client, headers = api
    single = client.post("/v1/jobs", headers=headers, json=job("single", env={"LR": "1"}))
    jobs = [job(f"grid-{index}", env={"LR": str(index)}) for index in range(1, 6)]
    answer = client.post("/v1/jobs", headers=headers, json=jobs)
    assert answer.status_code == 207, answer.text
    body = answer.json()
    assert (body["created"], body["failed"]) == (5, 0)
    assert [result["status"] for result in body["results"]] == [201] * 5
    created = [result["job"] for result in body["results"]]
    assert [one["name"] for one in created] == [f"grid-{index}" for index in range(1, 6)]
    assert [one["spec"]["env"] for one in created] == [{"LR": str(i)} for i in range(1, 6)]
    assert set(created[0]) == set(single.json())  # the same shape as a single job's answer
    assert {**created[0]["spec"], "env": {}} == {**single.json()["spec"], "env": {}}
    assert created[0]["status"] == "pending"
    assert int(answer.headers["X-Flexai-Position"]) > int(single.headers["X-Flexai-Position"])
    inspected = client.get("/v1/jobs/grid-3", headers=headers).json()
    assert inspected["id"] == created[2]["id"] and inspected["spec"]["env"] == {"LR": "3"}
    assert listed_names(client, headers) == {"single", *(one["name"] for one in created)}


def test_an_invalid_job_and_a_taken_name_fail_alone_and_the_others_are_created(
    api: Api,
) -> None:
    client, headers = api
    assert client.post("/v1/jobs", headers=headers, json=job("taken")).status_code == 201
    jobs = [job("ok-1"), job("taken"), job("ok-2", accels=0), {"name": "ok-3"}, job("ok-4"),
            job("ok-4"), job("ok-5", checkpoint="nowhere"), job("ok-6")]  # fmt: skip
    answer = client.post("/v1/jobs", headers=headers, json=jobs)
    assert answer.status_code == 207, answer.text
    body = answer.json()
    statuses = [result["status"] for result in body["results"]]
    assert statuses == [201, 409, 422, 422, 201, 409, 404, 201]
    assert (body["created"], body["failed"]) == (3, 5)
    problems = [result["problem"] for result in body["results"] if result["problem"]]
    slugs = [problem["type"].rsplit("/", 1)[1] for problem in problems]
    assert slugs == ["name-taken", "invalid-request", "invalid-request", "name-taken",
                     "checkpoint-not-found"]  # fmt: skip
    assert all(problem["status"] and problem["title"] for problem in problems)
    assert "delete that job first" in problems[0]["detail"]
    assert "given to an earlier job of this list too" in problems[3]["detail"]  # ok-4 again
    assert "accels" in problems[1]["detail"]
    assert "repository_url" in problems[2]["detail"] and "entry_point" in problems[2]["detail"]
    assert listed_names(client, headers) == {"taken", "ok-1", "ok-4", "ok-6"}


def test_a_list_over_the_limit_or_empty_is_refused_whole(api: Api) -> None:
    client, headers = api
    too_many = [job(f"many-{index}") for index in range(MAX_SUBMISSIONS + 1)]
    answer = client.post("/v1/jobs", headers=headers, json=too_many)
    assert answer.status_code == 413, answer.text
    assert answer.json()["limit"] == MAX_SUBMISSIONS
    assert "send them in several" in answer.json()["detail"]
    empty = client.post("/v1/jobs", headers=headers, json=[])
    assert empty.status_code == 422 and "empty" in empty.json()["detail"]
    assert listed_names(client, headers) == set()


def test_a_single_job_is_answered_as_before(api: Api) -> None:
    client, headers = api
    created = client.post("/v1/jobs", headers=headers, json=job("alone"))
    assert created.status_code == 201 and created.json()["name"] == "alone"
    invalid = client.post("/v1/jobs", headers=headers, json={"name": "x"})
    assert invalid.status_code == 422
    assert invalid.json()["detail"].startswith("the request is invalid: name: ")
    not_a_job = client.post("/v1/jobs", headers=headers, json="text")
    assert not_a_job.status_code == 422
    assert "body: Input should be a valid dictionary" in not_a_job.json()["detail"]


def test_submit_many_saves_the_accepted_jobs_once_each_with_its_name_claimed(
    app: TrainingJobs,
) -> None:
    by, spec = user("alice"), job_spec()
    earlier = app.submit("alice", "run-2", spec, by=by)
    results = app.submit_many("alice", [("run-1", spec), ("run-2", spec), ("bad name", spec),
                                        ("run-3", spec), ("run-1", spec)], by=by)  # fmt: skip
    kinds = [type(result) for result in results]
    assert kinds == [Outcome, NameTaken, InvalidJobSpec, Outcome, NameGivenTwice]
    saved = [result for result in results if isinstance(result, Outcome)]
    holders = [app.job_id_for("alice", name) for name in ("run-1", "run-2", "run-3")]
    assert holders == [saved[0].job_id, earlier.job_id, saved[1].job_id]
    assert all(result.position and result.position > (earlier.position or 0) for result in saved)
    again = app.submit_many("alice", [("run-4", spec), ("run-5", spec)], by=by)
    assert [type(result) for result in again] == [Outcome, Outcome]
