"""Debug sessions on the job's ledger (each store): recorded, never a status change, and the
job still loads from snapshots, travels in time and verifies with them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from domain.actors import agent, user
from domain.application import TrainingJobs
from domain.errors import JobNotRunning
from domain.events import event_facts, event_name
from tests.integration.conftest import Lifecycle

FINGERPRINT = "SHA256:abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"
RELAY = "0123456789abcdef0123456789abcdef"
"""The instance id of the server process that relays the session."""


def session_id(number: int) -> str:
    return f"{number:032x}"


def test_a_session_is_recorded_opened_then_closed_and_the_job_runs_on(
    app: TrainingJobs, lifecycle: Lifecycle
) -> None:
    job_id = lifecycle.in_progress("debugged")
    app.open_debug_session(job_id, session_id(1), 0, FINGERPRINT, by=user("alice"),
                           relay=RELAY)  # fmt: skip
    closed = app.close_debug_session(job_id, session_id(1), "the SSH client disconnected", 12.5,
                                     by=user("alice"))  # fmt: skip
    again = app.close_debug_session(job_id, session_id(1), "again", 13.0, by=user("alice"))

    assert closed.position is not None and again.position is None  # closed once
    events = app.history(job_id)
    opened, ended = events[-2], events[-1]
    assert event_name(opened) == "DebugSessionOpened"
    assert event_facts(opened) == {"session_id": session_id(1), "node": "gpu-node-1",
                                   "node_index": 0, "key_fingerprint": FINGERPRINT,
                                   "relay": RELAY}  # fmt: skip
    assert opened.by == user("alice")  # type: ignore[attr-defined]
    assert event_name(ended) == "DebugSessionClosed"
    assert event_facts(ended) == {"session_id": session_id(1),
                                  "reason": "the SSH client disconnected", "seconds": 12.5}
    assert app.job(job_id).status == "in progress"
    lifecycle.report(job_id, "exited", exit_code=0)
    assert app.job(job_id).status == "succeeded"


@pytest.mark.parametrize("where", ["building", "succeeded"])
def test_no_session_opens_into_a_job_that_is_not_in_progress(
    app: TrainingJobs, lifecycle: Lifecycle, where: str
) -> None:
    job_id = getattr(lifecycle, where)(f"job-{where}")
    with pytest.raises(JobNotRunning, match=f"is '{where}'"):
        app.open_debug_session(job_id, session_id(2), 0, FINGERPRINT, by=user("alice"))


def test_a_session_open_when_the_job_ends_is_closed_after_it(
    app: TrainingJobs, lifecycle: Lifecycle
) -> None:
    job_id = lifecycle.in_progress("ends-first")
    app.open_debug_session(job_id, session_id(3), 0, FINGERPRINT, by=user("alice"))
    lifecycle.report(job_id, "exited", exit_code=1)
    app.close_debug_session(job_id, session_id(3), "the node ended the session", 4.0,
                            by=agent("gpu-node-1"))  # fmt: skip
    assert [event_name(e) for e in app.history(job_id)[-2:]] == ["Failed", "DebugSessionClosed"]
    assert app.job(job_id).status == "failed"


def test_sessions_load_from_snapshots_and_travel_in_time(
    open_app: Callable[[], TrainingJobs],
) -> None:
    writer = open_app()
    lifecycle = Lifecycle(writer)
    job_id = lifecycle.in_progress("many-sessions")
    for number in range(60):  # 120 events: past the snapshot interval
        writer.open_debug_session(job_id, session_id(number), 0, FINGERPRINT, by=user("alice"))
        writer.close_debug_session(job_id, session_id(number), "done", 1.0, by=user("alice"))
    writer.open_debug_session(job_id, session_id(99), 0, FINGERPRINT, by=user("alice"))
    opened_at = writer.job(job_id).version

    reader = open_app()  # no aggregate cache: from the last snapshot on
    assert reader.snapshots is not None
    assert list(reader.snapshots.get(job_id, desc=True, limit=1))
    loaded = reader.job(job_id)
    assert loaded.open_debug_sessions == {session_id(99)}
    assert reader.close_debug_session(job_id, session_id(99), "done", 2.0,
                                      by=user("alice")).position is not None  # fmt: skip
    past = reader.job_as_of(job_id, version=opened_at)
    assert past.job.open_debug_sessions == {session_id(99)}
    assert str(past.job.status) == "in progress"
    assert reader.job(job_id).open_debug_sessions == set()


def test_a_job_folded_before_sessions_existed_takes_them(
    app: TrainingJobs, lifecycle: Lifecycle
) -> None:
    job = app.job(lifecycle.in_progress("old-snapshot"))
    del job.__dict__["debug_sessions"]  # as a snapshot taken before this feature holds it
    job.open_debug_session(session_id(5), 0, FINGERPRINT, by=user("alice"))
    assert job.open_debug_sessions == {session_id(5)}
