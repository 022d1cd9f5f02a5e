"""`flexai admin rebuild-projections` on each store: after a long seeded workload the rebuilt
views equal the live ones, readers never see them empty, and writes during the rebuild are
kept."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from api.ledger.verify import verify_ledger
from api.services import Services, build_services
from api.settings import Settings
from domain.actors import user
from domain.errors import DomainError
from projections.bulk import ledger_events
from projections.rebuild import RETIRED_SCHEMA, SHADOW_SCHEMA
from projections.views import VIEW_TABLES, is_viewed
from tests.integration import test_time_travel
from tests.integration.conftest import Lifecycle
from tests.integration.test_time_travel import Api

api = test_time_travel.api  # the real app and CLI on each store
SEED = 20261203
JOBS = 60


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Iterator[Services]:
    opened = build_services(Settings(data_dir=tmp_path, database_url=database_url))
    yield opened
    opened.close()


def workload(services: Services, jobs: int = JOBS, seed: int = SEED) -> None:
    """Jobs down every path, picked by a seeded random draw."""
    draw = random.Random(seed)
    lifecycle = Lifecycle(services.jobs)
    alice = user(Lifecycle.owner)
    for index in range(jobs):
        name = f"job-{index}"
        path = draw.choice(["succeed", "fail", "stop", "build-fail", "wait", "checkpoints",
                            "delete", "reject"])  # fmt: skip
        if path == "reject":
            job_id = lifecycle.submit(name)
            services.jobs.begin_scheduling(job_id)
            services.jobs.reject(job_id, "no_capacity", "nothing fits")
            continue
        if path == "wait":
            lifecycle.submit(name)
            continue
        if path == "build-fail":
            job_id = lifecycle.building(name)
            lifecycle.report(job_id, "build_failed", code="clone_failed", message="no repo")
            continue
        try:
            job_id = lifecycle.in_progress(name)
        except (AssertionError, DomainError):  # the node is full: it waits, enqueued
            continue
        if path == "checkpoints":
            for step in range(draw.randint(1, 5)):
                services.jobs.record_checkpoint(job_id, lifecycle.node_id,
                                                {"id": f"{name}-{step}", "name": f"s{step}"})
        if path == "stop":
            services.jobs.request_stop(job_id, by=alice)
            lifecycle.report(job_id, "stopped", exit_code=143)
            continue
        lifecycle.report(job_id, "exited", exit_code=0 if path != "fail" else draw.randint(1, 9))
        if path == "delete":
            services.jobs.delete(job_id, by=alice)
    services.projector.catch_up()


def dump(services: Services) -> dict[str, list[tuple[Any, ...]]]:
    tables = {}
    with services.database.transaction() as cursor:
        for table in VIEW_TABLES:
            cursor.execute(f"SELECT * FROM {table}")
            rows = [tuple(sorted((k, str(v)) for k, v in row.items())) for row in cursor.fetchall()]
            tables[table] = sorted(rows)
    return tables


def test_rebuilt_views_equal_the_live_ones(services: Services) -> None:
    workload(services)
    before = dump(services)
    assert len(before["job_list"]) == JOBS
    head = services.jobs.recorder.max_notification_id()  # type: ignore[attr-defined]
    assert services.rebuilder is not None
    progress = services.rebuilder.run()
    assert progress.state == "done", progress.error
    assert progress.position == head and progress.rows["job_list"] == JOBS
    assert dump(services) == before
    assert services.projector.position() == head
    assert verify_ledger(services.ledger_parts(), artifacts="none")["ok"]  # none was uploaded


def test_a_rebuild_puts_right_the_rows_that_went_wrong_and_keeps_the_others(
    services: Services,
) -> None:
    """Rows changed, lost or added behind the projector's back (a NULL among them), a few in
    some tables and all in one, are put right: after the rebuild the views are the ledger's."""
    workload(services, jobs=20)
    before = dump(services)
    with services.database.transaction(write=True) as cursor:
        cursor.execute("UPDATE job_list SET status = 'succeeded', node = NULL, started_at = "
                       "'2026-01-01' WHERE name IN ('job-1', 'job-2')")  # fmt: skip
        cursor.execute("DELETE FROM job_details WHERE id IN "
                       "(SELECT id FROM job_list WHERE name = 'job-3')")  # fmt: skip
        cursor.execute("UPDATE job_details SET document = document || ' '")  # most rows wrong
        cursor.execute("DELETE FROM job_nodes WHERE node_index = 0 AND job_id IN "
                       "(SELECT job_id FROM job_nodes LIMIT 1)")  # fmt: skip
        cursor.execute("INSERT INTO nodes (id, name, accels, accel_type, address, gpus, "
                       "registered_at, updated_at) VALUES ('n-0', 'ghost', 1, 'cpu', NULL, '[]', "
                       "'2026-01-01', '2026-01-01')")  # fmt: skip
    assert dump(services) != before
    assert services.rebuilder is not None
    assert services.rebuilder.run().state == "done"
    assert dump(services) == before


def test_the_bulk_fold_reads_each_event_as_the_library_does(services: Services) -> None:
    """The rebuild's own decoding (orjson, each originator's id made once) makes the very
    events the library's mapper makes, and leaves to the mapper the states orjson would read
    otherwise: an integer past 64 bits, a NaN, an infinity."""
    lifecycle = Lifecycle(services.jobs)
    odd = lifecycle.in_progress("odd")
    for index, (key, value) in enumerate([("seen", 2**70), ("noise", float("nan")),
                                          ("spread", float("inf")), ("loss", 0.25)]):
        services.jobs.record_checkpoint(odd, lifecycle.node_id, {  # a checkpoint keeps extras
            "id": f"odd-{index}", "name": f"s{index}", key: value})  # fmt: skip
    lifecycle.report(odd, "exited", exit_code=0)
    workload(services, jobs=30)
    app = services.jobs
    head = app.recorder.max_notification_id()  # type: ignore[attr-defined]
    stored = {n.id: n for n in app.recorder.select_notifications(1, head)}  # type: ignore[attr-defined]
    mapped = []
    to_domain_event = app.mapper.to_domain_event

    def counted(event: Any) -> Any:
        mapped.append(event.topic)
        return to_domain_event(event)

    app.mapper.to_domain_event = counted  # type: ignore[method-assign]
    read = list(ledger_events(app, 0, head))
    app.mapper.to_domain_event = to_domain_event  # type: ignore[method-assign]
    assert [position for _, position, _ in read] == sorted(stored)
    viewed = timed = 0
    for domain_event, position, at in read:
        if domain_event is None:
            assert not is_viewed(stored[position].topic)
            continue
        viewed += 1
        expected = to_domain_event(stored[position])
        assert type(domain_event) is type(expected), position
        assert vars(domain_event) == vars(expected), position
        assert at in (None, expected.timestamp.isoformat()), position
        timed += at is not None
        assert str(domain_event.originator_id) == str(expected.originator_id)
    assert viewed > 100
    # only the odd ones went through the mapper: the big integer, the NaN, the infinity
    assert mapped == ["domain.job:TrainingJob.CheckpointRecorded"] * 3, mapped
    assert timed == viewed - 3  # with the text of their time, for the fold to write
    before = dump(services)
    assert services.rebuilder is not None
    assert services.rebuilder.run().state == "done"
    assert dump(services) == before


def test_readers_never_see_empty_views_and_writes_meanwhile_are_kept(
    services: Services,
) -> None:
    workload(services, jobs=40)
    assert services.rebuilder is not None
    seen: list[int] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            with services.database.transaction() as cursor:
                cursor.execute("SELECT COUNT(*) AS n FROM job_list")
                row = cursor.fetchone()
            seen.append(int(row["n"]) if row else 0)

    def write() -> None:
        for index in range(15):
            outcome = services.jobs.submit("alice", f"during-{index}", {
                "repository_url": "https://example.com/r.git", "entry_point": ["t.py"],
                "accels": 1, "nodes": 1}, by=user("alice"))  # fmt: skip
            services.projector.wait(outcome.position)

    reader, writer = threading.Thread(target=read), threading.Thread(target=write)
    reader.start()
    writer.start()
    progress = services.rebuilder.run()
    writer.join()
    done.set()
    reader.join()
    assert progress.state == "done", progress.error
    assert seen and min(seen) >= 40, sorted(set(seen))[:5]
    services.projector.catch_up()
    for index in range(15):
        assert services.queries.job_by_name("alice", f"during-{index}") is not None, index
    assert verify_ledger(services.ledger_parts(), artifacts="none")["ok"]  # none was uploaded


def test_rebuild_through_the_api_and_the_cli(api: Api) -> None:
    for index in range(3):
        api.succeeded(f"job-{index}")
    head = api.services.jobs.recorder.max_notification_id()  # type: ignore[attr-defined]
    code, out, err = api.cli("admin", "rebuild-projections")
    assert code == 0, err
    assert "rebuilding the views" in out and "swapped in" in out and "job_list 3" in out
    assert f"from the ledger ({head} events)" in out and head > 10  # the answer's own head
    status = api.client.get("/v1/admin/rebuild-projections", headers=api.headers).json()
    assert status["state"] == "done" and status["rows"]["job_list"] == 3
    code, out, _ = api.cli("admin", "rebuild-projections", "--status")
    assert code == 0 and "done in" in out
    listed = api.client.get("/v1/jobs", headers=api.headers).json()["jobs"]
    assert {job["name"] for job in listed} == {"job-0", "job-1", "job-2"}
    assert UUID(listed[0]["id"])


def test_statements_prepared_before_a_rebuild_read_and_write_the_rebuilt_views(
    services: Services,
) -> None:
    """On PostgreSQL the swap moves the rebuilt tables into the views' place: statements the
    server prepared on the old ones (psycopg prepares a query from its fifth run) must find the
    new ones, and the old ones must be gone, with the shadow's schema."""
    workload(services, jobs=12)
    for _ in range(30):  # prepared on the pool's connections
        assert services.queries.job_by_name("alice", "job-3") is not None
        services.queries.list_jobs("alice")
    indexes = _indexes(services)
    assert services.rebuilder is not None
    progress = services.rebuilder.run()
    assert progress.state == "done", progress.error
    for index in range(8):
        assert services.queries.job_by_name("alice", "job-3") is not None
        outcome = services.jobs.submit("alice", f"after-{index}", {
            "repository_url": "https://example.com/r.git", "entry_point": ["t.py"],
            "accels": 1, "nodes": 1}, by=user("alice"))  # fmt: skip
        services.projector.wait(outcome.position)
        assert services.queries.job_by_name("alice", f"after-{index}") is not None, index
    assert _indexes(services) == indexes
    if services.database.dialect == "postgres":
        with services.database.transaction() as cursor:
            cursor.execute("SELECT nspname FROM pg_namespace WHERE nspname IN (?, ?)",
                           (SHADOW_SCHEMA, RETIRED_SCHEMA))  # fmt: skip
            assert cursor.fetchall() == []


def _indexes(services: Services) -> set[tuple[str, str]]:
    """(table, index) of every view table's index in the views' own schema."""
    with services.database.transaction() as cursor:
        if services.database.dialect == "postgres":
            cursor.execute("SELECT tablename AS t, indexname AS i FROM pg_indexes "
                           "WHERE schemaname = current_schema()")  # fmt: skip
        else:
            cursor.execute("SELECT tbl_name AS t, name AS i FROM sqlite_master "
                           "WHERE type = 'index'")  # fmt: skip
        return {(row["t"], row["i"]) for row in cursor.fetchall() if row["t"] in VIEW_TABLES}
