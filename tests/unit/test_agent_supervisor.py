"""One job's life under the supervisor: real git, venv and processes; an in-memory control plane."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node_agent.accelerators import AcceleratorPool
from node_agent.client import ApiError, ApiUnavailable
from node_agent.models import Assignment, JobDirs, JobSpec
from node_agent.supervisor import JobSupervisor, SupervisorSettings
from tests.support import STUBBORN_GROUP, alive, git, job_repo, unzip, wait_until

REPORTED_STATUS = {
    "enqueued": "enqueued",
    "started": "in progress",
    "build_failed": "failed",
    "exited": "succeeded",
    "failed": "failed",
    "stopped": "stopped",
    "stop_failed": "stop failed",
    "logs_unavailable": "in progress",
}


class FakeControlPlane:
    """The agent routes in memory; ``events`` keeps the order things reached the server."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.logs: dict[str, bytearray] = {}
        self.refuse: dict[str, str] = {}  # report type -> the status a 409 says the job has
        self.storage_down = False  # log appends answer 503 storage-unavailable
        self.refuse_uploads: ApiError | None = None
        self.lock = threading.Lock()

    def report(self, job_id: str, report: dict[str, Any], retry_for: float | None = None) -> str:
        kind = report["type"]
        if kind in self.refuse:
            raise ApiError(
                409,
                {
                    "type": "https://flexai.dev/problems/illegal-transition",
                    "current_status": self.refuse[kind],
                },
            )
        with self.lock:
            self.events.append(("report", job_id, kind, report))
        return REPORTED_STATUS[kind]

    def append_logs(self, job_id: str, offset: int, data: bytes) -> int:
        if self.storage_down:
            raise ApiUnavailable(
                "the control plane answered 503 storage-unavailable: disk full", retry_after=0.05
            )
        with self.lock:
            held = self.logs.setdefault(job_id, bytearray())
            assert offset <= len(held)
            held.extend(data[len(held) - offset :])
            self.events.append(("logs", job_id))
            return len(held)

    def upload_checkpoint(self, job_id: str, name: str, node_id: str, archive: Path) -> None:
        if self.refuse_uploads is not None:
            raise self.refuse_uploads
        with self.lock:
            self.events.append(("checkpoint", job_id, name, unzip(archive)))

    def upload_outputs(
        self, job_id: str, node_index: int, archive: Path, *, retry_for: float | None = None
    ) -> None:
        if self.refuse_uploads is not None:
            raise self.refuse_uploads
        with self.lock:
            self.events.append(("outputs", job_id, unzip(archive)))

    def reports(self, job_id: str) -> list[str]:
        return [event[2] for event in self.events if event[:2] == ("report", job_id)]

    def report_facts(self, job_id: str, kind: str) -> dict[str, Any]:
        return next(e[3] for e in self.events if e[:3] == ("report", job_id, kind))

    def log_text(self, job_id: str) -> str:
        return self.logs.get(job_id, bytearray()).decode()

    def last_index(self, job_id: str, kind: str) -> int:
        return max(i for i, event in enumerate(self.events) if event[:2] == (kind, job_id))


def repo_and_commit(root: Path, train_py: str) -> tuple[str, str]:
    """The job's repository (see ``job_repo``), as its URL and its commit."""
    repo = job_repo(root, train_py)
    return str(repo), git(repo, "rev-parse", "HEAD")


@pytest.fixture
def plane() -> FakeControlPlane:
    return FakeControlPlane()


STARTED: list[JobSupervisor] = []


@pytest.fixture(autouse=True)
def end_every_job() -> Iterator[None]:
    """A failing test must not leave its job's processes running."""
    yield
    while STARTED:
        supervisor = STARTED.pop()
        supervisor.abort()
        supervisor.join(10)


def supervise(
    tmp_path: Path,
    plane: FakeControlPlane,
    url: str,
    job_id: str = "job-1",
    pool: AcceleratorPool | None = None,
    datasets_dir: Path | None = None,
    settings: dict[str, Any] | None = None,
    **spec: Any,
) -> JobSupervisor:
    entry_point = tuple(spec.pop("entry_point", ("train.py",)))
    assignment = Assignment(
        job_id=job_id,
        name=f"name-{job_id}",
        status="building",
        spec=JobSpec(repository_url=url, entry_point=entry_point, **spec),
    )
    supervisor = JobSupervisor(
        assignment,
        client=plane,  # type: ignore[arg-type]
        node_id="node-1",
        pool=pool or AcceleratorPool(2),
        settings=SupervisorSettings(
            work_dir=tmp_path / "agent",
            datasets_dir=datasets_dir,
            stop_grace=0.5,
            log_flush_interval=0.05,
            checkpoint_stable_for=0.2,
            **(settings or {}),
        ),
    )
    supervisor.start()
    STARTED.append(supervisor)
    return supervisor


ENV_KEYS = [
    "FLEXAI_OUTPUT_DIR",
    "FLEXAI_OUTPUT_CHECKPOINT_DIR",
    "FLEXAI_INPUT_CHECKPOINT_DIR",
    "FLEXAI_INPUT_DIR",
    "CUDA_VISIBLE_DEVICES",
    "PYTHONUNBUFFERED",
    "VIRTUAL_ENV",
    "LR",
]

REPORTING_JOB = f"""
import json, os, pathlib, sys
seen = {{key: os.environ.get(key) for key in {ENV_KEYS!r}}}
seen.update(executable=sys.executable, cwd=os.getcwd(), args=sys.argv[1:])
print("ENV " + json.dumps(seen))
pathlib.Path(os.environ["FLEXAI_OUTPUT_DIR"], "result.txt").write_text("done")
checkpoint = pathlib.Path(os.environ["FLEXAI_OUTPUT_CHECKPOINT_DIR"], "checkpoint-1")
checkpoint.mkdir()
(checkpoint / "w.bin").write_bytes(b"w")
print("last line", file=sys.stderr)
"""


def test_a_job_runs_in_its_environment_and_reports_exited_after_logs_checkpoints_and_outputs(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, commit = repo_and_commit(tmp_path, REPORTING_JOB)
    supervisor = supervise(
        tmp_path, plane, url, entry_point=["train.py", "--lr", "0.1"], env={"LR": "0.1"}
    )
    supervisor.join(30)
    assert plane.reports("job-1") == ["started", "exited"]
    started = plane.report_facts("job-1", "started")
    assert started == {
        "node_id": "node-1",
        "type": "started",
        "commit": commit,
        "accelerators": [0],
    }
    assert plane.report_facts("job-1", "exited")["exit_code"] == 0

    log = plane.log_text("job-1")
    assert "[build] cloning" in log
    assert log.rstrip().endswith("[agent] the entry point exited with code 0")
    assert "last line" in log
    dirs = JobDirs.for_job(tmp_path / "agent", "job-1")
    seen = json.loads(next(line[4:] for line in log.splitlines() if line.startswith("ENV ")))
    assert seen == {
        "FLEXAI_OUTPUT_DIR": str(dirs.output),
        "FLEXAI_OUTPUT_CHECKPOINT_DIR": str(dirs.output_checkpoint),
        "FLEXAI_INPUT_CHECKPOINT_DIR": str(dirs.input_checkpoint),
        "FLEXAI_INPUT_DIR": str(dirs.input),
        "CUDA_VISIBLE_DEVICES": "0",
        "PYTHONUNBUFFERED": "1",
        "VIRTUAL_ENV": str(dirs.venv),
        "LR": "0.1",
        "executable": str(dirs.venv_python),
        "cwd": str(dirs.repo.resolve()),
        "args": ["--lr", "0.1"],
    }

    exited = plane.events.index(
        ("report", "job-1", "exited", plane.report_facts("job-1", "exited"))
    )
    assert plane.last_index("job-1", "logs") < exited
    assert plane.last_index("job-1", "checkpoint") < exited
    assert plane.last_index("job-1", "outputs") < exited
    assert ("checkpoint", "job-1", "checkpoint-1", {"w.bin": b"w"}) in plane.events
    assert ("outputs", "job-1", {"result.txt": b"done"}) in plane.events
    assert [path.name for path in dirs.root.iterdir()] == ["job.log"]


def test_a_failing_entry_point_reports_its_exit_code(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, "import sys\nprint('boom')\nsys.exit(3)\n")
    supervise(tmp_path, plane, url).join(30)
    assert plane.reports("job-1") == ["started", "exited"]
    assert plane.report_facts("job-1", "exited")["exit_code"] == 3
    assert "[agent] the entry point exited with code 3" in plane.log_text("job-1")
    assert ("outputs", "job-1", {}) in plane.events


def test_stopping_a_job_ends_every_process_of_its_group_then_reports_stopped(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, STUBBORN_GROUP)
    supervisor = supervise(tmp_path, plane, url)

    def pids() -> list[int]:
        lines = plane.log_text("job-1").splitlines()
        return [int(line.split()[1]) for line in lines if line.startswith("PID ")]

    wait_until(lambda: len(pids()) == 3)
    assert all(alive(pid) for pid in pids())
    supervisor.stop()
    supervisor.join(30)
    assert plane.reports("job-1") == ["started", "stopped"]
    assert plane.report_facts("job-1", "stopped")["exit_code"] == 137  # it ignored SIGTERM
    assert not any(alive(pid) for pid in pids())
    assert "[agent] stopping: SIGTERM" in plane.log_text("job-1")
    assert plane.last_index("job-1", "outputs") < plane.last_index("job-1", "report")


def test_a_stopped_entry_point_that_obeys_sigterm_is_reported_with_exit_code_143(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    supervisor = supervise(tmp_path, plane, url)
    wait_until(lambda: "up" in plane.log_text("job-1"))
    supervisor.stop()
    supervisor.join(30)
    assert plane.reports("job-1") == ["started", "stopped"]
    assert plane.report_facts("job-1", "stopped")["exit_code"] == 143
    assert "killed by SIGTERM (exit code 143)" in plane.log_text("job-1")


# Ends with 0 once the flag file exists, and only then: SIGTERM cannot end it first.
EXITS_0_ON_FLAG = """
import os, pathlib, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("waiting", flush=True)
while not pathlib.Path(os.environ["FLAG"]).exists():
    time.sleep(0.01)
"""


def test_a_stop_that_races_an_exit_0_is_reported_as_stopped_with_exit_code_0(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, EXITS_0_ON_FLAG)
    flag = tmp_path / "flag"
    supervisor = supervise(tmp_path, plane, url, env={"FLAG": str(flag)})
    wait_until(lambda: "waiting" in plane.log_text("job-1"))
    plane.refuse["exited"] = "stop in progress"  # the control plane took the user's stop
    flag.write_text("exit now")
    supervisor.stop()
    supervisor.join(30)
    assert plane.reports("job-1") == ["started", "stopped"]
    assert plane.report_facts("job-1", "stopped")["exit_code"] == 0


WAITING_JOB = """
import os, pathlib, time
flag = os.environ.get("WAIT_FOR")
while flag and not pathlib.Path(flag).exists():
    time.sleep(0.05)
print("ran on", os.environ["CUDA_VISIBLE_DEVICES"])
"""


def test_a_job_needing_busy_accelerators_is_enqueued_then_started_once_they_are_freed(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, commit = repo_and_commit(tmp_path, WAITING_JOB)
    pool = AcceleratorPool(1)
    flag = tmp_path / "release"
    first = supervise(tmp_path, plane, url, "job-a", pool, env={"WAIT_FOR": str(flag)})
    wait_until(lambda: plane.reports("job-a") == ["started"])
    second = supervise(tmp_path, plane, url, "job-b", pool)
    wait_until(lambda: plane.reports("job-b") == ["enqueued"])
    assert plane.report_facts("job-b", "enqueued")["commit"] == commit
    flag.write_text("go")
    first.join(30)
    second.join(30)
    assert plane.reports("job-a") == ["started", "exited"]
    assert plane.reports("job-b") == ["enqueued", "started", "exited"]
    assert plane.report_facts("job-b", "started")["accelerators"] == [0]
    assert "ran on 0" in plane.log_text("job-b")


def test_a_stop_while_enqueued_reports_stopped_without_running_anything(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, "print('should not run')\n")
    pool = AcceleratorPool(1)
    pool.acquire("someone-else", 1, cancel=threading.Event())
    supervisor = supervise(tmp_path, plane, url, pool=pool)
    wait_until(lambda: plane.reports("job-1") == ["enqueued"])
    supervisor.stop()
    supervisor.join(30)
    assert plane.reports("job-1") == ["enqueued", "stopped"]
    assert "exit_code" not in plane.report_facts("job-1", "stopped")  # nothing ran
    assert "should not run" not in plane.log_text("job-1")


def test_a_build_failure_is_reported_with_its_code_after_the_logs(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, "print('hi')\n")
    supervise(tmp_path, plane, url, repository_revision="nope").join(30)
    assert plane.reports("job-1") == ["build_failed"]
    facts = plane.report_facts("job-1", "build_failed")
    assert facts["code"] == "revision_not_found"
    assert facts["commit"] is None
    assert f"[build] failed: revision 'nope' not found in {url}" in plane.log_text("job-1")
    assert plane.last_index("job-1", "logs") < plane.last_index("job-1", "report")


def test_an_exit_refused_because_the_user_stopped_the_job_is_reported_as_stopped(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    plane.refuse["exited"] = "stop in progress"
    url, _ = repo_and_commit(tmp_path, "print('quick')\n")
    supervise(tmp_path, plane, url).join(30)
    assert plane.reports("job-1") == ["started", "stopped"]
    assert plane.report_facts("job-1", "stopped")["exit_code"] == 0


def test_a_job_asking_for_more_accelerators_than_the_node_has_fails_its_build(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, "print('hi')\n")
    supervise(tmp_path, plane, url, accels=3).join(30)
    assert plane.reports("job-1") == ["build_failed"]
    assert plane.report_facts("job-1", "build_failed")["message"] == (
        "the job asks for 3 accelerators; this node has 2"
    )


def test_an_entry_point_the_system_cannot_execute_exits_with_126(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, "print('hi')\n")
    script = Path(url) / "run"
    script.write_bytes(b"\x00not a program")
    script.chmod(0o755)
    git(url, "add", "run")
    git(url, "commit", "-q", "-m", "run")
    supervise(tmp_path, plane, url, entry_point=["run"]).join(30)
    assert plane.reports("job-1") == ["started", "exited"]
    assert plane.report_facts("job-1", "exited")["exit_code"] == 126
    assert "[agent] cannot start the entry point" in plane.log_text("job-1")


def test_cleaning_up_a_finished_job_leaves_its_datasets_untouched(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    datasets = tmp_path / "datasets"
    (datasets / "mnist").mkdir(parents=True)
    (datasets / "mnist" / "train.csv").write_text("1,2\n")
    job = "import os\nprint(open(os.environ['FLEXAI_INPUT_DIR'] + '/mnist/train.csv').read())\n"
    url, _ = repo_and_commit(tmp_path, job)
    supervise(tmp_path, plane, url, datasets=("mnist",), datasets_dir=datasets).join(30)
    assert plane.reports("job-1") == ["started", "exited"]
    assert "1,2" in plane.log_text("job-1")
    assert (datasets / "mnist" / "train.csv").read_text() == "1,2\n"
    assert not (tmp_path / "agent" / "jobs" / "job-1" / "input").exists()


def test_a_job_whose_logs_cannot_be_stored_is_told_so_and_reported_after_the_drain_timeout(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    plane.storage_down = True
    url, _ = repo_and_commit(tmp_path, "print('trained')\n")
    settings = {"log_drain_timeout": 1.0, "logs_unavailable_after": 0.2}
    supervisor = supervise(tmp_path, plane, url, settings=settings)
    supervisor.join(30)
    assert plane.reports("job-1")[-1] == "exited"
    assert plane.reports("job-1").count("logs_unavailable") == 1  # stuck at one offset
    facts = plane.report_facts("job-1", "logs_unavailable")
    log_file = tmp_path / "agent" / "jobs" / "job-1" / "job.log"
    assert facts["offset"] == 0 and facts["written"] > 0
    assert facts["message"].startswith("logs cannot be stored: the control plane answered 503")
    assert facts["message"].endswith(f"the full log is kept on the node in {log_file}")
    assert "trained" in log_file.read_text()


def test_logs_still_missing_at_the_end_are_told_before_the_end_even_if_the_job_was_quick(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    """The drain ends before the shipper's own patience does: the supervisor says it."""
    plane.storage_down = True
    url, _ = repo_and_commit(tmp_path, "print('trained')\n")
    settings = {"log_drain_timeout": 0.5, "logs_unavailable_after": 60.0}
    supervisor = supervise(tmp_path, plane, url, settings=settings)
    supervisor.join(30)
    assert plane.reports("job-1")[-2:] == ["logs_unavailable", "exited"]
    facts = plane.report_facts("job-1", "logs_unavailable")
    assert "could not be shipped within 0.5 s" in facts["message"]
    assert facts["offset"] == 0 and facts["written"] > 0


def test_checkpoints_and_outputs_refused_as_too_large_are_logged_once_and_the_job_ends(
    tmp_path: Path, plane: FakeControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    plane.refuse_uploads = ApiError(
        413,
        {
            "type": "https://flexai.dev/problems/payload-too-large",
            "detail": "the archive is over 1000 bytes; send less",
            "limit": 1000,
        },
    )
    url, _ = repo_and_commit(tmp_path, REPORTING_JOB)
    with caplog.at_level(logging.ERROR, logger="flexai.agent"):
        supervise(tmp_path, plane, url).join(30)
    assert plane.reports("job-1") == ["started", "exited"]
    assert plane.report_facts("job-1", "exited")["exit_code"] == 0
    refusals = [r.getMessage() for r in caplog.records if "over 1000 bytes" in r.getMessage()]
    assert len(refusals) == 2, refusals  # the checkpoint, the outputs: once each
    assert "checkpoint checkpoint-1 not uploaded: 413 payload-too-large" in refusals[0]
    assert "the output directory was not uploaded: 413 payload-too-large" in refusals[1]
