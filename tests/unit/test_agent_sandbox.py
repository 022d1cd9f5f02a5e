"""Each job in a sandbox of its own: a real agent (as root, with bubblewrap) against the small
fake control plane of ``test_agent_main``. Two jobs side by side run as ids of their own, see
only their own processes, files and ``/tmp``, and find the platform's paths; a stop ends every
process of a job, one that left its session and cleared its environment too; a job past its
memory limit fails ``out_of_memory`` and a fork bomb stays in its job; an agent that restarts
follows its sandboxed job again."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node_agent.main import main
from node_agent.sandbox import cgroups
from tests.support import job_repo, python_for_user, wait_until
from tests.unit.test_agent_main import (
    AGENTS,
    ControlPlane,
    plane,
    start_agent,
    terminate,
    token_file,
)

__all__ = ["plane"]  # its fixture serves here too

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None,
    reason="sandboxes need root and bubblewrap (apt-get install bubblewrap)",
)

# What a job sees of the node: its id, the processes, the other job's folder, environment and
# /tmp, and the platform's paths. It leaves a file in /tmp for the other to look for.
LOOKING_JOB = """
import json, os, pathlib, sys, time
me, other = sys.argv[1], sys.argv[2]
pathlib.Path(f"/tmp/{me}-was-here").write_text("private")
time.sleep(3)  # the other job runs meanwhile (two accelerators, one each)
seen = {"uid": os.getuid(), "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
tried = {}
for name, path in [("folder", f"{sys.argv[3]}/jobs/{other}/repo/train.py"),
                   ("tmp", f"/tmp/{other}-was-here"), ("token", sys.argv[4])]:
    try:
        tried[name] = pathlib.Path(path).read_text()[:20]
    except OSError as error:
        tried[name] = type(error).__name__
environs = []
for pid in seen["pids"]:
    try:
        environs.append(pathlib.Path(f"/proc/{pid}/environ").read_bytes())
    except OSError:
        pass
seen["secret_seen"] = any(f"{other}-secret".encode() in env for env in environs)
seen["tried"] = tried
seen["platform"] = {k: v for k, v in os.environ.items() if k.startswith("FLEXAI_") and
                    k.endswith("_DIR")}
pathlib.Path("/output/result.txt").write_text(me)
pathlib.Path("/output-checkpoint/checkpoint-1").mkdir()
pathlib.Path("/output-checkpoint/checkpoint-1/w.bin").write_text(me)
print("SEEN " + json.dumps(seen), flush=True)
"""

# Leaves a grandchild that escapes: a new session, an empty environment, a double fork.
ESCAPING_JOB = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execve("/bin/sleep", ["sleep", "300"], {})
    os._exit(0)
print(f"UID {os.getuid()}", flush=True)
time.sleep(300)
"""

HUNGRY_JOB = """
import time
chunks = []
for _ in range(400):
    chunks.append(bytearray(4 * 1024 * 1024))  # 1.6 GiB in all, 4 MiB at a time
    time.sleep(0.001)
print("still here", flush=True)
"""

FORKING_JOB = """
import os, time
children, refused = 0, 0
for _ in range(1000):
    try:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        children += 1
    except OSError:
        refused += 1
print(f"FORKED {children} REFUSED {refused}", flush=True)
raise SystemExit(3 if refused else 0)
"""


@pytest.fixture
def python() -> str:
    """An interpreter the jobs' own ids can run (the build machine's Python may sit in root's
    home, closed to others)."""
    found = python_for_user("nobody")
    if found is None:
        pytest.skip("no Python interpreter here that another user can run with venv and pip")
    return found


def sandboxed_agent(tmp_path: Path, url: str, python: str, *extra: str) -> Any:
    return start_agent(tmp_path, url, "--job-python", python, "--job-uids", "70100-70199",
                       *extra, sandboxed=True)  # fmt: skip


def run_to_failure(tmp_path: Path, plane: tuple[ControlPlane, str], python: str, train: str,
                   *flags: str) -> tuple[ControlPlane, Any]:  # fmt: skip
    """Job ``job-1`` running ``train`` on a sandboxing agent started with ``flags``, failed."""
    state, url = plane
    state.add_job("job-1", "building", ["train.py"], str(job_repo(tmp_path, train)))
    agent = sandboxed_agent(tmp_path, url, python, *flags)
    wait_until(lambda: state.status("job-1") == "failed", timeout=120)
    return state, agent


def seen(state: ControlPlane, job_id: str) -> dict[str, Any]:
    line = next(line for line in state.log_text(job_id).splitlines() if line.startswith("SEEN "))
    said: dict[str, Any] = json.loads(line[5:])
    return said


def uid_processes(uid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    found.append(int(name))
            except OSError:
                pass
    return found


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    yield
    for agent in AGENTS:
        if agent.poll() is None:
            agent.kill()
    for uid in range(70100, 70200):
        for pid in uid_processes(uid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_two_jobs_side_by_side_see_nothing_of_each_other(
    tmp_path: Path, plane: tuple[ControlPlane, str], python: str
) -> None:
    state, url = plane
    work = tmp_path / "agent"
    token = tmp_path / "token-t0ken"
    for me, other in (("alice", "bob"), ("bob", "alice")):
        repo = job_repo(tmp_path / me, LOOKING_JOB)
        state.add_job(me, "building", ["train.py", me, other, str(work), str(token)], str(repo),
                      env={"HF": f"{me}-secret"})  # fmt: skip
    agent = sandboxed_agent(tmp_path, url, python)
    wait_until(lambda: all("SEEN " in state.log_text(job) for job in ("alice", "bob")),
               timeout=120)  # fmt: skip
    wait_until(lambda: state.status("alice") == state.status("bob") == "succeeded", timeout=60)
    terminate(agent)
    alice, bob = seen(state, "alice"), seen(state, "bob")
    assert alice["uid"] != bob["uid"] and {alice["uid"], bob["uid"]} <= set(range(70100, 70200))
    for job in (alice, bob):
        assert job["pids"][0] == 1 and len(job["pids"]) <= 3  # the shim, the job, nothing else
        assert not job["secret_seen"]
        assert job["tried"] == {"folder": "FileNotFoundError", "tmp": "FileNotFoundError",
                                "token": "FileNotFoundError"}  # fmt: skip
        assert job["platform"] == {
            "FLEXAI_OUTPUT_DIR": "/output", "FLEXAI_OUTPUT_CHECKPOINT_DIR": "/output-checkpoint",
            "FLEXAI_INPUT_CHECKPOINT_DIR": "/input-checkpoint", "FLEXAI_INPUT_DIR": "/input",
        }  # fmt: skip
    assert "alice-secret" not in state.log_text("bob")
    assert {"jobs/alice/outputs/0", "jobs/bob/outputs/0", "jobs/alice/checkpoints/checkpoint-1",
            "jobs/bob/checkpoints/checkpoint-1"} <= set(state.uploads)  # fmt: skip


def test_a_stop_ends_every_process_of_the_job_an_escaped_one_too(
    tmp_path: Path, plane: tuple[ControlPlane, str], python: str
) -> None:
    state, url = plane
    state.add_job("job-1", "building", ["train.py"], str(job_repo(tmp_path, ESCAPING_JOB)))
    agent = sandboxed_agent(tmp_path, url, python)
    wait_until(lambda: "UID " in state.log_text("job-1"), timeout=120)
    uid = int(state.log_text("job-1").split("UID ")[1].split()[0])
    wait_until(lambda: len(uid_processes(uid)) >= 3)  # shim, job, the sleeper that escaped
    with state.lock:
        state.jobs["job-1"]["status"] = "stop in progress"
    wait_until(lambda: state.status("job-1") == "stopped", timeout=60)
    assert uid_processes(uid) == []
    terminate(agent)


@pytest.mark.skipif(isinstance(cgroups.detect(), str), reason="no cgroups on this host")
def test_a_job_past_its_memory_limit_fails_out_of_memory_naming_the_limit(
    tmp_path: Path, plane: tuple[ControlPlane, str], python: str
) -> None:
    state, agent = run_to_failure(tmp_path, plane, python, HUNGRY_JOB, "--job-memory", "256M")
    terminate(agent)
    failed = next(r for r in state.reports if r["type"] == "failed")
    assert failed["code"] == "out_of_memory"
    assert "its memory limit (256 MiB)" in failed["message"]
    assert failed["exit_code"] in (137, -9)
    assert "still here" not in state.log_text("job-1")


@pytest.mark.skipif(isinstance(cgroups.detect(), str), reason="no cgroups on this host")
def test_a_fork_bomb_is_held_to_its_jobs_process_limit(
    tmp_path: Path, plane: tuple[ControlPlane, str], python: str
) -> None:
    state, agent = run_to_failure(tmp_path, plane, python, FORKING_JOB, "--job-pids", "64")
    forked = state.log_text("job-1").split("FORKED ")[1].split()
    assert int(forked[0]) < 64 and int(forked[2]) > 900
    assert agent.poll() is None  # the node's own work goes on
    terminate(agent)


def test_an_agent_that_restarts_follows_its_sandboxed_job_to_its_end(
    tmp_path: Path, plane: tuple[ControlPlane, str], python: str
) -> None:
    state, url = plane
    job = "import os, time\nprint('UID', os.getuid(), flush=True)\ntime.sleep(4)\n" \
          "raise SystemExit(7)\n"  # fmt: skip
    state.add_job("job-1", "building", ["train.py"], str(job_repo(tmp_path, job)))
    agent = sandboxed_agent(tmp_path, url, python)
    wait_until(lambda: "UID " in state.log_text("job-1"), timeout=120)
    agent.send_signal(signal.SIGKILL)
    agent.wait()
    again = sandboxed_agent(tmp_path, url, python)
    wait_until(lambda: state.status("job-1") == "failed", timeout=60)
    terminate(again)
    exited = [r for r in state.reports if r["type"] == "exited"]
    assert exited and exited[-1]["exit_code"] == 7, state.log_text("job-1")
    assert "found the job running" in state.log_text("job-1")


def test_a_range_of_ids_a_user_holds_is_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--server", "http://127.0.0.1:9", "--token-file", token_file(tmp_path),
            "--accels", "1", "--work-dir", str(tmp_path / "agent"), "--job-uids", "65000-65999"]
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        "flexai agent: error: --job-uids 65000-65999 holds user nobody (65534), group nogroup "
        "(65534): jobs would run as them; give a range that no user or group of this host has\n"
    )
