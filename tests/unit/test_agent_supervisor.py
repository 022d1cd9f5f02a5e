"""One job's life under the supervisor: real git, venv and processes; an in-memory control plane."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from node_agent.accelerators import AcceleratorPool
from node_agent.artifacts import uploader as uploads
from node_agent.client import ApiError, ApiUnavailable
from node_agent.jobdirs import JobDirs
from node_agent.models import MARKER_VARIABLE, Assignment, JobSpec, Rendezvous
from node_agent.run.jobrun import JobRun
from node_agent.supervisor import JobSupervisor, SupervisorSettings
from tests.support import STUBBORN_GROUP, alive, git, job_repo, wait_until

REPORTED_STATUS = {
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
        self.uploads: dict[str, tuple[str, dict[str, Any], dict[int, bytes]]] = {}
        self.store_away = False  # part uploads answer 503 storage-unavailable
        self.part_tries = 0
        self.built_answer: dict[str, Any] = {"status": "in progress", "accelerators": [0]}
        self.lock = threading.Lock()

    def report(
        self, job_id: str, report: dict[str, Any], retry_for: float | None = None
    ) -> dict[str, Any]:
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
        if kind == "built":
            return dict(self.built_answer)
        return {"status": REPORTED_STATUS[kind]}

    def append_logs(self, job_id: str, offset: int, data: bytes, node_index: int = 0) -> int:
        if self.storage_down:
            raise ApiUnavailable(
                "the control plane answered 503 storage-unavailable: disk full", retry_after=0.05
            )
        with self.lock:
            held = self.logs.setdefault(stream(job_id, node_index), bytearray())
            assert offset <= len(held)
            held.extend(data[len(held) - offset :])
            self.events.append(("logs", job_id))
            return len(held)

    # -- the upload protocol: sessions, parts, complete ------------------------------------

    closing = False

    def pause(self, seconds: float) -> bool:
        time.sleep(seconds)
        return False

    def begin_upload(
        self, job_id: str, body: dict[str, Any], retry_for: float | None = None
    ) -> dict[str, Any]:
        if self.refuse_uploads is not None:
            raise self.refuse_uploads
        with self.lock:
            held = ("checkpoint", job_id, body["name"])
            if body["kind"] == "checkpoint" and any(e[:3] == held for e in self.events):
                return {"recorded": {"name": body["name"]}}  # as the server: nothing to send
            upload_id = f"upload-{len(self.uploads)}"
            self.uploads[upload_id] = (job_id, body, {})
        return {"id": upload_id, "part_size": 64 * 1024}

    def part_targets(
        self, upload_id: str, numbers: list[int], retry_for: float | None = None
    ) -> list[dict[str, Any]]:
        return [{"number": n, "url": f"/v1/agent/uploads/{upload_id}/parts/{n}"} for n in numbers]

    def put_part(
        self, target: dict[str, Any], data: list[bytes], retry_for: float | None = None
    ) -> str:
        with self.lock:
            self.part_tries += 1
            if self.store_away:
                raise ApiUnavailable("the control plane answered 503 storage-unavailable: away")
            _, _, upload_id, _, number = target["url"].rsplit("/", 4)
            self.uploads[upload_id][2][int(number)] = b"".join(data)
        return f"etag-{number}"

    def abort_upload(self, upload_id: str, retry_for: float | None = None) -> None:
        with self.lock:
            self.uploads.pop(upload_id, None)

    def complete_upload(
        self, upload_id: str, parts: list[tuple[int, str]], size: int, sha256: str,
        retry_for: float | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        job_id, body, received = self.uploads[upload_id]
        data = b"".join(received[number] for number, _ in parts)
        assert (len(data), hashlib.sha256(data).hexdigest()) == (size, sha256)
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            files = {info.filename: archive.read(info) for info in archive.infolist()}
        with self.lock:
            if body["kind"] == "checkpoint":
                self.events.append(("checkpoint", job_id, body["name"], files))
            else:
                self.events.append(("outputs", job_id, files))
        return {"size": size, "sha256": sha256}

    def reports(self, job_id: str) -> list[str]:
        return [event[2] for event in self.events if event[:2] == ("report", job_id)]

    def report_facts(self, job_id: str, kind: str) -> dict[str, Any]:
        return next(e[3] for e in self.events if e[:3] == ("report", job_id, kind))

    def log_text(self, job_id: str, node_index: int = 0) -> str:
        return self.logs.get(stream(job_id, node_index), bytearray()).decode()

    def last_index(self, job_id: str, kind: str) -> int:
        return max(i for i, event in enumerate(self.events) if event[:2] == (kind, job_id))


def stream(job_id: str, node_index: int) -> str:
    """Each node of a job ships its own log."""
    return job_id if node_index == 0 else f"{job_id}#{node_index}"


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
    node: dict[str, Any] | None = None,
    **spec: Any,
) -> JobSupervisor:
    """A started supervisor of the job; ``node``: the assignment's fields for this node (its
    ``status``, ``node_index``, ``nnodes``...), its ``work_dir`` and whether it is ``adopting``."""
    node = dict(node or {})
    work_dir, adopting = node.pop("work_dir", tmp_path / "agent"), node.pop("adopting", False)
    entry_point = tuple(spec.pop("entry_point", ("train.py",)))
    assignment = Assignment(
        job_id=job_id,
        name=f"name-{job_id}",
        status=node.pop("status", "building"),
        spec=JobSpec(repository_url=url, entry_point=entry_point, **spec),
        **node,
    )
    supervisor = JobSupervisor(
        assignment,
        client=plane,  # type: ignore[arg-type]
        node_id="node-1",
        pool=pool or AcceleratorPool(),
        settings=SupervisorSettings(
            work_dir=work_dir,
            datasets_dir=datasets_dir,
            **{"stop_grace": 0.5, "log_flush_interval": 0.05, "checkpoint_stable_for": 0.2,
               **(settings or {})},  # fmt: skip
        ),
        adopting=adopting,
    )
    supervisor.start()
    STARTED.append(supervisor)
    return supervisor


ENV_KEYS = [
    "FLEXAI_OUTPUT_DIR",
    "FLEXAI_OUTPUT_CHECKPOINT_DIR",
    "FLEXAI_INPUT_CHECKPOINT_DIR",
    "FLEXAI_INPUT_DIR",
    "FLEXAI_RESTART_COUNT",
    "CUDA_VISIBLE_DEVICES",
    "PYTHONUNBUFFERED",
    "VIRTUAL_ENV",
    "LR",
    "FLEXAI_NODE_INDEX",
    "NODE_RANK",
    "NNODES",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "FLEXAI_JOB_MARKER",
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
    plane.built_answer = {"status": "in progress", "accelerators": [1]}
    supervisor = supervise(
        tmp_path, plane, url, entry_point=["train.py", "--lr", "0.1"], env={"LR": "0.1"}
    )
    supervisor.join(30)
    assert plane.reports("job-1") == ["built", "exited"]
    built = plane.report_facts("job-1", "built")
    assert built == {
        "node_id": "node-1",
        "node_index": 0,
        "type": "built",
        "commit": commit,
        "master_port": None,
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
        "FLEXAI_RESTART_COUNT": "0",  # its first attempt
        "CUDA_VISIBLE_DEVICES": "1",  # as the control plane allocated, at once
        "PYTHONUNBUFFERED": "1",
        "VIRTUAL_ENV": str(dirs.venv),
        "LR": "0.1",
        "FLEXAI_NODE_INDEX": "0",
        "NODE_RANK": "0",
        "NNODES": "1",
        "LOCAL_WORLD_SIZE": "1",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "FLEXAI_JOB_MARKER": dirs.marker,
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
    assert plane.reports("job-1") == ["built", "exited"]
    assert plane.report_facts("job-1", "exited")["exit_code"] == 3
    assert "[agent] the entry point exited with code 3" in plane.log_text("job-1")
    assert not any(event[0] == "outputs" for event in plane.events)  # an empty one is not sent


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
    assert plane.reports("job-1") == ["built", "stopped"]
    assert plane.report_facts("job-1", "stopped")["exit_code"] == 137  # it ignored SIGTERM
    assert not any(alive(pid) for pid in pids())
    assert "[agent] stopping: SIGTERM" in plane.log_text("job-1")
    assert not any(event[0] == "outputs" for event in plane.events)  # an empty one is not sent


def test_a_stopped_entry_point_that_obeys_sigterm_is_reported_with_exit_code_143(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    supervisor = supervise(tmp_path, plane, url)
    wait_until(lambda: "up" in plane.log_text("job-1"))
    supervisor.stop()
    supervisor.join(30)
    assert plane.reports("job-1") == ["built", "stopped"]
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
    assert plane.reports("job-1") == ["built", "stopped"]
    assert plane.report_facts("job-1", "stopped")["exit_code"] == 0


WAITING_JOB = """
import os, pathlib, time
flag = os.environ.get("WAIT_FOR")
while flag and not pathlib.Path(flag).exists():
    time.sleep(0.05)
print("ran on", os.environ["CUDA_VISIBLE_DEVICES"])
"""


def test_a_job_built_while_its_accelerators_are_busy_runs_once_an_assignment_says_in_progress(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, WAITING_JOB)
    plane.built_answer = {"status": "enqueued", "accelerators": None}
    supervisor = supervise(tmp_path, plane, url)
    wait_until(lambda: "waiting for 1 accelerator to be free" in plane.log_text("job-1"))
    supervisor.update(replace(supervisor.assignment, status="enqueued"))  # nothing new
    supervisor.update(replace(supervisor.assignment, status="in progress", accelerators=(1,)))
    supervisor.join(30)
    assert plane.reports("job-1") == ["built", "exited"]
    assert "ran on 1" in plane.log_text("job-1")


def test_a_job_whose_other_nodes_still_build_waits_for_them(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, WAITING_JOB)
    plane.built_answer = {"status": "building", "accelerators": None}
    supervisor = supervise(tmp_path, plane, url)
    wait_until(lambda: "waiting for the job's other nodes to build" in plane.log_text("job-1"))
    assert "ran on" not in plane.log_text("job-1")
    supervisor.update(replace(supervisor.assignment, status="in progress", accelerators=(0,)))
    supervisor.join(30)
    assert "ran on 0" in plane.log_text("job-1")


def test_a_stop_while_waiting_for_accelerators_reports_stopped_without_running_anything(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, "print('should not run')\n")
    plane.built_answer = {"status": "enqueued"}
    supervisor = supervise(tmp_path, plane, url)
    wait_until(lambda: "waiting for 1 accelerator" in plane.log_text("job-1"))
    supervisor.update(replace(supervisor.assignment, status="stop in progress"))
    supervisor.join(30)
    assert plane.reports("job-1") == ["built", "stopped"]
    assert "exit_code" not in plane.report_facts("job-1", "stopped")  # nothing ran
    assert "should not run" not in plane.log_text("job-1")


def test_an_accelerator_still_held_by_processes_that_survived_sigkill_is_not_shared(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, "print('should not run')\n")
    pool = AcceleratorPool()
    pool.claim("stuck-job", [0])
    pool.release("stuck-job", survivors=[os.getpid()])  # a process that will not die
    supervise(tmp_path, plane, url, pool=pool).join(30)
    assert plane.reports("job-1") == ["built", "failed"]
    failed = plane.report_facts("job-1", "failed")
    assert failed["code"] == "node_lost"
    assert failed["message"] == (
        f"accelerator 0 of this node is still held by processes {os.getpid()} of job stuck-job, "
        "which survived SIGKILL (stuck in the kernel); the job was not started on this node"
    )
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
    assert plane.reports("job-1") == ["built", "stopped"]
    assert plane.report_facts("job-1", "stopped")["exit_code"] == 0


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
    assert plane.reports("job-1") == ["built", "exited"]
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
    assert plane.reports("job-1") == ["built", "exited"]
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
    assert plane.reports("job-1") == ["built", "exited"]
    assert plane.report_facts("job-1", "exited")["exit_code"] == 0
    refusals = [r.getMessage() for r in caplog.records if "over 1000 bytes" in r.getMessage()]
    assert len(refusals) == 2, refusals  # the checkpoint, the outputs: once each
    assert "checkpoint checkpoint-1 not uploaded: 413 payload-too-large" in refusals[0]
    assert "the output directory was not uploaded: 413 payload-too-large" in refusals[1]


def test_a_job_ends_only_once_the_store_is_back_and_took_its_checkpoint_and_outputs(
    tmp_path: Path, plane: FakeControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(uploads, "FIRST_BACKOFF_S", 0.01)
    monkeypatch.setattr(uploads, "MAX_BACKOFF_S", 0.05)
    plane.store_away = True
    url, _ = repo_and_commit(tmp_path, REPORTING_JOB)
    supervisor = supervise(tmp_path, plane, url)
    wait_until(lambda: plane.part_tries > 20, timeout=60)  # long past one call's own retries
    assert plane.reports("job-1") == ["built"]  # its end waits: nothing is dropped

    plane.store_away = False
    supervisor.join(30)

    exited = plane.last_index("job-1", "report")
    assert plane.reports("job-1") == ["built", "exited"]
    assert ("checkpoint", "job-1", "checkpoint-1", {"w.bin": b"w"}) in plane.events[:exited]
    assert ("outputs", "job-1", {"result.txt": b"done"}) in plane.events[:exited]


def test_a_job_running_past_its_time_limit_is_ended_and_fails_saying_so(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    supervise(tmp_path, plane, url, time_limit_s=2).join(60)
    assert plane.reports("job-1") == ["built", "failed"]
    failed = plane.report_facts("job-1", "failed")
    assert failed["code"] == "time_limit_exceeded"
    assert failed["message"] == "the job ran past its time limit of 2s; it was ended"
    assert failed["exit_code"] == 143  # how its entry point ended, kept with the failure
    log = plane.log_text("job-1")
    assert "[agent] the job ran past its time limit of 2s: SIGTERM to the job's processes" in log
    assert "[agent] the entry point was killed by SIGTERM (exit code 143)" in log


# Prints its pid and the pid of a child that left the job's session, then both sleep.
ESCAPING_JOB = """
import os, subprocess, sys, time
child = "import os, time; os.write(1, b'ESCAPED %d\\\\n' % os.getpid()); time.sleep(600)"
subprocess.Popen([sys.executable, "-c", child], start_new_session=True)
print("PID", os.getpid(), flush=True)
time.sleep(600)
"""


def test_a_stop_ends_the_processes_that_left_the_jobs_process_group_too(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, ESCAPING_JOB)
    supervisor = supervise(tmp_path, plane, url)
    wait_until(lambda: "ESCAPED" in plane.log_text("job-1") and "PID" in plane.log_text("job-1"))
    escapee = int(plane.log_text("job-1").split("ESCAPED ")[1].split()[0])
    assert alive(escapee)
    supervisor.stop()
    supervisor.join(30)
    assert plane.reports("job-1") == ["built", "stopped"]
    assert not alive(escapee)


def test_the_jobs_own_stop_grace_overrides_the_agents(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, STUBBORN_GROUP)
    supervisor = supervise(tmp_path, plane, url, stop_grace_s=0.2, settings={"stop_grace": 600})
    wait_until(lambda: plane.log_text("job-1").count("PID ") == 3)
    supervisor.stop()
    supervisor.join(60)
    assert plane.reports("job-1") == ["built", "stopped"]
    assert plane.report_facts("job-1", "stopped")["exit_code"] == 137
    assert "SIGKILL after 0.2 s" in plane.log_text("job-1")


# Rank 0 listens at MASTER_ADDR:MASTER_PORT; rank 1 connects and says who it is.
RENDEZVOUS_JOB = """
import os, socket, time
rank, world = os.environ["NODE_RANK"], os.environ["WORLD_SIZE"]
where = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
if rank == "0":
    with socket.create_server(where) as server:
        server.settimeout(60)
        peer, _ = server.accept()
        print("rank 0 heard:", peer.recv(100).decode(), flush=True)
else:
    for attempt in range(600):
        try:
            peer = socket.create_connection(where, timeout=5)
            break
        except OSError:
            time.sleep(0.1)
    peer.sendall(f"rank {rank} of {world}, on {os.environ['CUDA_VISIBLE_DEVICES']}".encode())
"""


def test_the_two_nodes_of_a_job_meet_at_the_rendezvous_node_0_chose(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, RENDEZVOUS_JOB)
    plane.built_answer = {"status": "building", "accelerators": None}  # the other one builds
    nodes = [
        supervise(tmp_path, plane, url, accels=2,
                  node={"node_index": index, "nnodes": 2, "work_dir": tmp_path / f"node-{index}"})
        for index in (0, 1)
    ]  # fmt: skip
    wait_until(lambda: plane.reports("job-1") == ["built", "built"])
    built = {facts["node_index"]: facts for e in plane.events if (facts := _built(e))}
    port = built[0]["master_port"]
    assert isinstance(port, int) and built[1]["master_port"] is None
    rendezvous = Rendezvous("127.0.0.1", port)
    for supervisor, accelerators in zip(nodes, [(0, 1), (2, 3)], strict=True):
        supervisor.update(replace(supervisor.assignment, status="in progress",
                                  accelerators=accelerators, rendezvous=rendezvous))  # fmt: skip
    for supervisor in nodes:
        supervisor.join(60)
    assert "rank 0 heard: rank 1 of 4, on 2,3" in plane.log_text("job-1")
    assert plane.reports("job-1") == ["built", "built", "exited", "exited"]


def _built(event: tuple[Any, ...]) -> dict[str, Any] | None:
    return event[3] if event[:3] == ("report", "job-1", "built") else None


def running_job(tmp_path: Path, train_py: str, runs: list[JobRun]) -> tuple[JobDirs, JobRun]:
    """A job an agent now gone left running: its directory, and its entry point."""
    dirs = JobDirs.for_job(tmp_path / "agent", "job-1")
    dirs.create_fresh()
    dirs.repo.mkdir()
    dirs.log_file.write_text("[agent] running train.py\n")
    env = {**os.environ, MARKER_VARIABLE: dirs.marker}
    argv = [sys.executable, "-c", train_py]
    run = JobRun.launch(argv, dirs=dirs, env=env, python=sys.executable, as_user=None,
                        work_dir=tmp_path / "agent")  # fmt: skip
    runs.append(run)
    return dirs, run


def test_an_adopted_job_is_followed_to_its_end_and_its_whole_log_shipped(
    tmp_path: Path, plane: FakeControlPlane, job_runs: list[JobRun]
) -> None:
    flag = tmp_path / "flag"
    job = "import pathlib, time\nprint('before', flush=True)\n"
    job += f"while not pathlib.Path({str(flag)!r}).exists(): time.sleep(0.05)\nprint('after')\n"
    dirs, _ = running_job(tmp_path, job, job_runs)
    wait_until(lambda: "before" in dirs.log_file.read_text())
    supervisor = supervise(tmp_path, plane, "/repo", node={"status": "in progress",
                           "accelerators": (0,), "adopting": True})  # fmt: skip
    wait_until(lambda: "found the job running" in plane.log_text("job-1"))
    flag.write_text("go")
    supervisor.join(30)
    assert plane.reports("job-1") == ["exited"]
    assert plane.report_facts("job-1", "exited")["exit_code"] == 0
    log = plane.log_text("job-1")
    assert log.startswith("[agent] running train.py\nbefore\n")
    assert "after\n[agent] the entry point exited with code 0\n" in log


def test_a_stop_reaches_an_adopted_job(
    tmp_path: Path, plane: FakeControlPlane, job_runs: list[JobRun]
) -> None:
    sleeping = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"
    dirs, _ = running_job(tmp_path, sleeping, job_runs)
    wait_until(lambda: "up" in dirs.log_file.read_text())
    stopping = {"status": "stop in progress", "adopting": True}
    supervise(tmp_path, plane, "/repo", node=stopping).join(30)
    assert plane.reports("job-1") == ["stopped"]
    assert plane.report_facts("job-1", "stopped")["exit_code"] == 143


@pytest.mark.parametrize(
    ("status", "reports", "facts"),
    [
        ("in progress", ["exited"], {"exit_code": 3}),
        ("stop in progress", ["stopped"], {"exit_code": 3}),
    ],
)
def test_a_job_that_ended_while_the_agent_was_down_is_reported_as_its_shim_recorded(
    tmp_path: Path,
    plane: FakeControlPlane,
    job_runs: list[JobRun],
    status: str,
    reports: list[str],
    facts: dict[str, int],
) -> None:
    _, run = running_job(tmp_path, "import sys\nprint('bye')\nsys.exit(3)\n", job_runs)
    assert run.wait(20)
    supervise(tmp_path, plane, "/repo", node={"status": status, "adopting": True}).join(30)
    assert plane.reports("job-1") == reports
    assert plane.report_facts("job-1", reports[0]).items() >= facts.items()
    assert "bye\n[agent] the job ended while the node agent was down\n" in plane.log_text("job-1")


@pytest.mark.parametrize(
    ("shim_started", "message"),
    [
        (True, "the node agent restarted and found no process of the job and no exit code: it "
               "ended while the agent was down"),
        (False, "the node agent went down before it started the entry point, and no process "
                "of the job ran"),
    ],
)  # fmt: skip
def test_a_job_with_no_process_and_no_exit_code_is_reported_lost(
    tmp_path: Path, plane: FakeControlPlane, shim_started: bool, message: str
) -> None:
    if shim_started:
        dirs = JobDirs.for_job(tmp_path / "agent", "job-1")
        dirs.create_fresh()
        dirs.shim_pid_file.write_text("999999999\n")  # its shim was killed with the agent
    supervise(tmp_path, plane, "/repo", node={"status": "in progress", "adopting": True}).join(30)
    assert plane.reports("job-1") == ["failed"]
    assert plane.report_facts("job-1", "failed") == {
        "node_id": "node-1", "node_index": 0, "type": "failed", "code": "node_lost",
        "message": message,
    }  # fmt: skip


STAGED_CHECKPOINT = """
import os, pathlib, time
checkpoint = pathlib.Path(os.environ["FLEXAI_OUTPUT_CHECKPOINT_DIR"], "checkpoint-1")
checkpoint.mkdir()
(checkpoint / "model.bin").write_bytes(b"model")
time.sleep(1.5)  # computing the optimizer's state: longer than the agent waits for quiet
(checkpoint / "optimizer.bin").write_bytes(b"optimizer")
"""


def test_a_checkpoint_written_in_stages_reaches_the_store_whole_and_the_log_says_so(
    tmp_path: Path, plane: FakeControlPlane
) -> None:
    url, _ = repo_and_commit(tmp_path, STAGED_CHECKPOINT)
    supervise(tmp_path, plane, url).join(60)
    assert plane.reports("job-1") == ["built", "exited"]
    uploads = [event[2:] for event in plane.events if event[0] == "checkpoint"]
    assert uploads == [
        ("checkpoint-1", {"model.bin": b"model"}),
        ("checkpoint-1.v2", {"model.bin": b"model", "optimizer.bin": b"optimizer"}),
    ]
    assert "[agent] checkpoint checkpoint-1 changed after it was uploaded as checkpoint-1" in (
        plane.log_text("job-1")
    )
