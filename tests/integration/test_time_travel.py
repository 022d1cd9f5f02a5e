"""Time travel through the real API and CLI on each store: a job as it was at each version or
moment, folded from the ledger; its event stream; every job that ever held a name."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.identity.identities import ensure_admin_token
from api.services import Services, build_services
from api.settings import Settings
from cli.client.api import ApiClient
from cli.main import main
from domain.lifecycle import EVENT_STATUS
from tests.integration.test_api_problems import SPEC, assert_problem
from tests.support import node_headers

AGENT = "agent-0123456789abcdef"


class Api:
    def __init__(self, app: FastAPI, client: TestClient, services: Services, token: str) -> None:
        self.app, self.client, self.services = app, client, services
        self.headers = {"Authorization": f"Bearer {token}"}
        self.token = token
        self.agent_headers = {**node_headers(services, "gpu-1"), "X-Flexai-Agent-Id": AGENT}
        """Node gpu-1's agent's: the agent routes take its node token, not a user's."""
        self.node_id: str | None = None

    def new_user(self, name: str) -> str:
        """The token of a new user ``name``, no admin."""
        return self.services.identities.create_user(name, admin=False, by="admin").token

    def submit(self, name: str) -> str:
        answer = self.client.post("/v1/jobs", headers=self.headers, json={**SPEC, "name": name})
        assert answer.status_code == 201, answer.text
        job_id: str = answer.json()["id"]
        return job_id

    def report(self, job_id: str, kind: str, **facts: Any) -> None:
        answer = self.client.post(
            f"/v1/agent/jobs/{job_id}/reports", headers=self.agent_headers,
            json={"node_id": self.node_id, "type": kind, **facts},
        )  # fmt: skip
        assert answer.status_code == 200, answer.text

    def succeeded(self, name: str) -> str:
        """Submitted, scheduled, assigned to gpu-1, built (so started), exited 0."""
        if self.node_id is None:
            registered = self.client.post(
                "/v1/agent/nodes", headers=self.agent_headers,
                json={"name": "gpu-1", "accels": 2, "accel_type": "cpu", "agent_id": AGENT},
            )  # fmt: skip
            assert registered.status_code == 200, registered.text
            self.node_id = registered.json()["node_id"]
        job_id = self.submit(name)
        self.services.jobs.begin_scheduling(UUID(job_id))
        placed = self.services.jobs.assign(UUID(job_id), self.node_id, "gpu-1")
        self.services.projector.wait(placed.position)  # the node's token reaches placed jobs
        self.report(job_id, "built", commit="c0ffee")
        self.report(job_id, "exited", exit_code=0)
        return job_id

    def events(self, job_id: str, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
        answer = self.client.get(f"/v1/audit/jobs/{job_id}", headers=headers or self.headers)
        assert answer.status_code == 200, answer.text
        events: list[dict[str, Any]] = answer.json()["events"]
        return events

    def state(self, job_id: str, headers: dict[str, str] | None = None, **params: Any) -> Any:
        return self.client.get(f"/v1/audit/jobs/{job_id}/state", params=params,
                               headers=headers or self.headers)  # fmt: skip

    def cli(self, *argv: str, token: str | None = None) -> tuple[int, str, str]:
        """Runs `flexai ARGV` against this API; its exit code, stdout and stderr."""
        raise NotImplementedError  # replaced by the fixture, which holds capsys


@pytest.fixture
def api(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Iterator[Api]:  # fmt: skip
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    services = build_services(settings)
    token, _ = ensure_admin_token(services.identities, settings.data_dir)
    app = create_app(services, background=False)
    with TestClient(app) as client:
        ready = Api(app, client, services, token)

        def cli(*argv: str, token: str | None = None) -> tuple[int, str, str]:
            def from_config(_: type[ApiClient], owner: str | None = None) -> ApiClient:
                made = ApiClient("http://localhost", token or ready.token, owner=owner)
                hooks = made._http.event_hooks  # the position and the admin's owner
                made._http.close()
                made._http = TestClient(app, headers={"Authorization": f"Bearer "
                                                      f"{token or ready.token}"})  # fmt: skip
                made._http.event_hooks = hooks
                return made

            monkeypatch.setattr(ApiClient, "from_config", classmethod(from_config))
            capsys.readouterr()
            code = main(list(argv))
            out, err = capsys.readouterr()
            return code, out, err

        ready.cli = cli  # type: ignore[method-assign]
        yield ready
    services.close()


def statuses_by_version(events: list[dict[str, Any]]) -> list[str]:
    """The status the job held after each event (events absent from EVENT_STATUS keep it)."""
    held, statuses = "", []
    for event in events:
        held = EVENT_STATUS.get(event["type"], held)
        statuses.append(str(held))
    return statuses


# -- the API ----------------------------------------------------------------------------------


def test_each_version_shows_the_status_the_job_held_after_that_event(api: Api) -> None:
    job_id = api.succeeded("resnet")
    events = api.events(job_id)
    assert [e["type"] for e in events][:3] == ["Submitted", "SchedulingStarted", "NodeAssigned"]
    expected = statuses_by_version(events)
    assert expected[-1] == "succeeded" and "in progress" in expected
    for event, status in zip(events, expected, strict=True):
        state = api.state(job_id, version=event["version"]).json()
        assert (state["version"], state["status"]) == (event["version"], status)
        assert state["latest_version"] == len(events) and state["event"] == event["type"]
        assert state["spec"]["repository_url"] == SPEC["repository_url"]
    assigned = api.state(job_id, version=3).json()
    assert [p["node"] for p in assigned["placements"]] == ["gpu-1"]
    assert assigned["accelerators"] == [] and assigned["placements"][0]["exit_code"] is None
    last = api.state(job_id).json()
    assert last["version"] == len(events) and last["placements"][0]["exit_code"] == 0
    assert last["accelerators"] and last["commit"] == "c0ffee"


def test_a_moment_shows_the_last_version_recorded_at_or_before_it(api: Api) -> None:
    job_id = api.succeeded("resnet")
    events = api.events(job_id)
    times = [datetime.fromisoformat(e["at"]) for e in events]
    for index, moment in enumerate(times):
        expected = max(e["version"] for e in events if datetime.fromisoformat(e["at"]) <= moment)
        assert api.state(job_id, at=moment.isoformat()).json()["version"] == expected
        if index + 1 < len(times) and times[index + 1] > moment:
            between = moment + (times[index + 1] - moment) / 2
            assert api.state(job_id, at=between.isoformat()).json()["version"] == expected
    naive = times[0].replace(tzinfo=None).isoformat()  # taken as UTC
    assert api.state(job_id, at=naive).json()["version"] >= 1
    later = (times[-1] + timedelta(days=1)).isoformat()
    assert api.state(job_id, at=later).json()["version"] == len(events)


def test_before_the_job_existed_or_out_of_range_is_a_problem_naming_what_is_valid(
    api: Api,
) -> None:
    job_id = api.succeeded("resnet")
    events = api.events(job_id)
    before = (datetime.fromisoformat(events[0]["at"]) - timedelta(seconds=1)).isoformat()
    body = assert_problem(api.state(job_id, at=before), 404, "job-not-yet-created")
    assert "created at" in body["detail"] and body["created_at"] == events[0]["at"]
    for version in (0, len(events) + 1):
        body = assert_problem(api.state(job_id, version=version), 422, "version-out-of-range")
        assert f"from 1 to {len(events)}" in body["detail"]
        assert body["latest_version"] == len(events)
    both = api.state(job_id, version=1, at=events[0]["at"])
    assert "not both" in assert_problem(both, 422, "invalid-request")["detail"]


def test_a_deleted_jobs_history_and_past_states_stay_readable(api: Api) -> None:
    job_id = api.succeeded("resnet")
    assert api.client.delete("/v1/jobs/resnet", headers=api.headers).status_code == 200
    events = api.events(job_id)
    assert events[-1]["type"] == "Deleted"
    assert api.state(job_id).json()["deleted"] is True
    before = api.state(job_id, version=len(events) - 1).json()
    assert (before["deleted"], before["status"]) == (False, "succeeded")


def test_a_user_cannot_time_travel_another_users_job(api: Api) -> None:
    job_id = api.succeeded("resnet")
    bob_token = api.new_user("bob")
    bob = {"Authorization": f"Bearer {bob_token}"}
    for params in ({"version": 1}, {"at": "2000-01-01T00:00:00Z"}, {}):
        assert_problem(api.state(job_id, headers=bob, **params), 404, "job-not-found")
    code, _, err = api.cli("training", "inspect", "resnet", "--at-version", "1", token=bob_token)
    assert code == 1 and "no job was ever named 'resnet'" in err


# -- the CLI ----------------------------------------------------------------------------------


def test_inspect_at_version_says_it_is_a_past_state_with_its_status(api: Api) -> None:
    job_id = api.succeeded("resnet")
    events = api.events(job_id)
    expected = statuses_by_version(events)
    for event, status in zip(events, expected, strict=True):
        code, out, _ = api.cli("training", "inspect", "resnet", "--at-version",
                               str(event["version"]))  # fmt: skip
        assert code == 0
        first = out.splitlines()[0]
        assert first.startswith("as of ")
        assert first.endswith(f"(version {event['version']} of {len(events)})")
        assert f"\nstatus: {status}\n" in out and "past state folded from the ledger" in out
    code, out, _ = api.cli("training", "inspect", "resnet", "--at-version", "3", "--json")
    assert code == 0 and json.loads(out)["status"] == "building"
    code, _, err = api.cli("training", "inspect", "resnet", "--at-version", "99")
    assert code == 1 and f"from 1 to {len(events)}" in err and len(err.splitlines()) == 1


def test_inspect_at_a_time_shows_the_job_then_and_refuses_before_it_existed(api: Api) -> None:
    job_id = api.succeeded("resnet")
    events = api.events(job_id)
    submitted = datetime.fromisoformat(events[0]["at"])
    code, out, _ = api.cli("training", "inspect", "resnet", "--at", events[0]["at"])
    assert code == 0 and "\nstatus: pending\n" in out
    later = (datetime.fromisoformat(events[-1]["at"]) + timedelta(seconds=1)).isoformat()
    code, out, _ = api.cli("training", "inspect", "resnet", "--at", later)
    assert code == 0 and "\nstatus: succeeded\n" in out
    code, _, err = api.cli("training", "inspect", "resnet", "--at=-1d")
    assert code == 1 and "did not exist yet" in err and "created at" in err
    naive = (submitted - timedelta(hours=1)).replace(tzinfo=None).isoformat()
    code, _, err = api.cli("training", "inspect", "resnet", "--at", naive)
    assert code == 1 and "created at" in err
    code, _, err = api.cli("training", "inspect", "resnet", "--at", "yesterday")
    assert code == 2 and "is not a time" in err


def test_history_prints_one_line_per_event_and_cuts_long_facts_unless_full(api: Api) -> None:
    job_id = api.succeeded("resnet")
    events = api.events(job_id)
    code, out, _ = api.cli("training", "history", "resnet")
    assert code == 0
    header, *lines = out.splitlines()
    assert header.split()[:4] == ["VERSION", "AT", "BY", "EVENT"]
    assert len(lines) == len(events)
    for line, event in zip(lines, events, strict=True):
        assert line.split()[0] == str(event["version"]) and event["type"] in line
        assert line.split()[1].endswith("Z")
    assert "user admin" in lines[0] and "agent gpu-1" in lines[-1]
    submitted = lines[0]
    assert submitted.endswith("\u2026")
    code, full, _ = api.cli("training", "history", "resnet", "--full")
    assert code == 0 and len(full.splitlines()[1]) > len(submitted)
    code, out, _ = api.cli("training", "history", "resnet", "--json")
    assert [e["type"] for e in json.loads(out)["events"]] == [e["type"] for e in events]


def test_history_all_shows_a_deleted_job_then_the_newer_one_of_the_same_name(api: Api) -> None:
    first = api.succeeded("resnet")
    assert api.client.delete("/v1/jobs/resnet", headers=api.headers).status_code == 200
    code, out, err = api.cli("training", "history", "resnet")
    assert code == 0 and "newest deleted one" in err and first in err
    assert out.splitlines()[-1].split()[-1] == "Deleted"
    second = api.submit("resnet")
    code, out, _ = api.cli("training", "history", "resnet", "--all")
    assert code == 0
    blocks = out.split("\n\n")
    assert len(blocks) == 2
    assert blocks[0].startswith(f"job {first} ") and "  deleted  " in blocks[0].splitlines()[0]
    assert blocks[1].startswith(f"job {second} ") and "  live  " in blocks[1].splitlines()[0]
    assert "Deleted" in blocks[0] and len(blocks[1].splitlines()) == 3  # header, columns, one
    code, out, _ = api.cli("training", "history", "resnet", "--all", "--json")
    assert [job["deleted"] for job in json.loads(out)["jobs"]] == [True, False]
    code, out, _ = api.cli("training", "inspect", "resnet", "--at-version", "1")
    assert code == 0 and "\nid: " + second in out
