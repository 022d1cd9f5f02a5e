"""Whose a failure is, through the agent's report route and the views (each store): an
infrastructure failure that an agent notices (it restarted and found its job never launched or
gone, it failed while the job built or waited) is retried while the job has retries left, as
when the server loses the node; only then does the job fail, and `inspect` and the console
say it was the infrastructure's, and how many retries were spent. A failure of the job's own
is never retried as one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from cli.output.jobs import render_job
from node_agent.shipping import LOST_WHILE_AWAY, NEVER_LAUNCHED
from tests.console import console_site
from tests.integration.test_hostile_requests import SPEC as HOSTILE_SPEC
from tests.integration.test_hostile_requests import Api, open_api

__all__ = ["open_api"]  # its fixture applies here too

SPEC: dict[str, Any] = {**HOSTILE_SPEC}


def submit(api: Api, name: str, **fields: Any) -> tuple[str, str]:
    """A job placed on node gpu-1 (2 accelerators), building there: its id and the node's."""
    node_id = api.register().json()["node_id"]
    answer = api.client.post("/v1/jobs", headers=api.headers, json={**SPEC, "name": name,
                                                                    **fields})  # fmt: skip
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    api.services.jobs.begin_scheduling(UUID(job_id))
    placed = api.services.jobs.assign(UUID(job_id), node_id, "gpu-1")
    api.services.projector.wait(placed.position)
    return job_id, node_id


def running(api: Api, name: str, **fields: Any) -> tuple[str, str]:
    job_id, node_id = submit(api, name, **fields)
    answer = api.report(job_id, node_id, "built", commit="c0ffee")
    assert answer.status_code == 200 and answer.json()["status"] == "in progress", answer.text
    return job_id, node_id


def inspect(api: Api, name: str) -> dict[str, Any]:
    api.services.projector.catch_up()
    answer = api.client.get(f"/v1/jobs/{name}", headers=api.headers)
    assert answer.status_code == 200, answer.text
    document: dict[str, Any] = answer.json()
    return document


def place_again(api: Api, job_id: str, node_id: str) -> None:
    """The scheduler places the retried job on gpu-1 again, and it builds and starts."""
    placed = api.services.jobs.assign(UUID(job_id), node_id, "gpu-1")
    api.services.projector.wait(placed.position)
    answer = api.report(job_id, node_id, "built", commit="c0ffee")
    assert answer.json()["status"] == "in progress", answer.text


def test_an_agent_that_restarted_to_find_its_job_never_launched_has_it_retried(
    open_api: Callable[..., Api],
) -> None:
    api = open_api()
    job_id, node_id = running(api, "sturdy", max_retries=2)
    answer = api.report(job_id, node_id, "failed", code="node_lost", message=NEVER_LAUNCHED)
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "scheduling"

    job = inspect(api, "sturdy")
    assert (job["status"], job["attempt"], job["retries_left"]) == ("scheduling", 2, 1)
    assert job["failure"] is None
    assert job["attempts"][0]["cause"] == "node_lost"
    retried = [entry for entry in job["history"] if entry["event"] == "Retried"]
    assert retried[0]["facts"]["message"] == f"{NEVER_LAUNCHED} on node gpu-1; 1 retries left"
    assert retried[0]["by"] == {"kind": "agent", "id": "gpu-1"}
    assert "retries: 1 of 2 spent, 1 left" in render_job(job)


def test_the_same_report_fails_a_job_without_retries_saying_whose_failure_it_was(
    open_api: Callable[..., Api],
) -> None:
    api = open_api()
    job_id, node_id = running(api, "fragile")
    api.report(job_id, node_id, "failed", code="node_lost", message=LOST_WHILE_AWAY)

    job = inspect(api, "fragile")
    assert job["status"] == "failed"
    assert job["failure"] == {"code": "node_lost", "message": LOST_WHILE_AWAY,
                              "kind": "infrastructure"}  # fmt: skip
    shown = render_job(job)
    assert "kind: the infrastructure's, not the job's; it was run without retries: with " \
        "--max-retries N such a failure runs it again from its last checkpoint" in shown
    assert "run the job again" not in shown and "\nretries:" not in shown


def test_after_its_retries_are_spent_an_infrastructure_failure_fails_the_job_saying_so(
    open_api: Callable[..., Api],
) -> None:
    api = open_api()
    job_id, node_id = running(api, "twice", max_retries=1)
    api.report(job_id, node_id, "failed", code="node_lost", message=NEVER_LAUNCHED)
    place_again(api, job_id, node_id)
    api.report(job_id, node_id, "failed", code="node_lost", message=LOST_WHILE_AWAY)

    job = inspect(api, "twice")
    assert (job["status"], job["attempt"], job["retries_left"]) == ("failed", 2, 0)
    assert job["failure"]["kind"] == "infrastructure"
    shown = render_job(job)
    assert "the infrastructure's, not the job's, after all 1 retries were spent" in shown
    assert "retries: 1 of 1 spent, 0 left" in shown
    assert [a["cause"] for a in job["attempts"]] == ["node_lost", "failed"]


def test_an_agent_that_fails_while_the_job_builds_spends_a_retry(
    open_api: Callable[..., Api],
) -> None:
    api = open_api()
    job_id, node_id = submit(api, "builder", max_retries=1)
    message = "the node agent failed while running the job: [Errno 28] No space left on device"
    answer = api.report(job_id, node_id, "build_failed", code="node_lost", message=message)
    assert answer.status_code == 200 and answer.json()["status"] == "scheduling", answer.text

    job = inspect(api, "builder")
    assert (job["attempt"], job["retries_left"]) == (2, 0)
    never_started = job["attempts"][0]
    assert never_started["started_at"] is None and never_started["ended_at"] is not None
    assert (never_started["cause"], never_started["nodes"]) == ("node_lost", ["gpu-1"])


def test_a_job_waiting_for_its_accelerators_whose_agent_failed_looks_for_another_node(
    open_api: Callable[..., Api],
) -> None:
    api = open_api()
    running(api, "holder", accels=2)
    job_id, node_id = submit(api, "waiter", accels=2)  # no retries
    answer = api.report(job_id, node_id, "built", commit="c0ffee")
    assert answer.json()["status"] == "enqueued", answer.text
    api.report(job_id, node_id, "build_failed", code="node_lost", message="agent failed")

    job = inspect(api, "waiter")
    assert job["status"] == "scheduling" and job["failure"] is None
    assert job["history"][-1]["event"] == "Requeued"
    assert job["history"][-1]["facts"]["reason"] == (
        "agent failed on node gpu-1; the job looks for another node"
    )


def test_a_failure_of_the_jobs_own_is_never_retried_as_one_of_the_infrastructure(
    open_api: Callable[..., Api],
) -> None:
    api = open_api()
    job_id, node_id = running(api, "overran", max_retries=3, retry_on_exit_codes=[143])
    answer = api.report(job_id, node_id, "failed", code="time_limit_exceeded", exit_code=143,
                        message="the job ran past its time limit of 1m")  # fmt: skip
    assert answer.status_code == 200, answer.text

    job = inspect(api, "overran")
    assert (job["status"], job["retries_left"]) == ("failed", 3)
    assert job["failure"]["kind"] == "user"
    assert "kind: the job's own (its code or its spec)" in render_job(job)


def test_the_console_shows_whose_failure_it_was_as_inspect_does(
    database_url: str, tmp_path: Any
) -> None:
    with console_site(database_url, tmp_path / "data") as site:
        alice = site.person("alice")
        job_id = alice.submit("fragile")["id"]
        jobs = site.services.jobs
        node_id, _ = jobs.register_node("gpu-1", accels=1, accel_type="H100")
        jobs.begin_scheduling(UUID(job_id))
        jobs.assign(UUID(job_id), node_id, "gpu-1")
        jobs.report(UUID(job_id), node_id, {"node_id": node_id, "type": "built"})
        jobs.report(UUID(job_id), node_id, {"node_id": node_id, "type": "failed",
                                            "code": "node_lost", "message": NEVER_LAUNCHED})
        site.services.projector.catch_up()
        page = alice.client.get("/jobs/fragile")
        assert page.status_code == 200, page.text
        assert (f"{NEVER_LAUNCHED} (the infrastructure&#39;s, not the job&#39;s; it was run "
                "without retries") in page.text  # fmt: skip
        past = alice.client.get("/jobs/fragile?version=6")  # folded from the ledger
        assert "the infrastructure&#39;s, not the job&#39;s" in past.text
