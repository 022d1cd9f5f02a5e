"""An agent that restarted: a job whose entry point exited meanwhile is reported as it ended, and
what it left running is ended, not followed as the job; a job it was building is built again,
appending to its log, so the control plane's copy stays whole. Real git, venv and processes;
the control plane in memory (``FakeControlPlane``)."""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from node_agent.artifacts.checkpoints import CheckpointWatcher
from node_agent.artifacts.uploader import ArtifactUploader
from node_agent.jobdirs import JobDirs
from node_agent.models import MARKER_VARIABLE
from node_agent.run.jobrun import JobRun
from tests.support import alive, wait_until
from tests.unit.test_agent_supervisor import (
    FakeControlPlane,
    end_every_job,
    plane,
    repo_and_commit,
    supervise,
)

__all__ = ["end_every_job", "plane"]  # their fixtures apply here too

# Leaves a process in a session of its own (it ignores SIGTERM when told to), then exits.
LEAVES_AN_ESCAPEE = """
import os, subprocess, sys
child = "import os, signal, sys, time\\n"
child += "if sys.argv[1] == 'stubborn': signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
child += "print('ESCAPED', os.getpid(), flush=True)\\ntime.sleep(600)\\n"
subprocess.Popen([sys.executable, "-c", child, sys.argv[1]], start_new_session=True)
print("bye", flush=True)
sys.exit(int(sys.argv[2]))
"""


def escapee(dirs: JobDirs) -> int | None:
    lines = dirs.log_file.read_text().splitlines()
    return next((int(line.split()[1]) for line in lines if line.startswith("ESCAPED ")), None)


@pytest.mark.parametrize(
    ("status", "child", "code", "report"),
    [
        ("in progress", "obedient", 0, "exited"),
        ("in progress", "stubborn", 3, "exited"),
        ("stop in progress", "obedient", 0, "stopped"),
    ],
)
def test_an_entry_point_that_exited_while_the_agent_was_down_is_reported_and_its_escapee_ended(
    tmp_path: Path,
    plane: FakeControlPlane,
    job_runs: list[JobRun],
    status: str,
    child: str,
    code: int,
    report: str,
) -> None:
    dirs, run = left_running(tmp_path, ["-c", LEAVES_AN_ESCAPEE, child, str(code)], job_runs)
    assert run.wait(20)
    wait_until(lambda: escapee(dirs) is not None)
    pid = escapee(dirs)
    assert pid is not None and alive(pid)
    ended = datetime.fromtimestamp(dirs.exit_code_file.stat().st_mtime, UTC)  # by the shim
    started = time.monotonic()
    supervisor = supervise(tmp_path, plane, "/repo", node={"status": status, "adopting": True})
    supervisor.join(20)
    assert not supervisor.is_alive(), "the agent followed the leftover process as the job"
    assert plane.reports("job-1") == [report]
    assert plane.report_facts("job-1", report)["exit_code"] == code
    said = plane.report_facts("job-1", report)["ended_at"]
    assert said == ended.isoformat(timespec="microseconds")  # not when it was reported
    assert not alive(pid)
    assert time.monotonic() - started < 10  # SIGKILL after the stop grace (0.5 s here)
    log = plane.log_text("job-1")
    assert "bye\n" in log
    assert f"[agent] the entry point exited with code {code}\n" in log
    assert "[agent] ending 1 process the entry point left behind: SIGTERM" in log


def left_running(tmp_path: Path, argv: list[str], runs: list[JobRun]) -> tuple[JobDirs, JobRun]:
    """A job an agent now gone left running (``python ARGV...``): its directory, its run."""
    dirs = JobDirs.for_job(tmp_path / "agent", "job-1")
    dirs.create_fresh()
    dirs.repo.mkdir()
    dirs.log_file.write_text("[agent] running train.py\n")
    env = {**os.environ, MARKER_VARIABLE: dirs.marker}
    run = JobRun.launch([sys.executable, *argv], dirs=dirs, env=env, python=sys.executable,
                        as_user=None, work_dir=tmp_path / "agent")  # fmt: skip
    runs.append(run)
    return dirs, run


def test_a_job_built_again_after_a_restart_ships_its_whole_log_nothing_lost_or_cut(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, "print('trained')\n")
    plane.built_answer = {"status": "building"}  # it waits for its other nodes to build
    first = supervise(tmp_path, plane, url)
    wait_until(lambda: "[agent] built; waiting for" in plane.log_text("job-1"))
    first.abort()  # the agent goes down before the job starts
    first.join(10)
    shipped = plane.log_text("job-1")
    plane.built_answer = {"status": "in progress", "accelerators": [0]}
    supervise(tmp_path, plane, url).join(60)  # the agent back: the job is still building
    assert plane.reports("job-1") == ["built", "built", "exited"]
    log = plane.log_text("job-1")
    assert log == JobDirs.for_job(tmp_path / "agent", "job-1").log_file.read_text()
    again = "[agent] the node agent restarted before the job started; building it again\n"
    assert log.startswith(shipped + again)
    assert log.count("[build] checked out commit") == 2
    assert log.endswith("trained\n[agent] the entry point exited with code 0\n")


# Writes a checkpoint in two stages, the second once told to (the agent is down by then).
STAGES_TOLD = """
import pathlib, sys, time
checkpoint, told = pathlib.Path(sys.argv[1], "checkpoint-1"), pathlib.Path(sys.argv[2])
checkpoint.mkdir()
(checkpoint / "model.bin").write_bytes(b"model")
while not told.exists():
    time.sleep(0.02)
(checkpoint / "optimizer.bin").write_bytes(b"optimizer")
"""


def test_a_checkpoint_finished_while_the_agent_was_down_reaches_the_store_whole(
    tmp_path: Path, plane: FakeControlPlane, job_runs: list[JobRun]
) -> None:
    """The agent that uploaded checkpoint-1's first half went down (kill -9: its job ran on);
    the job finished checkpoint-1 meanwhile. The restarted agent uploads it again, as
    checkpoint-1.v2, from what the first one recorded in its scratch folder: without that
    record, the control plane's "recorded already" would have left only the first half."""
    told = tmp_path / "told"
    dirs = JobDirs.for_job(tmp_path / "agent", "job-1")
    _, run = left_running(tmp_path, ["-c", STAGES_TOLD, str(dirs.output_checkpoint), str(told)],
                          job_runs)  # fmt: skip
    first = CheckpointWatcher(ArtifactUploader(plane), "job-1", "node-1",  # type: ignore[arg-type]
                              dirs.output_checkpoint, stable_for=0.2, interval=0.05,
                              record=dirs.checkpoint_record)  # fmt: skip
    first.start()
    wait_until(lambda: first.uploaded == ["checkpoint-1"])
    first.stop_watching()  # the first agent is gone
    told.touch()
    assert run.wait(20)
    supervise(tmp_path, plane, "/repo", node={"status": "in progress", "adopting": True}).join(30)
    assert plane.reports("job-1") == ["exited"]
    uploads = [event[2:] for event in plane.events if event[0] == "checkpoint"]
    assert uploads == [
        ("checkpoint-1", {"model.bin": b"model"}),
        ("checkpoint-1.v2", {"model.bin": b"model", "optimizer.bin": b"optimizer"}),
    ]
    assert "[agent] checkpoint checkpoint-1 changed after it was uploaded" in plane.log_text(
        "job-1"
    )


TICKS = """
import time
n = 0
while True:
    n += 1
    print("tick", n, flush=True)
    time.sleep(0.002)
"""


@pytest.mark.parametrize(
    ("shutting_down", "said"),
    [
        (True, "[agent] the node agent is stopping: it ended the job's processes on this node\n"),
        (False, "[agent] the job no longer runs on this node (it ended or was stopped elsewhere: "
                "`flexai training inspect` says why): its processes here were ended\n"),
    ],
)  # fmt: skip
def test_a_job_the_agent_ends_ships_its_last_lines_and_says_why_it_ended(
    tmp_path: Path, plane: FakeControlPlane, shutting_down: bool, said: str
) -> None:
    """The agent's shutdown (SIGTERM), or another node's failure of a multi-node job (the job
    leaves this node's list): the job's processes end, and the control plane's copy of its log
    is the node's whole log, with the agent's word on why it ended."""
    url, _ = repo_and_commit(tmp_path, TICKS)
    supervisor = supervise(tmp_path, plane, url)
    wait_until(lambda: "tick 200\n" in plane.log_text("job-1"))
    supervisor.abort(shutting_down=shutting_down)
    supervisor.join(20)
    assert not supervisor.is_alive()
    assert plane.reports("job-1") == ["built"]  # nothing more: the agent ended it, not the job
    log = JobDirs.for_job(tmp_path / "agent", "job-1").log_file.read_text()
    assert plane.log_text("job-1") == log
    assert log.endswith(said)
