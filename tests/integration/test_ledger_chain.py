"""Tamper evidence on each store: `flexai admin verify` recomputes the ledger's hash chain from
the raw rows and names the event that was altered, deleted or reordered behind its back, and
finds views that disagree with the ledger."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from api.settings import Settings
from domain.application import TrainingJobs
from ledger.chain import GENESIS, ChainRow, RawEvent, event_hash, ledger_digest, verify_chain
from tests.integration import test_time_travel
from tests.integration.test_time_travel import Api

api = test_time_travel.api  # the same fixture: the real app and CLI on each store

DIGEST = re.compile(r"[0-9a-f]{64}")


@contextmanager
def raw(api: Api) -> Iterator[tuple[Any, str, str]]:
    """A connection to the ledger's database, its events table and position column."""
    url = api.services.settings.resolved_database_url
    if url.startswith("sqlite:///"):
        connection: Any = sqlite3.connect(url.removeprefix("sqlite:///"))
        table, position = "stored_events", "rowid"
    else:
        connection = psycopg.connect(url)
        table, position = "flexai_events", "notification_id"
    try:
        yield connection, table, position
        connection.commit()
    finally:
        connection.close()


def sql(connection: Any, statement: str, params: tuple[Any, ...] = ()) -> list[Any]:
    if isinstance(connection, psycopg.Connection):
        statement = statement.replace("?", "%s")
    cursor = connection.execute(statement, params)
    return list(cursor.fetchall()) if cursor.description else []


def verify(api: Api, **body: Any) -> dict[str, Any]:
    answer = api.client.post("/v1/admin/verify", headers=api.headers, json=body)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def workload(api: Api) -> list[str]:
    jobs = [api.succeeded(f"job-{index}") for index in range(3)]
    api.submit("waiting")
    api.client.delete("/v1/jobs/job-0", headers=api.headers)
    return jobs


def position_of(api: Api, event_type: str, nth: int = 0) -> int:
    """The ledger position of the ``nth`` event of that type."""
    recorder = api.services.jobs.recorder
    found = [n.id for n in recorder.select_notifications(1, 10_000)  # type: ignore[attr-defined]
             if n.topic.endswith(f".{event_type}")]  # fmt: skip
    return found[nth]


def test_an_untouched_ledger_verifies_and_prints_its_head_digest(api: Api) -> None:
    workload(api)
    result = verify(api)
    assert result["ok"], result
    assert result["events"] == result["chained"] > 10
    assert result["unchained_before"] is None
    assert DIGEST.fullmatch(result["head_digest"])
    assert result["jobs"] == 4 and result["view_differences"] == []
    assert verify(api, expect_digest=result["head_digest"])["ok"]
    api.submit("one-more")
    moved_on = verify(api, expect_digest=result["head_digest"])
    assert not moved_on["ok"] and "not " + result["head_digest"] in moved_on["ledger_problems"][0]


def test_an_altered_row_is_named(api: Api) -> None:
    workload(api)
    position = position_of(api, "Built", 1)
    with raw(api) as (connection, table, column):
        [(state,)] = sql(connection, f"SELECT state FROM {table} WHERE {column} = ?", (position,))
        assert b"c0ffee" in bytes(state)
        forged = bytes(state).replace(b"c0ffee", b"beef00")
        sql(connection, f"UPDATE {table} SET state = ? WHERE {column} = ?", (forged, position))
    result = verify(api)
    assert not result["ok"]
    first = result["ledger_problems"][0]
    assert f"at position {position}" in first and "altered" in first


def test_a_row_whose_state_a_hand_edit_left_as_text_is_named_and_its_job_answers_a_problem(
    api: Api,
) -> None:
    """SQLite keeps what it is given: ``replace()`` in the sqlite3 shell turns a row's state
    into text, which no command writes and the library cannot read. Verify names the row (even
    with its bytes unchanged), says the job cannot be folded, and the job's audit answers a
    problem that points to verify. PostgreSQL's ``bytea`` column holds no text."""
    if not api.services.settings.resolved_database_url.startswith("sqlite:///"):
        pytest.skip("PostgreSQL's bytea column cannot hold a state as text")
    jobs = workload(api)
    position = position_of(api, "Built", 1)
    with raw(api) as (connection, table, column):
        sql(connection, f"UPDATE {table} SET state = CAST(state AS TEXT) WHERE {column} = ?",
            (position,))  # fmt: skip
    result = verify(api)
    assert not result["ok"]
    first = result["ledger_problems"][0]
    assert f"at position {position}" in first and "held as text" in first, first
    assert any(f"job {jobs[1]}: the ledger cannot fold it" in said
               for said in result["view_differences"]), result["view_differences"]  # fmt: skip
    answer = api.state(jobs[1], version=9)
    assert answer.status_code == 500, answer.text
    body = answer.json()
    assert body["type"].endswith("/ledger-unreadable") and "admin verify" in body["detail"]
    code, out, _ = api.cli("admin", "verify")
    assert code == 1 and "held as text" in out


def test_a_deleted_row_is_named(api: Api) -> None:
    workload(api)
    position = position_of(api, "SchedulingStarted", 2)
    with raw(api) as (connection, table, column):
        sql(connection, f"DELETE FROM {table} WHERE {column} = ?", (position,))
    result = verify(api)
    assert not result["ok"]
    first = result["ledger_problems"][0]
    assert f"at position {position}" in first and "deleted" in first


def test_reordered_rows_are_named(api: Api) -> None:
    workload(api)
    first, second = position_of(api, "Submitted", 1), position_of(api, "Submitted", 2)
    with raw(api) as (connection, table, column):
        spare = 10**9
        for old, new in ((first, spare), (second, first), (spare, second)):
            sql(connection, f"UPDATE {table} SET {column} = ? WHERE {column} = ?", (new, old))
    result = verify(api)
    assert not result["ok"]
    said = result["ledger_problems"][0]
    assert f"at position {first}" in said and "reordered" in said


def test_views_that_disagree_with_the_ledger_are_named(api: Api) -> None:
    workload(api)
    with api.services.database.transaction(write=True) as cursor:
        cursor.execute("UPDATE job_list SET status = 'failed' WHERE name = 'job-1'")
    result = verify(api)
    assert result["ledger_problems"] == []
    assert not result["ok"]
    [said] = result["view_differences"]
    assert "(job-1)" in said and "'failed' in the views" in said and "'succeeded'" in said


def test_only_the_admin_verifies_and_the_cli_says_it(api: Api) -> None:
    workload(api)
    bob_token = api.new_user("bob")
    refused = api.client.post("/v1/admin/verify",
                              headers={"Authorization": f"Bearer {bob_token}"})  # fmt: skip
    assert refused.status_code == 403 and refused.json()["type"].endswith("admin-only")
    assert "user bob is no admin" in refused.json()["detail"]
    code, out, err = api.cli("admin", "verify")
    assert code == 0, err
    assert "ok: the ledger's chain holds" in out and "head digest:" in out
    with api.services.database.transaction(write=True) as cursor:
        cursor.execute("UPDATE job_list SET name = 'renamed' WHERE name = 'job-2'")
    code, out, err = api.cli("admin", "verify")
    assert code == 1
    assert "VIEWS: job" in out and "verify found problems" in out
    code, _, err = api.cli("admin", "verify", token=bob_token)
    assert code != 0 and "needs an admin's token" in err


def test_events_written_before_the_chain_are_left_out_and_said(tmp_path: Any) -> None:
    """A ledger from before the chain: its events are not checked; later ones are."""
    plain = {**Settings(data_dir=tmp_path).event_store_env()}
    plain.pop("APPLICATION_RECORDER_TOPIC")
    old = TrainingJobs(env=plain)
    spec = {"repository_url": "https://example.com/r.git", "entry_point": ["t.py"],
            "accels": 1, "nodes": 1}  # fmt: skip
    old.submit("alice", "before", spec, by={"kind": "user", "id": "alice"})
    old.close()
    new = TrainingJobs(env=Settings(data_dir=tmp_path).event_store_env())
    job = new.submit("alice", "after", spec, by={"kind": "user", "id": "alice"})
    new.begin_scheduling(job.job_id)
    from ledger.chain import chain_rows, raw_events

    report = verify_chain(raw_events(new.recorder), chain_rows(new.recorder))
    new.close()
    assert report.ok, report.problems
    assert report.unchained_before == 3 and report.chained == report.events - 2


def test_chain_arithmetic_catches_a_swapped_pair_within_one_job() -> None:
    events = [RawEvent(1, "a", 1, "t.Created", b"x"), RawEvent(2, "a", 2, "t.Moved", b"y")]
    rows, digest, previous = [], GENESIS, GENESIS
    for event in events:
        hashed = event_hash(previous, event.originator_id, event.version, event.topic,
                            event.state)  # fmt: skip
        digest = ledger_digest(digest, event.position, hashed)
        rows.append(ChainRow(event.position, "a", event.version, hashed, digest))
        previous = hashed
    assert verify_chain(events, rows).ok
    swapped = [RawEvent(1, "a", 1, "t.Created", b"y"), RawEvent(2, "a", 2, "t.Moved", b"x")]
    report = verify_chain(swapped, rows)
    assert not report.ok and "position 1" in report.problems[0]

