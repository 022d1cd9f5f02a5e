"""The TrainingJob aggregate keeps to the lifecycle of SPEC.md; names follow the name rules."""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.actors import agent, scheduler, user
from domain.errors import (
    DomainError,
    IllegalTransition,
    InvalidJobSpec,
    JobDeleted,
    JobNotTerminal,
    NameTaken,
)
from domain.job import TrainingJob
from domain.job_facts import end_moment
from domain.job_name import JobName, check_name
from domain.lifecycle import EVENT_STATUS
from domain.node import Node
from tests.support import SPEC_TERMINAL, SPEC_TRANSITIONS

STATUSES = sorted({status for pair in SPEC_TRANSITIONS for status in pair})
TERMINAL = sorted(SPEC_TERMINAL)
NODE = agent("gpu-node-1")

Command = Callable[[TrainingJob], None]


def _built(job: TrainingJob) -> None:
    if job.status == "building" and not job.all_built:
        job.record_built(0, "c0ffee", None, by=NODE)


def _start(job: TrainingJob) -> None:
    """The control plane starts a job once its node is built."""
    _built(job)
    job.start("c0ffee", [0, 1], by=scheduler())


def _enqueue(job: TrainingJob) -> None:
    """Built, but the accelerators are busy: the control plane lines it up."""
    _built(job)
    job.enqueue("c0ffee", by=scheduler())


def _fail_build(job: TrainingJob) -> None:
    job.fail_build("revision_not_found", "revision 'v9' not found", commit=None, by=NODE)


def _preempt(job: TrainingJob) -> None:
    """A higher-priority job takes the accelerators: asked, then the node's processes end."""
    if job.status == "in progress":
        job.request_preemption("urgent", "bob", by=scheduler())
    job.yield_node(by=NODE)


# Each command, the status it leads to, and the statuses SPEC.md's "when" column allows it from.
COMMANDS: dict[str, tuple[str, set[str], Command]] = {
    "begin_scheduling": ("scheduling", {"pending"}, lambda job: job.begin_scheduling(scheduler())),
    "assign": ("building", {"scheduling"},
               lambda job: job.assign("node-1", "gpu-node-1", by=scheduler())),
    "reject": ("rejected", {"scheduling"},
               lambda job: job.reject("no_node_meets_request", "too big", by=scheduler())),
    "enqueue": ("enqueued", {"building"}, _enqueue),
    "start": ("in progress", {"building", "enqueued"}, _start),
    "fail_build": ("failed", {"building"}, _fail_build),
    "requeue": ("scheduling", {"building", "enqueued"},
                lambda job: job.requeue("node lost", by=scheduler())),
    "preempt": ("enqueued", {"in progress"}, _preempt),
    "retry": ("scheduling", {"building", "enqueued", "in progress"},
              lambda job: job.retry("node_lost", "node gpu-node-1 was lost", by=scheduler())),
    "exit_0": ("succeeded", {"in progress"}, lambda job: job.finish(0, by=NODE)),
    "exit_3": ("failed", {"in progress"}, lambda job: job.finish(3, by=NODE)),
    "time_out": ("failed", {"in progress"},
                 lambda job: job.fail("time_limit_exceeded", "ran past 1h", by=NODE)),
    "request_stop": ("stop in progress",
                     {"pending", "scheduling", "building", "enqueued", "in progress"},
                     lambda job: job.request_stop(by=user("alice"))),
    "confirm_stopped": ("stopped", {"stop in progress"}, lambda job: job.confirm_stopped(NODE)),
    "fail_stop": ("stop failed", {"stop in progress"},
                  lambda job: job.fail_stop("processes did not end", by=NODE)),
}  # fmt: skip

# A way to each status from a new job.
PATHS: dict[str, list[str]] = {
    "pending": [],
    "scheduling": ["begin_scheduling"],
    "building": ["begin_scheduling", "assign"],
    "enqueued": ["begin_scheduling", "assign", "enqueue"],
    "in progress": ["begin_scheduling", "assign", "start"],
    "stop in progress": ["begin_scheduling", "assign", "start", "request_stop"],
    "rejected": ["begin_scheduling", "reject"],
    "failed": ["begin_scheduling", "assign", "fail_build"],
    "succeeded": ["begin_scheduling", "assign", "start", "exit_0"],
    "stopped": ["begin_scheduling", "assign", "start", "request_stop", "confirm_stopped"],
    "stop failed": ["begin_scheduling", "assign", "start", "request_stop", "fail_stop"],
}


def job_spec() -> dict[str, Any]:
    return {"repository_url": "https://example.com/r.git", "entry_point": ["train.py"],
            "accels": 2, "nodes": 1, "priority": "low", "max_retries": 3}  # fmt: skip


def new_job(name: str = "my-job") -> TrainingJob:
    return TrainingJob.submit(owner="alice", name=name, spec=job_spec(), by=user("alice"))


def job_at(status: str) -> TrainingJob:
    job = new_job()
    for command in PATHS[status]:
        COMMANDS[command][2](job)
    assert job.status == status
    job.collect_events()
    return job


# -- the lifecycle ------------------------------------------------------------------------


def test_the_commands_cover_every_transition_of_the_spec() -> None:
    covered = {(source, target) for target, sources, _ in COMMANDS.values() for source in sources}
    assert covered == SPEC_TRANSITIONS


@pytest.mark.parametrize(
    ("status", "command"),
    [(status, name) for name, (_, sources, _) in COMMANDS.items() for status in sorted(sources)],
)
def test_every_transition_of_the_spec_is_allowed(status: str, command: str) -> None:
    job = job_at(status)
    target, _, run = COMMANDS[command]
    run(job)
    assert job.status == target
    *before, recorded = job.collect_events()
    assert EVENT_STATUS[type(recorded).__name__] == target
    assert all(type(event).__name__ in ("Built", "PreemptionRequested")
               for event in before)  # changes no status  # fmt: skip


@pytest.mark.parametrize(
    ("status", "command"),
    [
        (status, name)
        for name, (_, sources, _) in COMMANDS.items()
        for status in STATUSES
        if status not in sources
    ],
)
def test_every_other_command_is_refused_naming_both_statuses(status: str, command: str) -> None:
    job = job_at(status)
    target, _, run = COMMANDS[command]
    with pytest.raises(IllegalTransition) as refused:
        run(job)
    assert (refused.value.current, refused.value.attempted) == (status, target)
    assert f"'{status}'" in str(refused.value)
    assert f"'{target}'" in str(refused.value)
    assert job.status == status
    assert job.collect_events() == []


def test_an_exit_code_reported_while_building_is_refused() -> None:
    job = job_at("building")
    with pytest.raises(IllegalTransition, match="'building' and cannot become 'failed'"):
        job.finish(2, by=NODE)
    assert job.failure is None


def test_a_nonzero_exit_fails_the_job_saying_the_code() -> None:
    job = job_at("in progress")
    job.finish(137, by=NODE)
    assert job.status == "failed"
    assert job.failure == {
        "code": "entry_point_failed",
        "message": "the entry point exited with code 137",
    }


def test_the_end_a_node_dates_is_kept_in_utc_and_one_ahead_of_now_is_taken_as_now() -> None:
    assert end_moment(None) is None
    assert end_moment("2026-12-05T17:00:00+01:00") == "2026-12-05T16:00:00.000000+00:00"
    ahead = end_moment((datetime.now(UTC) + timedelta(hours=1)).isoformat())
    assert ahead is not None
    assert timedelta(0) <= datetime.now(UTC) - datetime.fromisoformat(ahead) < timedelta(seconds=5)
    for bad in ("2026-12-05T16:00:00", "soon", 1733414400):
        with pytest.raises(InvalidJobSpec) as refused:
            end_moment(bad)
        assert refused.value.field == "ended_at"
    job = job_at("in progress")
    job.finish(0, by=NODE, ended_at="2026-12-05T16:00:00.000000+00:00")
    [succeeded] = job.collect_events()
    assert succeeded.ended_at == "2026-12-05T16:00:00.000000+00:00"  # type: ignore[attr-defined]


# -- stopping ------------------------------------------------------------------------------


def test_stop_while_in_progress_releases_the_allocated_accelerators() -> None:
    job = job_at("in progress")
    job.request_stop(by=user("alice"))
    job.confirm_stopped(by=NODE)
    requested, stopped = job.collect_events()
    assert requested.stopping_from == "in progress"  # type: ignore[attr-defined]
    assert stopped.accelerators_released == [0, 1]  # type: ignore[attr-defined]
    assert job.accelerators == []


@pytest.mark.parametrize(("status", "advice"), [
    ("stop in progress", "is 'stop in progress' already: wait until it is 'stopped' "
                         "(`flexai training inspect my-job` shows its status)"),
    ("succeeded", "it has ended, so there is nothing to stop (`flexai training delete my-job` "
                  "takes it off the list)"),
    ("rejected", "it has ended, so there is nothing to stop"),
])  # fmt: skip
def test_a_stop_that_cannot_be_says_what_to_do_instead(status: str, advice: str) -> None:
    job = job_at(status)
    with pytest.raises(IllegalTransition, match=re.escape(advice)):
        job.request_stop(by=user("alice"))
    assert job.collect_events() == []


def test_deleting_a_stopping_job_says_to_wait_and_a_running_one_to_stop_it() -> None:
    with pytest.raises(JobNotTerminal, match=re.escape("its stop is under way: wait until it "
                                                       "is 'stopped'")):  # fmt: skip
        job_at("stop in progress").delete(by=user("alice"))
    with pytest.raises(JobNotTerminal, match="stop it first"):
        job_at("in progress").delete(by=user("alice"))


def test_stop_while_enqueued_allocates_no_accelerators() -> None:
    job = job_at("enqueued")
    job.request_stop(by=user("alice"))
    job.confirm_stopped(by=NODE)
    requested, stopped = job.collect_events()
    assert requested.stopping_from == "enqueued"  # type: ignore[attr-defined]
    assert stopped.accelerators_released == []  # type: ignore[attr-defined]
    assert job.status == "stopped"


def test_stop_while_building_allocates_no_accelerators() -> None:
    job = job_at("building")
    job.request_stop(by=user("alice"))
    job.confirm_stopped(by=NODE)
    _, stopped = job.collect_events()
    assert stopped.accelerators_released == []  # type: ignore[attr-defined]


def test_a_failed_stop_says_why() -> None:
    job = job_at("stop in progress")
    job.fail_stop("the processes did not end within 30 s", by=NODE)
    assert job.failure is not None
    assert job.failure["code"] == "stop_failed"
    assert job.failure["message"] == "the processes did not end within 30 s"


# -- deleting ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "status", [s for s in STATUSES if s not in TERMINAL and s != "stop in progress"]
)
def test_deleting_an_unfinished_job_is_refused_with_advice_to_stop_it_first(status: str) -> None:
    job = job_at(status)
    with pytest.raises(JobNotTerminal) as refused:
        job.delete(by=user("alice"))
    assert f"'{status}'" in str(refused.value)
    assert "stop it first (`flexai training stop my-job`)" in str(refused.value)
    assert job.collect_events() == []
    assert not job.deleted


@pytest.mark.parametrize("status", TERMINAL)
def test_a_finished_job_can_be_deleted(status: str) -> None:
    job = job_at(status)
    job.delete(by=user("alice"))
    [deleted] = job.collect_events()
    assert type(deleted).__name__ == "Deleted"
    assert job.deleted
    assert job.status == status  # the history still ends where the job ended


def test_a_deleted_job_takes_no_more_commands() -> None:
    job = job_at("stopped")
    job.delete(by=user("alice"))
    job.collect_events()
    for command in ("request_stop", "begin_scheduling", "confirm_stopped"):
        with pytest.raises(JobDeleted):
            COMMANDS[command][2](job)
    with pytest.raises(JobDeleted, match="history stays readable"):
        job.delete(by=user("alice"))
    assert job.collect_events() == []


# -- who caused each event -----------------------------------------------------------------


def test_events_record_whether_a_user_the_scheduler_or_an_agent_caused_them() -> None:
    job = new_job()
    job.begin_scheduling(by=scheduler())
    job.assign("node-1", "gpu-node-1", by=scheduler())
    job.record_built(0, "c0ffee", None, by=agent("gpu-node-1"))
    job.start("c0ffee", [0], by=scheduler())
    job.request_stop(by=user("alice"))
    by = [(type(e).__name__, e.by) for e in job.collect_events()]  # type: ignore[attr-defined]
    assert by == [
        ("Submitted", {"kind": "user", "id": "alice"}),
        ("SchedulingStarted", {"kind": "scheduler", "id": "scheduler"}),
        ("NodeAssigned", {"kind": "scheduler", "id": "scheduler"}),
        ("Built", {"kind": "agent", "id": "gpu-node-1"}),
        ("Started", {"kind": "scheduler", "id": "scheduler"}),
        ("StopRequested", {"kind": "user", "id": "alice"}),
    ]


def test_events_carry_the_facts_behind_them() -> None:
    job = job_at("building")
    job.record_built(0, "c0ffee", None, by=NODE)
    job.start("c0ffee", [2, 3], by=scheduler())
    [_, started] = job.collect_events()
    assert started.commit == "c0ffee"  # type: ignore[attr-defined]
    assert started.accelerators == [2, 3]  # type: ignore[attr-defined]
    assert started.timestamp is not None


# -- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["abc", "a" * 63, "My_Job-2", "007", "a-b", "x_y"])
def test_names_of_3_to_63_letters_digits_dashes_and_underscores_are_accepted(name: str) -> None:
    check_name(name)
    assert new_job(name).name == name


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("ab", "is 2 characters long; use 3 to 63"),
        ("", "is 0 characters long; use 3 to 63"),
        ("a" * 64, "is 64 characters long; use 3 to 63"),
        ("my job", "may hold only letters, digits, '-' and '_'"),
        ("job.v2", "may hold only letters, digits, '-' and '_'"),
        ("jöb", "may hold only letters, digits, '-' and '_'"),
        ("-job", "must start and end with a letter or a digit"),
        ("job_", "must start and end with a letter or a digit"),
    ],
)
def test_a_bad_name_is_refused_saying_what_is_wrong(name: str, problem: str) -> None:
    with pytest.raises(InvalidJobSpec) as refused:
        new_job(name)
    assert str(refused.value) == f"job name '{name}' {problem}"


ALLOWED = set(string.ascii_letters + string.digits + "-_")
EDGES = set(string.ascii_letters + string.digits)


@given(st.text(alphabet=st.sampled_from(sorted(ALLOWED | set(" .éZ9_-"))), max_size=70)
       | st.text(max_size=70))  # fmt: skip
def test_a_name_is_accepted_exactly_when_the_spec_rules_allow_it(name: str) -> None:
    allowed = (
        3 <= len(name) <= 63 and set(name) <= ALLOWED and name[0] in EDGES and name[-1] in EDGES
    )
    if allowed:
        check_name(name)
    else:
        with pytest.raises(InvalidJobSpec):
            check_name(name)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"repository_url": ""}, "repository URL is required"),
        ({"entry_point": []}, "entry point is required"),
        ({"accels": 0}, "accels must be from 1 to 1024, not 0"),
        ({"accels": 2**70}, "accels must be from 1 to 1024, not 1180591620717411303424"),
        ({"nodes": True}, "nodes must be a whole number, not True"),
    ],
)
def test_a_job_without_what_it_needs_is_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidJobSpec, match=message):
        TrainingJob.submit(owner="alice", name="my-job", spec={**job_spec(), **change},
                           by=user("alice"))  # fmt: skip


# -- the name index and nodes --------------------------------------------------------------


def test_a_held_name_cannot_be_claimed_again() -> None:
    first, second = new_job(), new_job()
    index = JobName(owner="alice", name="my-job", job_id=first.id)
    with pytest.raises(NameTaken, match="delete that job first"):
        index.claim(second.id)
    assert index.job_id == first.id


def test_only_the_job_that_holds_a_name_releases_it() -> None:
    first, second = new_job(), new_job()
    index = JobName(owner="alice", name="my-job", job_id=first.id)
    index.release(second.id)
    assert index.job_id == first.id
    index.release(first.id)
    index.claim(second.id)
    assert index.job_id == second.id


def test_names_are_per_owner() -> None:
    assert JobName.create_id("alice", "my-job") != JobName.create_id("bob", "my-job")


def test_registering_a_node_again_unchanged_records_nothing() -> None:
    node = Node(name="gpu-node-1", accels=8, accel_type="H100", by=NODE)
    node.collect_events()
    node.update(accels=8, accel_type="H100", by=NODE)
    assert node.collect_events() == []
    node.update(accels=4, accel_type="H100", by=NODE)
    assert node.accels == 4
    assert len(node.collect_events()) == 1


# -- outputs ------------------------------------------------------------------------------------

SHA_A, SHA_B = "a" * 64, "b" * 64


def test_a_nodes_output_is_recorded_once_and_a_new_archive_replaces_it() -> None:
    job = job_at("succeeded")
    assert job.record_outputs(0, 2048, SHA_A, by=NODE) is True
    assert job.record_outputs(0, 2048, SHA_A, by=NODE) is False  # a resend records nothing
    assert job.record_outputs(0, 4096, SHA_B, by=NODE) is True
    assert [type(e).__name__ for e in job.collect_events()] == ["OutputsRecorded"] * 2
    assert job.recorded_output(0) == SHA_B


@pytest.mark.parametrize("status", ["pending", "scheduling", "building", "enqueued", "rejected"])
def test_an_output_of_a_job_that_never_ran_is_refused(status: str) -> None:
    job = job_at(status)
    with pytest.raises(DomainError, match="outputs are recorded only once it ran"):
        job.record_outputs(0, 2048, SHA_A, by=NODE)
    assert job.collect_events() == []


@pytest.mark.parametrize(("node_index", "size", "sha256", "field"), [
    (1, 2048, SHA_A, "node_index"), (0, -1, SHA_A, "size"), (0, 2048, "A" * 64, "sha256"),
])  # fmt: skip
def test_an_output_out_of_bounds_is_refused_naming_the_field(
    node_index: int, size: int, sha256: str, field: str
) -> None:
    job = job_at("in progress")
    with pytest.raises(InvalidJobSpec) as refused:
        job.record_outputs(node_index, size, sha256, by=NODE)
    assert refused.value.field == field


def test_a_checkpoints_archive_size_and_sha256_are_checked_when_given() -> None:
    job = job_at("in progress")
    with pytest.raises(InvalidJobSpec) as refused:
        job.record_checkpoint({"id": "c1", "name": "a", "archive_size": 10, "sha256": "x"},
                              by=NODE)  # fmt: skip
    assert refused.value.field == "sha256"
    assert job.record_checkpoint({"id": "c2", "name": "b"}, by=NODE)  # old agents send none
