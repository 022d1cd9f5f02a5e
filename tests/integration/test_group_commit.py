"""Group commit on each store: saves that arrive together are written in one transaction, yet
each keeps its own answer. A save that conflicts fails alone and its neighbours commit; a
command refused before its save never holds the group up; the hash chain runs through the group
as through any other write. And a job a scheduler would start at once is submitted and started
in one save."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

from eventsourcing.persistence import IntegrityError

from domain.actors import scheduler, user
from domain.application import TrainingJobs
from domain.errors import DomainError, NameTaken
from domain.events import event_name
from domain.job_name import JobName
from ledger.chain import chain_rows, raw_events, verify_chain
from tests.integration.conftest import Lifecycle, job_spec

ALICE = user(Lifecycle.owner)
NEW_JOBS = 6
RIVALS = 4
"""Saves of one job's same next version: the first written wins, the others conflict."""
TAKEN = 2
"""Submissions of a name another replica's live job holds: refused after their conflict,
each alone."""


def held_groups(app: TrainingJobs, until_waiting: int) -> tuple[list[int], threading.Event]:
    """Hold the first group's transaction until ``until_waiting`` saves queue behind it, so
    that they make the next group together: the size of each group written, in order, and
    an event set once the first group is held."""
    group_commit = app.recorder.group_commit  # type: ignore[attr-defined]
    write = group_commit._write
    sizes: list[int] = []
    held = threading.Event()

    def holding(group: list[Any]) -> None:
        if not held.is_set():
            held.set()
            deadline = time.monotonic() + 30
            while len(group_commit._waiting) < until_waiting:
                assert time.monotonic() < deadline, "the saves never queued"
                time.sleep(0.005)
        sizes.append(len(group))
        write(group)

    group_commit._write = holding
    return sizes, held


def outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except (DomainError, IntegrityError) as error:
        return error


def test_saves_committed_together_each_get_their_own_answer(
    open_app: Callable[[], TrainingJobs],
) -> None:
    app = open_app()
    owner = Lifecycle.owner
    rival_job = app.submit(owner, "rivalled", job_spec(), by=ALICE).job_id
    open_app().submit(owner, "taken", job_spec(), by=ALICE)  # by a replica: not seen here
    deleted = app.submit(owner, "gone", job_spec(), by=ALICE).job_id
    app.request_stop(deleted, by=ALICE)
    app.delete(deleted, by=ALICE)
    rivals = [copy.deepcopy(app.job(rival_job)) for _ in range(RIVALS)]
    for rival in rivals:
        rival.begin_scheduling(by=scheduler())

    calls: list[Callable[[], Any]] = [
        *(lambda i=i: app.submit(owner, f"new-{i}", job_spec(), by=ALICE)
          for i in range(NEW_JOBS)),
        *(lambda rival=rival: app.save(rival) for rival in rivals),
        *(lambda: app.submit(owner, "taken", job_spec(), by=ALICE) for _ in range(TAKEN)),
        *(lambda: app.request_stop(deleted, by=ALICE) for _ in range(2)),  # refused: no save
    ]  # fmt: skip
    reaching_the_ledger = NEW_JOBS + RIVALS + TAKEN
    sizes, held = held_groups(app, until_waiting=reaching_the_ledger)
    with ThreadPoolExecutor(len(calls) + 1) as pool:
        opener = pool.submit(app.submit, owner, "opener", job_spec(), by=ALICE)
        assert held.wait(30)  # the opener's group is being written (and held)
        results = list(pool.map(outcome, calls))
        opener.result()

    assert sizes[:2] == [1, reaching_the_ledger]  # the opener alone, then all of them at once
    new, saved, taken, refused = (results[:NEW_JOBS], results[NEW_JOBS:NEW_JOBS + RIVALS],
                                  results[NEW_JOBS + RIVALS:-2], results[-2:])  # fmt: skip
    positions = [result.position for result in new]
    assert all(isinstance(p, int) for p in positions) and len(set(positions)) == NEW_JOBS
    for index, result in enumerate(new):
        assert app.job(result.job_id).name == f"new-{index}"
    assert sum(not isinstance(r, IntegrityError) for r in saved) == 1, saved
    assert [event_name(e) for e in app.history(rival_job)] == ["Submitted", "SchedulingStarted"]
    assert all(isinstance(r, NameTaken) for r in taken), taken
    assert all(isinstance(r, DomainError) for r in refused), refused
    # the next event of the rivalled job chains from the winner's hash (on PostgreSQL kept from
    # its commit, not read back), never from a rolled-back rival's
    app.request_stop(rival_job, by=ALICE)

    report = verify_chain(raw_events(app.recorder), chain_rows(app.recorder))
    assert report.ok, report.problems
    assert report.chained == report.events


def test_many_threads_saving_at_once_lose_nothing_and_keep_the_chain(
    open_app: Callable[[], TrainingJobs],
) -> None:
    app, other = open_app(), open_app()  # two replicas: their groups interleave on the ledger
    owner = Lifecycle.owner
    barrier = threading.Barrier(16)

    def submit(index: int) -> UUID | DomainError:
        replica = app if index % 2 else other
        barrier.wait()
        try:  # every fourth one races another for a name
            return replica.submit(owner, f"job-{index // 2 if index % 4 == 0 else index}",
                                  job_spec(), by=ALICE).job_id  # fmt: skip
        except DomainError as error:
            return error

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(submit, range(16)))
    saved = [result for result in results if isinstance(result, UUID)]
    assert len(saved) + sum(isinstance(r, NameTaken) for r in results) == 16
    names = [app.job(job_id).name for job_id in saved]
    assert len(set(names)) == len(names) == 14  # job-2 and job-6 were each asked for twice
    report = verify_chain(raw_events(app.recorder), chain_rows(app.recorder))
    assert report.ok and report.chained == report.events == 2 * len(saved), report.problems


def test_a_job_a_scheduler_would_start_at_once_starts_in_its_submission(
    app: TrainingJobs,
) -> None:
    recorder = app.recorder
    before = recorder.group_commit.groups  # type: ignore[attr-defined]
    started = app.submit(Lifecycle.owner, "at-once", job_spec(), by=ALICE, schedule=True)
    assert recorder.group_commit.groups == before + 1  # type: ignore[attr-defined]
    events = app.history(started.job_id)
    assert [event_name(e) for e in events] == ["Submitted", "SchedulingStarted"]
    assert app.job(started.job_id).status == "scheduling"
    position = started.position or 0
    saved = recorder.select_notifications(position - 2, 3)  # the job's two, its name's claim
    assert [n.id for n in saved] == [position - 2, position - 1, position]
    assert {(UUID(str(n.originator_id)), n.originator_version) for n in saved} == {
        (started.job_id, 1), (started.job_id, 2),
        (JobName.create_id(Lifecycle.owner, "at-once"), 1),
    }  # fmt: skip

    waiting = app.submit(Lifecycle.owner, "later", job_spec(), by=ALICE)
    assert app.job(waiting.job_id).status == "pending"  # the scheduler starts it in its round
    app.begin_scheduling(waiting.job_id)
    assert app.job(waiting.job_id).status == "scheduling"
