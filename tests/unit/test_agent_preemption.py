"""A job's later attempts on its node: preempted, it waits enqueued with its build kept and runs
again from the checkpoint its next attempt names; retried, it is taken anew. Real git, venv and
processes; the control plane in memory (``FakeControlPlane``, with each attempt's log apart)."""

from __future__ import annotations

import json
import time
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from node_agent import workdir
from node_agent.client import ApiError
from node_agent.jobdirs import JobDirs
from node_agent.run.jobuser import job_user
from node_agent.supervisor import JobSupervisor
from tests.support import (
    can_run_jobs_as,
    make_repo,
    python_for_user,
    wait_until,
    world_readable_directory,
)
from tests.unit.test_agent_supervisor import (
    FakeControlPlane,
    end_every_job,
    repo_and_commit,
    stream,
    supervise,
)

__all__ = ["end_every_job"]  # its autouse cleanup applies here too


class AttemptsPlane(FakeControlPlane):
    """The fake control plane, with what each attempt ships kept apart (``attempt=K``), the
    answers to reports it is told, and checkpoints to hand out."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[str, str] = {}  # report type -> the status its answer says
        self.checkpoints: dict[str, dict[str, bytes]] = {}  # id -> its files
        self.fetched: list[str] = []
        self.upload_attempts: list[tuple[str, int]] = []  # (kind, attempt) of each upload

    def report(
        self, job_id: str, report: dict[str, Any], retry_for: float | None = None
    ) -> dict[str, Any]:
        answer = super().report(job_id, report, retry_for)
        if report["type"] in self.answers:
            answer = {"status": self.answers[report["type"]]}
        return answer

    def append_logs(
        self, job_id: str, offset: int, data: bytes, node_index: int = 0,
        attempt: int | None = None,
    ) -> int:  # fmt: skip
        assert attempt != 1, "the first attempt's log is sent without the parameter"
        stream_of = job_id if attempt is None else f"{job_id}@{attempt}"
        return super().append_logs(stream_of, offset, data, node_index)

    def begin_upload(
        self, job_id: str, body: dict[str, Any], retry_for: float | None = None,
        attempt: int | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        assert attempt != 1, "the first attempt's output is sent without the parameter"
        self.upload_attempts.append((body["kind"], attempt or 1))
        return super().begin_upload(job_id, body, retry_for)

    def download_checkpoint(self, checkpoint_id: str, destination: Path) -> None:
        self.fetched.append(checkpoint_id)
        with zipfile.ZipFile(destination, "w") as archive:
            for name, data in self.checkpoints[checkpoint_id].items():
                archive.writestr(name, data)

    def attempt_log(self, job_id: str, attempt: int) -> str:
        key = stream(job_id, 0) if attempt == 1 else f"{job_id}@{attempt}"
        return self.logs.get(key, bytearray()).decode()


# The first attempt saves a checkpoint and runs until it is stopped; a later one says what it
# resumed from, and ends by itself.
RESUMING_JOB = """
import json, os, pathlib, time
restarts = os.environ["FLEXAI_RESTART_COUNT"]
given = pathlib.Path(os.environ["FLEXAI_INPUT_CHECKPOINT_DIR"])
seen = {key: os.environ[key] for key in ("FLEXAI_RESTART_COUNT", "FLEXAI_INPUT_CHECKPOINT_DIR",
        "FLEXAI_OUTPUT_DIR", "FLEXAI_OUTPUT_CHECKPOINT_DIR", "CUDA_VISIBLE_DEVICES")}
print("SEEN " + json.dumps(seen), flush=True)
pathlib.Path(os.environ["FLEXAI_OUTPUT_DIR"], "model.txt").write_text("attempt " + restarts)
if restarts == "0":
    saved = pathlib.Path(os.environ["FLEXAI_OUTPUT_CHECKPOINT_DIR"], "checkpoint-7")
    saved.mkdir()
    (saved / "step.txt").write_text("7")
    print("training", flush=True)
    time.sleep(600)
print("resumed from step", (given / "step.txt").read_text(), flush=True)
"""


def seen(log: str) -> dict[str, str]:
    return json.loads(next(line[5:] for line in log.splitlines() if line.startswith("SEEN ")))


def preempted(supervisor: JobSupervisor, plane: AttemptsPlane) -> None:
    """The job runs its first attempt; the control plane asks this node to make way."""
    wait_until(lambda: "training" in plane.attempt_log("job-1", 1))
    running = replace(supervisor.assignment, status="in progress", accelerators=(0,))
    supervisor.update(replace(running, preempt=True))
    wait_until(lambda: plane.reports("job-1") == ["built", "stopped"])


def test_a_preempted_job_waits_enqueued_then_runs_again_from_the_checkpoint_it_is_given(
    tmp_path: Path,
) -> None:
    plane = AttemptsPlane()
    plane.answers["stopped"] = "enqueued"  # the server records Preempted
    plane.checkpoints["ckpt-7"] = {"step.txt": b"7"}
    url, _ = repo_and_commit(tmp_path, RESUMING_JOB)
    supervisor = supervise(tmp_path, plane, url)
    preempted(supervisor, plane)
    assert plane.report_facts("job-1", "stopped")["exit_code"] == 143  # SIGTERM, as a stop
    first = plane.attempt_log("job-1", 1)
    assert "[agent] preempted: stopping for a higher-priority job\n[agent] stopping: SIGTERM" in (
        first
    )

    # Enqueued, then a stale answer: neither is the go of its next attempt.
    waiting = replace(supervisor.assignment, preempt=False, accelerators=None)
    supervisor.update(replace(waiting, status="enqueued", attempt=2))
    supervisor.update(replace(waiting, status="in progress", accelerators=(0,)))  # attempt 1
    time.sleep(0.5)
    assert not plane.attempt_log("job-1", 2)
    assert supervisor.is_alive()

    supervisor.update(replace(waiting, status="in progress", attempt=2, accelerators=(1,),
                              input_checkpoint_id="ckpt-7"))  # fmt: skip
    supervisor.join(60)
    assert plane.reports("job-1") == ["built", "stopped", "exited"]
    assert plane.report_facts("job-1", "exited")["exit_code"] == 0
    assert plane.fetched == ["ckpt-7"]
    second = plane.attempt_log("job-1", 2)
    assert "resumed from step 7" in second
    assert "[agent] attempt 2 of the job: running again from checkpoint ckpt-7" in second
    assert "[build] cloning" not in second  # the build was kept
    dirs = JobDirs.for_job(tmp_path / "agent", "job-1", attempt=2)
    assert seen(second) == {
        "FLEXAI_RESTART_COUNT": "1",
        "FLEXAI_INPUT_CHECKPOINT_DIR": str(dirs.input_checkpoint),
        "FLEXAI_OUTPUT_DIR": str(dirs.output),
        "FLEXAI_OUTPUT_CHECKPOINT_DIR": str(dirs.output_checkpoint),
        "CUDA_VISIBLE_DEVICES": "1",
    }
    assert seen(first)["FLEXAI_RESTART_COUNT"] == "0"
    assert "resumed" not in first and "SEEN" not in second.split("resumed")[1]
    # Each attempt's outputs, and its checkpoint uploaded before it was reported stopped.
    assert ("checkpoint", "job-1", "checkpoint-7", {"step.txt": b"7"}) in plane.events
    outputs = [event[2] for event in plane.events if event[0] == "outputs"]
    assert outputs == [{"model.txt": b"attempt 0"}, {"model.txt": b"attempt 1"}]
    assert [a for a in plane.upload_attempts if a[0] == "output"] == [("output", 1), ("output", 2)]
    # The node keeps each attempt's log, and nothing else of the job.
    assert sorted(path.name for path in dirs.root.iterdir()) == ["job.attempt-2.log", "job.log"]
    assert "resumed from step 7" in (dirs.root / "job.attempt-2.log").read_text()


def test_a_user_stop_while_a_preempted_job_waits_ends_it_without_running_it_again(
    tmp_path: Path,
) -> None:
    plane = AttemptsPlane()
    plane.answers["stopped"] = "enqueued"
    url, _ = repo_and_commit(tmp_path, RESUMING_JOB)
    supervisor = supervise(tmp_path, plane, url)
    preempted(supervisor, plane)
    plane.answers.clear()
    supervisor.update(replace(supervisor.assignment, status="stop in progress", preempt=False))
    supervisor.join(30)
    assert not supervisor.is_alive()
    assert plane.reports("job-1") == ["built", "stopped", "stopped"]
    assert "exit_code" not in plane.events[-1][3]  # nothing ran after the preemption
    assert plane.attempt_log("job-1", 2) == ""
    root = JobDirs.for_job(tmp_path / "agent", "job-1").root
    assert [path.name for path in root.iterdir()] == ["job.log"]


def test_a_node_of_a_preempted_job_whose_other_nodes_still_stop_waits_too(
    tmp_path: Path,
) -> None:
    plane = AttemptsPlane()
    plane.answers["stopped"] = "in progress"  # the job is enqueued once every node yielded
    url, _ = repo_and_commit(tmp_path, RESUMING_JOB)
    supervisor = supervise(tmp_path, plane, url)
    preempted(supervisor, plane)
    time.sleep(0.5)
    assert supervisor.is_alive()  # waiting for its next attempt's go, its build kept
    assert JobDirs.for_job(tmp_path / "agent", "job-1").venv_python.exists()
    supervisor.update(replace(supervisor.assignment, status="stop in progress", preempt=False))
    supervisor.join(30)
    assert plane.reports("job-1") == ["built", "stopped", "stopped"]


def test_a_preempted_job_whose_stop_the_user_won_ends_at_once(tmp_path: Path) -> None:
    plane = AttemptsPlane()
    plane.answers["stopped"] = "stopped"  # the user's stop came first: no Preempted
    url, _ = repo_and_commit(tmp_path, RESUMING_JOB)
    supervisor = supervise(tmp_path, plane, url)
    preempted(supervisor, plane)
    supervisor.join(30)
    assert not supervisor.is_alive()
    assert plane.reports("job-1") == ["built", "stopped"]


def test_a_preempted_job_that_the_control_plane_ends_while_it_waits_ends_here_too(
    tmp_path: Path,
) -> None:
    plane = AttemptsPlane()
    plane.answers["stopped"] = "enqueued"
    url, _ = repo_and_commit(tmp_path, RESUMING_JOB)
    supervisor = supervise(tmp_path, plane, url)
    preempted(supervisor, plane)
    supervisor.update(replace(supervisor.assignment, status="failed", preempt=False))
    supervisor.join(30)
    assert not supervisor.is_alive()
    assert plane.reports("job-1") == ["built", "stopped"]  # nothing more to say


def test_a_next_attempt_whose_checkpoint_is_missing_fails_saying_so(tmp_path: Path) -> None:
    plane = AttemptsPlane()
    plane.answers["stopped"] = "enqueued"
    url, _ = repo_and_commit(tmp_path, RESUMING_JOB)
    supervisor = supervise(tmp_path, plane, url)
    preempted(supervisor, plane)
    plane.download_checkpoint = missing  # type: ignore[method-assign]
    supervisor.update(replace(supervisor.assignment, status="in progress", attempt=2,
                              preempt=False, input_checkpoint_id="ckpt-gone"))  # fmt: skip
    supervisor.join(30)
    assert plane.reports("job-1") == ["built", "stopped", "failed"]
    failed = plane.report_facts("job-1", "failed")
    assert failed["code"] == "checkpoint_not_found"
    assert "checkpoint ckpt-gone could not be fetched" in failed["message"]
    assert failed["message"] in plane.attempt_log("job-1", 2)


def missing(checkpoint_id: str, destination: Path) -> None:
    raise ApiError(404, {"type": "https://flexai.dev/problems/checkpoint-not-found"})


def test_a_retried_job_taken_again_on_this_node_ships_its_new_attempt_apart(
    tmp_path: Path,
) -> None:
    plane = AttemptsPlane()
    plane.checkpoints["ckpt-7"] = {"step.txt": b"7"}
    url, _ = repo_and_commit(tmp_path, RESUMING_JOB)
    dirs = JobDirs.for_job(tmp_path / "agent", "job-1")
    dirs.root.mkdir(parents=True)
    dirs.log_file.write_text("the first attempt's log\n")  # it failed here, then was retried
    supervise(tmp_path, plane, url, node={"attempt": 2, "input_checkpoint_id": "ckpt-7"}).join(60)
    assert plane.reports("job-1") == ["built", "exited"]
    log = plane.attempt_log("job-1", 2)
    assert "[build] cloning" in log and "resumed from step 7" in log
    assert seen(log)["FLEXAI_RESTART_COUNT"] == "1"
    assert plane.attempt_log("job-1", 1) == ""
    assert dirs.log_file.read_text() == "the first attempt's log\n"  # kept for the operator
    assert ("output", 2) in plane.upload_attempts


def test_each_attempt_has_its_own_folders_and_the_cleanup_keeps_every_log(
    tmp_path: Path,
) -> None:
    first = JobDirs.for_job(tmp_path, "job-1")
    third = first.for_attempt(3)
    assert (first.log_file.name, third.log_file.name) == ("job.log", "job.attempt-3.log")
    assert third.earlier_logs() == [first.root / "job.log", first.root / "job.attempt-2.log"]
    assert third.repo == first.repo and third.input == first.input and third.marker == first.marker
    assert len({first.output, third.output, first.input_checkpoint, third.input_checkpoint}) == 4
    first.create_fresh()
    first.log_file.write_text("one")
    first.for_attempt(2).log_file.write_text("two")
    (first.output / "model.txt").write_text("weights")
    third.create_fresh()  # a retry here: the earlier logs stay
    assert not (first.output / "model.txt").exists()
    assert sorted(p.name for p in first.root.iterdir() if p.is_file()) == [
        "job.attempt-2.log", "job.log"]  # fmt: skip
    third.log_file.write_text("three")
    third.remove_all_but_log()
    assert sorted(p.name for p in first.root.iterdir()) == [
        "job.attempt-2.log", "job.attempt-3.log", "job.log"]  # fmt: skip


def test_a_later_attempt_run_as_the_job_user_owns_its_new_folders_and_not_its_logs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if reason := can_run_jobs_as("nobody"):
        pytest.skip(reason)
    nobody_python = python_for_user("nobody")
    if nobody_python is None:
        pytest.skip("no Python interpreter here that nobody can run with venv and pip")
    with world_readable_directory() as open_dir:
        agent_dir = open_dir / "agent"
        with workdir.exclusive(agent_dir, jobs_run_as_another_user=True):
            plane = AttemptsPlane()
            plane.answers["stopped"] = "enqueued"
            plane.checkpoints["ckpt-7"] = {"step.txt": b"7"}
            repo = make_repo(
                open_dir / "origin", {"train.py": RESUMING_JOB, "requirements.txt": ""}
            )
            settings = {"job_user": job_user("nobody"), "job_python": nobody_python,
                        "keep_job_dirs": True}  # fmt: skip
            supervisor = supervise(open_dir, plane, str(repo), settings=settings)
            preempted(supervisor, plane)
            supervisor.update(replace(supervisor.assignment, status="in progress", attempt=2,
                                      preempt=False, input_checkpoint_id="ckpt-7"))  # fmt: skip
            supervisor.join(60)
            assert plane.reports("job-1") == ["built", "stopped", "exited"], plane.attempt_log(
                "job-1", 2
            )
            assert "resumed from step 7" in plane.attempt_log("job-1", 2)
            dirs = JobDirs.for_job(agent_dir, "job-1", attempt=2)
            assert {folder.stat().st_uid for folder in dirs.attempt_folders} == {65534}
            assert (dirs.input_checkpoint / "step.txt").stat().st_uid == 65534
            assert dirs.log_file.stat().st_uid == 0  # the job reads its log, cannot rewrite it
            assert dirs.for_attempt(1).log_file.stat().st_uid == 0
