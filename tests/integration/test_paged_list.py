"""`GET /v1/jobs` one page at a time, on each store: keyset pages that cover every job once,
newest first, undisturbed by jobs created meanwhile; status and name filters; problems for
a bad cursor, limit or status; and pages that are index range scans."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.http.cursors import decode_cursor
from api.identity.identities import ensure_admin_token
from api.services import Services, build_services
from api.settings import Settings
from domain.actors import user
from domain.job import TrainingJob
from domain.job_name import JobName
from domain.statuses import Status
from projections.queries import PLACES, USAGE_INTERVALS, Queries, page_jobs_sql
from tests.integration.conftest import job_spec
from tests.integration.test_api_problems import assert_problem

OWNER = "admin"
"""The admin token's user."""


@dataclass
class Api:
    client: TestClient
    services: Services
    headers: dict[str, str]

    def submit(self, *names: str) -> None:
        """Jobs through the ledger, then one catch-up of the views."""
        for name in names:
            self.services.jobs.submit(OWNER, name, job_spec(), by=user(OWNER))
        self.services.projector.catch_up()

    def job_id(self, name: str) -> UUID:
        document = self.services.queries.job_by_name(OWNER, name)
        assert document is not None
        return UUID(document["id"])

    def page(self, **params: Any) -> dict[str, Any]:
        response = self.client.get("/v1/jobs", headers=self.headers, params=params)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        assert body["count"] == len(body["jobs"])
        return body

    def every_page(self, cursor: str | None = None, **params: Any) -> list[list[str]]:
        pages = []
        while True:
            body = self.page(**params, **({"cursor": cursor} if cursor else {}))
            pages.append([job["name"] for job in body["jobs"]])
            cursor = body["next_cursor"]
            if cursor is None:
                return pages


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[Api]:
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    services = build_services(settings)
    token, _ = ensure_admin_token(services.identities, settings.data_dir)
    with TestClient(create_app(services, background=False)) as client:
        yield Api(client, services, {"Authorization": f"Bearer {token}"})
    services.close()


def names(count: int, prefix: str = "job") -> list[str]:
    return [f"{prefix}-{index:03d}" for index in range(count)]


def test_120_jobs_in_pages_of_50_come_newest_first_each_exactly_once(api: Api) -> None:
    submitted = names(120)
    api.submit(*submitted)
    pages = api.every_page(limit=50)
    assert [len(page) for page in pages] == [50, 50, 20]
    assert [name for page in pages for name in page] == submitted[::-1]


def test_the_default_page_is_50_jobs(api: Api) -> None:
    api.submit(*names(51))
    first = api.page()
    assert first["count"] == 50 and first["next_cursor"]
    assert [job["name"] for job in api.page(cursor=first["next_cursor"])["jobs"]] == ["job-000"]


def test_jobs_created_while_a_client_pages_neither_repeat_nor_hide_a_job(api: Api) -> None:
    submitted = names(120)
    api.submit(*submitted)
    first = api.page(limit=50)
    api.submit(*names(7, "newer"))
    second = api.page(limit=50, cursor=first["next_cursor"])
    api.submit(*names(3, "newest"))
    third = api.page(limit=50, cursor=second["next_cursor"])
    seen = [job["name"] for body in (first, second, third) for job in body["jobs"]]
    assert seen == submitted[::-1]
    assert third["next_cursor"] is None
    # A client that starts again sees the new ones first.
    assert [job["name"] for job in api.page(limit=10)["jobs"]] == [
        *names(3, "newest")[::-1], *names(7, "newer")[::-1]
    ]


def test_jobs_deleted_between_pages_shift_nothing(api: Api) -> None:
    submitted = names(10)
    api.submit(*submitted)
    first = api.page(limit=4)
    for name in ("job-009", "job-002"):  # one on the first page, one on a later one
        api.services.jobs.request_stop(api.job_id(name), by=user(OWNER))
        api.services.jobs.delete(api.job_id(name), by=user(OWNER))
    api.services.projector.catch_up()
    rest = api.every_page(limit=4, cursor=first["next_cursor"])
    assert [name for page in rest for name in page] == ["job-005", "job-004", "job-003",
                                                        "job-001", "job-000"]  # fmt: skip


def test_status_filters_repeat_or_separate_by_commas(api: Api) -> None:
    api.submit(*names(6))
    for name in ("job-001", "job-004"):
        api.services.jobs.begin_scheduling(api.job_id(name))
    api.services.projector.catch_up()
    scheduling = api.every_page(status="scheduling", limit=1)
    assert [name for page in scheduling for name in page] == ["job-004", "job-001"]
    both = [job["name"] for job in api.page(status=["scheduling", "pending"])["jobs"]]
    assert both == names(6)[::-1]
    assert [job["name"] for job in api.page(status="pending,SCHEDULING")["jobs"]] == both
    assert api.page(status="in-progress")["jobs"] == []


def test_an_unknown_status_is_a_422_naming_the_allowed_ones(api: Api) -> None:
    response = api.client.get("/v1/jobs", headers=api.headers,
                              params={"status": ["pending", "running"]})  # fmt: skip
    body = assert_problem(response, 422, "invalid-request")
    assert "'running'" in body["detail"] and "'in progress'" in body["detail"]
    assert body["allowed"] == [status.value for status in Status]


def test_name_prefix_matches_literally_wildcards_and_case_included(api: Api) -> None:
    api.submit("a_b-1", "axb-2", "a_b-3", "A_b-4", "ab-5")
    assert [job["name"] for job in api.page(name_prefix="a_b")["jobs"]] == ["a_b-3", "a_b-1"]
    assert api.page(name_prefix="a%")["jobs"] == []
    assert api.page(name_prefix="%")["jobs"] == []
    assert [job["name"] for job in api.page(name_prefix="A")["jobs"]] == ["A_b-4"]
    assert [job["name"] for job in api.page(name_prefix="a", status="pending", limit=2)
            ["jobs"]] == ["ab-5", "a_b-3"]  # fmt: skip


def test_a_malformed_or_altered_cursor_is_a_422_that_says_to_start_again(api: Api) -> None:
    api.submit(*names(3))
    good = api.page(limit=1)["next_cursor"]
    assert api.page(limit=1, cursor=good)["count"] == 1
    altered = good[:-3] + ("AAA" if not good.endswith("AAA") else "BBB")
    for cursor in ("garbage", altered, good[:10], "%%%", good + "x"):
        response = api.client.get("/v1/jobs", headers=api.headers, params={"cursor": cursor})
        body = assert_problem(response, 422, "invalid-cursor")
        assert "without `cursor`" in body["detail"]


@pytest.mark.parametrize("limit", ["0", "501", "-1", "many"])
def test_a_limit_outside_1_to_500_is_a_422_problem(api: Api, limit: str) -> None:
    response = api.client.get("/v1/jobs", headers=api.headers, params={"limit": limit})
    assert "limit" in assert_problem(response, 422, "invalid-request")["detail"]


def _plan(services: Services, sql: str, params: list[Any]) -> str:
    # On PostgreSQL a read runs each statement alone: the settings need a transaction.
    with services.database.transaction(write=services.database.dialect == "postgres") as cursor:
        if services.database.dialect == "postgres":
            # A small table: make the planner show whether an index can serve the page at
            # all (no sequential scan, and no sort: the index gives the order).
            for setting in ("enable_seqscan", "enable_bitmapscan", "enable_sort"):
                cursor.execute(f"SET LOCAL {setting} = off")
            cursor.execute(f"EXPLAIN {sql}", params)
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        return "\n".join(" ".join(str(value) for value in row.values())
                         for row in cursor.fetchall())  # fmt: skip


@pytest.mark.parametrize(
    ("filters", "index"),
    [({}, "job_list_owner_newest"),
     ({"statuses": [Status.PENDING]}, "job_list_owner_status_newest")],
)  # fmt: skip
def test_a_deep_page_is_an_index_range_scan_without_a_sort(
    api: Api, filters: dict[str, Any], index: str
) -> None:
    api.submit(*names(60))
    cursor = api.page(limit=30)["next_cursor"]
    sql, params = page_jobs_sql(OWNER, 51, decode_cursor(cursor), **filters)
    plan = _plan(api.services, sql, params)
    assert index in plan, plan
    assert "TEMP B-TREE" not in plan and "Sort" not in plan and "Seq Scan" not in plan, plan


def test_a_deep_page_of_everyones_jobs_of_one_status_is_an_index_range_scan_too(
    api: Api,
) -> None:
    api.submit(*names(60))
    cursor = api.page(limit=30, status="pending")["next_cursor"]
    sql, params = page_jobs_sql(None, 51, decode_cursor(cursor), statuses=[Status.PENDING])
    plan = _plan(api.services, sql, params)
    assert "job_list_status_newest" in plan, plan
    assert "TEMP B-TREE" not in plan and "Sort" not in plan and "Seq Scan" not in plan, plan


class _Recording:
    """A database whose statements are kept, to read the plan of what a query really runs."""

    def __init__(self, database: Any) -> None:
        self.database, self.dialect = database, database.dialect
        self.statements: list[tuple[str, list[Any]]] = []

    @contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[Any]:
        with self.database.transaction(write=write) as cursor:
            recording = self

            class Cursor:
                def execute(self, sql: str, params: Any = ()) -> None:
                    recording.statements.append((sql, list(params)))
                    cursor.execute(sql, params)

                def fetchone(self) -> Any:
                    return cursor.fetchone()

                def fetchall(self) -> Any:
                    return cursor.fetchall()

            yield Cursor()


def test_inspect_by_name_stays_an_index_lookup_next_to_the_list_indexes(api: Api) -> None:
    """On views just rebuilt (no statistics yet) PostgreSQL once took the partial index of
    the list for this lookup and scanned all of the owner's jobs: it takes some rows to
    show."""
    aggregates: list[Any] = []
    for name in names(1500):
        job = TrainingJob.submit(owner=OWNER, name=name, spec=job_spec(), by=user(OWNER))
        aggregates += [job, JobName(owner=OWNER, name=name, job_id=job.id)]
    api.services.jobs.save(*aggregates)  # what TrainingJobs.submit saves, in one transaction
    api.services.projector.catch_up()
    recording = _Recording(api.services.database)
    assert Queries(recording).job_by_name(OWNER, "job-731") is not None  # type: ignore[arg-type]
    [(sql, params)] = recording.statements
    plan = _plan(api.services, sql, params)
    assert "Filter" not in plan and "Seq Scan" not in plan, plan
    assert "owner_live_name" in plan or "owner_name" in plan, plan


def test_fair_shares_usage_reads_only_the_jobs_that_ran_by_index(api: Api) -> None:
    """Re-summed every 10 s: with a million jobs in the views, reading them all took 70 ms."""
    rows = [  # id, started_at, ended_at
        ("never-ran", None, None), ("runs", "2026-01-02T00:00:00+00:00", None),
        ("ended-long-ago", "2025-01-01T00:00:00+00:00", "2025-01-01T01:00:00+00:00"),
        ("ended-lately", "2026-01-01T00:00:00+00:00", "2026-01-03T00:00:00+00:00"),
    ]  # fmt: skip
    with api.services.database.transaction(write=True) as cursor:
        for job_id, started, ended in rows:
            cursor.execute(
                "INSERT INTO job_list (id, owner, name, status, accels, nodes, created_at, "
                "started_at, ended_at, updated_at, position) VALUES (?, 'alice', ?, 'failed', 2, "
                "3, '2025-01-01T00:00:00+00:00', ?, ?, '2026-01-03T00:00:00+00:00', 1)",
                (job_id, job_id, started, ended),
            )  # fmt: skip
    found = api.services.queries.usage_intervals("2026-01-01T00:00:00+00:00")
    assert sorted((row["started_at"], row["ended_at"], row["accels"]) for row in found) == [
        ("2026-01-01T00:00:00+00:00", "2026-01-03T00:00:00+00:00", 6),
        ("2026-01-02T00:00:00+00:00", None, 6),
    ]  # fmt: skip
    plan = _plan(api.services, USAGE_INTERVALS, ["2026-01-01T00:00:00+00:00"])
    assert plan.count("job_list_ran") == 2, plan
    assert "SCAN job_list" not in plan and "Seq Scan" not in plan, plan


def test_a_waiting_jobs_place_is_counted_in_an_index_not_read(api: Api) -> None:
    """``inspect`` of a job no round explained yet: its place among 30,000 waiting took 30 to
    50 ms read, 3 to 7 ms counted."""
    plan = _plan(api.services, PLACES, ["scheduling", "scheduling", "x"])
    assert "job_list_status_newest" in plan, plan
    assert "SCAN" not in plan and "Seq Scan" not in plan, plan  # SQLite's and PostgreSQL's
