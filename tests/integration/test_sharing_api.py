"""A shared fleet through the REST API (each store): admins set users' quotas and leave to use
``priority: high``; jobs carry their priority, preemptibility and retries in their spec only
where those differ from their defaults; ``high`` is refused to whom it was not granted, in a
list to that job alone; an older database's users table gains the new columns."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.identity.identities import Identities, ensure_admin_token
from api.services import Services, build_services
from api.settings import Settings
from ledger.database import open_database
from tests.integration.test_api_problems import SPEC, assert_problem
from tests.support import user_headers

SHARING_KEYS = {"priority", "preemptible", "max_retries", "retry_on_exit_codes"}


class Api:
    def __init__(self, client: TestClient, services: Services, admin: dict[str, str]) -> None:
        self.client, self.services, self.admin = client, services, admin
        self.alice = user_headers(services, "alice")

    def submit(self, name: str, headers: dict[str, str] | None = None, **fields: Any) -> Any:
        return self.client.post("/v1/jobs", headers=headers or self.alice,
                                json={**SPEC, "name": name, **fields})  # fmt: skip

    def spec(self, name: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
        answer = self.client.get(f"/v1/jobs/{name}", headers=headers or self.alice)
        assert answer.status_code == 200, answer.text
        spec: dict[str, Any] = answer.json()["spec"]
        return spec

    def user(self, name: str) -> dict[str, Any]:
        listed = self.client.get("/v1/admin/users", headers=self.admin)
        assert listed.status_code == 200, listed.text
        return next(row for row in listed.json()["users"] if row["name"] == name)


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[Api]:
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    services = build_services(settings)
    token, _ = ensure_admin_token(services.identities, settings.data_dir)
    with TestClient(create_app(services, background=False)) as client:
        yield Api(client, services, {"Authorization": f"Bearer {token}"})
    services.close()


def test_an_admin_sets_and_clears_a_quota_that_the_listing_and_the_scheduler_see(
    api: Api,
) -> None:
    assert api.user("alice")["quota_accels"] is None and api.services.identities.quotas() == {}
    answer = api.client.put("/v1/admin/users/alice/quota", headers=api.admin, json={"accels": 8})
    assert (answer.status_code, answer.json()) == (200, {"user": "alice", "accels": 8})
    assert api.user("alice")["quota_accels"] == 8
    assert api.services.identities.quotas() == {"alice": 8}
    cleared = api.client.put("/v1/admin/users/alice/quota", headers=api.admin,
                             json={"accels": None})  # fmt: skip
    assert (cleared.status_code, cleared.json()) == (200, {"user": "alice", "accels": None})
    assert api.user("alice")["quota_accels"] is None and api.services.identities.quotas() == {}


def test_a_quota_of_zero_is_kept_and_a_negative_one_refused(api: Api) -> None:
    zero = api.client.put("/v1/admin/users/alice/quota", headers=api.admin, json={"accels": 0})
    assert zero.status_code == 200, zero.text
    assert api.services.identities.quotas() == {"alice": 0}
    negative = api.client.put("/v1/admin/users/alice/quota", headers=api.admin,
                              json={"accels": -1})  # fmt: skip
    assert_problem(negative, 422, "invalid-request")
    assert api.services.identities.quotas() == {"alice": 0}


def test_only_an_admin_sets_quotas_and_high_priority(api: Api) -> None:
    for path, body in (("quota", {"accels": 100}), ("high-priority", {"allowed": True})):
        refused = api.client.put(f"/v1/admin/users/alice/{path}", headers=api.alice, json=body)
        assert_problem(refused, 403, "admin-only")
    assert api.user("alice")["quota_accels"] is None
    assert api.user("alice")["high_priority"] is False


def test_an_unknown_user_is_a_404_that_says_how_to_make_one(api: Api) -> None:
    for path, body in (("quota", {"accels": 1}), ("high-priority", {"allowed": True})):
        answer = api.client.put(f"/v1/admin/users/nobody/{path}", headers=api.admin, json=body)
        problem = assert_problem(answer, 404, "user-not-found")
        assert "flexai admin user create nobody" in problem["detail"]


def test_high_priority_is_refused_until_an_admin_allows_it_and_again_once_denied(
    api: Api,
) -> None:
    problem = assert_problem(api.submit("urgent", priority="high"), 403,
                             "high-priority-not-granted")  # fmt: skip
    assert "flexai admin user high-priority alice --allow" in problem["detail"]
    allowed = api.client.put("/v1/admin/users/alice/high-priority", headers=api.admin,
                             json={"allowed": True})  # fmt: skip
    assert (allowed.status_code, allowed.json()) == (200, {"user": "alice", "allowed": True})
    assert api.user("alice")["high_priority"] is True
    assert api.submit("urgent", priority="high").status_code == 201
    assert api.spec("urgent")["priority"] == "high"
    api.client.put("/v1/admin/users/alice/high-priority", headers=api.admin,
                   json={"allowed": False})  # fmt: skip
    assert_problem(api.submit("urgent-2", priority="high"), 403, "high-priority-not-granted")


def test_an_admin_may_always_submit_high_priority(api: Api) -> None:
    answer = api.submit("admins-own", headers=api.admin, priority="high")
    assert answer.status_code == 201, answer.text
    assert api.spec("admins-own", headers=api.admin)["priority"] == "high"


def test_in_a_list_only_the_high_priority_job_is_refused(api: Api) -> None:
    jobs = [{**SPEC, "name": "sweep-1"}, {**SPEC, "name": "sweep-2", "priority": "high"},
            {**SPEC, "name": "sweep-3", "priority": "low"}]  # fmt: skip
    answer = api.client.post("/v1/jobs", headers=api.alice, json=jobs)
    assert answer.status_code == 207, answer.text
    results = answer.json()["results"]
    assert [result["status"] for result in results] == [201, 403, 201]
    assert results[1]["problem"]["type"].endswith("/high-priority-not-granted")
    assert "--allow" in results[1]["problem"]["detail"]
    assert results[2]["job"]["spec"]["priority"] == "low"


def test_a_spec_holds_the_sharing_fields_only_where_they_differ_from_their_defaults(
    api: Api,
) -> None:
    assert api.submit("plain").status_code == 201
    assert api.submit("said-defaults", priority="normal", preemptible=False, max_retries=0,
                      retry_on_exit_codes=[]).status_code == 201  # fmt: skip
    assert api.submit("low", priority="low", preemptible=True).status_code == 201
    assert api.submit("low-kept", priority="low", preemptible=False).status_code == 201
    assert api.submit("retried", preemptible=True, max_retries=3,
                      retry_on_exit_codes=[137, 143]).status_code == 201  # fmt: skip
    assert not SHARING_KEYS & set(api.spec("plain"))
    assert not SHARING_KEYS & set(api.spec("said-defaults"))
    assert {key: api.spec("low")[key] for key in SHARING_KEYS & set(api.spec("low"))} == {
        "priority": "low"}  # fmt: skip
    assert api.spec("low-kept")["preemptible"] is False
    retried = api.spec("retried")
    assert {key: retried[key] for key in SHARING_KEYS & set(retried)} == {
        "preemptible": True, "max_retries": 3, "retry_on_exit_codes": [137, 143]}  # fmt: skip


@pytest.mark.parametrize("fields", [
    {"priority": "urgent"}, {"max_retries": 21}, {"max_retries": -1},
    {"retry_on_exit_codes": [0]}, {"retry_on_exit_codes": [256]},
    {"retry_on_exit_codes": [137, 137]}, {"retry_on_exit_codes": list(range(1, 18))},
])  # fmt: skip
def test_sharing_fields_out_of_bounds_are_a_422_naming_the_field(
    api: Api, fields: dict[str, Any]
) -> None:
    problem = assert_problem(api.submit("bad", **fields), 422, "invalid-request")
    assert next(iter(fields)) in problem["detail"]


def test_an_older_users_table_gains_the_new_columns_and_keeps_its_users(
    database_url: str, tmp_path: Path
) -> None:
    database = open_database(database_url)
    try:
        with database.transaction(write=True) as cursor:
            cursor.execute("CREATE TABLE users (name TEXT PRIMARY KEY, admin INTEGER NOT NULL, "
                           "created_at TEXT NOT NULL, created_by TEXT)")  # fmt: skip
            cursor.execute("INSERT INTO users VALUES ('carol', 0, '2026-01-01T00:00:00+00:00', "
                           "'admin')")  # fmt: skip
        identities = Identities(database)
        [carol] = identities.users()
        assert (carol["name"], carol["quota_accels"], carol["high_priority"]) == (
            "carol", None, False)  # fmt: skip
        identities.set_quota("carol", 4, by="admin")
        identities.set_high_priority("carol", True, by="admin")
        again = Identities(database)  # a second start finds the columns there
        assert again.quotas() == {"carol": 4} and again.may_use_high_priority("carol")
        assert again.users()[0]["limits_set_by"] == "admin"
    finally:
        database.close()
