"""Many threads, on two application instances (two replicas) of one store, command one job at
once: the user's stops race the agent's reports. Optimistic concurrency and the application's
retries resolve it: no illegal transition is ever recorded, and no command answered with
success is lost."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any
from uuid import UUID

from domain.actors import user
from domain.application import TrainingJobs
from domain.errors import DomainError
from domain.events import event_name
from domain.lifecycle import EVENT_STATUS, TRANSITIONS
from domain.statuses import Status
from tests.integration.conftest import Lifecycle

ROUNDS = 6
THREADS = 8


def statuses_of(app: TrainingJobs, job_id: UUID) -> list[Status]:
    return [EVENT_STATUS[event_name(e)] for e in app.history(job_id)
            if event_name(e) in EVENT_STATUS]  # fmt: skip


def assert_legal(statuses: list[Status]) -> None:
    for before, after in zip(statuses, statuses[1:], strict=False):
        if before == after:
            continue
        assert after in TRANSITIONS.get(before, frozenset()), (before, after, statuses)


def race(calls: list[Callable[[], Any]]) -> list[str]:
    """Run every call at once (a barrier first); ``ok`` or the error's class, per call."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> str:
        barrier.wait()
        try:
            call()
        except DomainError as error:
            return type(error).__name__
        return "ok"

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_stops_racing_the_success_report_never_break_the_lifecycle(
    open_app: Callable[[], TrainingJobs],
) -> None:
    first, second = open_app(), open_app()
    lifecycle = Lifecycle(first)
    alice = user(Lifecycle.owner)
    for round_ in range(ROUNDS):
        job_id = lifecycle.in_progress(f"race-{round_}")
        node = lifecycle.node_id
        exited = {"node_id": node, "type": "exited", "exit_code": 0}
        calls: list[Callable[[], Any]] = []
        for index in range(THREADS):
            app = first if index % 2 else second
            if index % 4 == 0:
                calls.append(partial(app.report, job_id, node, dict(exited)))
            else:
                calls.append(partial(app.request_stop, job_id, by=alice))
        answers = race(calls)
        statuses = statuses_of(first, job_id)
        assert_legal(statuses)
        names = [event_name(e) for e in first.history(job_id)]
        reported = [answer for index, answer in enumerate(answers) if index % 4 == 0]
        stopped = [answer for index, answer in enumerate(answers) if index % 4]
        if "ok" in reported:  # the success report was answered: it is in the ledger
            assert "Succeeded" in names or "StopRequested" in names, (answers, names)
        if "ok" in stopped:  # a stop was answered: it is in the ledger
            assert "StopRequested" in names, (answers, names)
        assert names.count("StopRequested") <= 1 and names.count("Succeeded") <= 1
        assert not ("Succeeded" in names and "StopRequested" in names
                    and names.index("Succeeded") < names.index("StopRequested")), names
        final = first.job(job_id).status
        assert final in (Status.SUCCEEDED, Status.STOP_IN_PROGRESS), (final, answers)
        if final == Status.STOP_IN_PROGRESS:  # the agent's stop report ends it, once
            lifecycle.report(job_id, "stopped", exit_code=0)
            assert second.job(job_id).status == Status.STOPPED
        assert_legal(statuses_of(second, job_id))


def test_many_threads_submitting_one_name_make_one_job(
    open_app: Callable[[], TrainingJobs],
) -> None:
    apps = [open_app(), open_app()]
    spec = {"repository_url": "https://example.com/r.git", "entry_point": ["t.py"],
            "accels": 1, "nodes": 1}  # fmt: skip
    made: list[UUID] = []
    lock = threading.Lock()

    def submit(app: TrainingJobs) -> None:
        outcome = app.submit("alice", "only-one", dict(spec), by=user("alice"))
        with lock:
            made.append(outcome.job_id)

    answers = race([lambda app=apps[index % 2]: submit(app) for index in range(THREADS)])
    assert answers.count("ok") == 1, answers
    assert len(made) == 1
    assert apps[1].job_id_for("alice", "only-one") == made[0]
