"""``flexai agent`` as a user runs it: a real agent process against a small fake control plane."""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from node_agent.main import main
from tests.fake_http import serve_json, server_url
from tests.support import alive, job_repo, wait_until

NEXT_STATUS = {
    "built": "in progress",  # every job gets accelerator 0 at once
    "build_failed": "failed",
    "failed": "failed",
    "stopped": "stopped",
    "stop_failed": "stop failed",
}
LISTED = ("building", "enqueued", "in progress", "stop in progress")
NODE_TAKEN = {
    "type": "https://flexai.dev/problems/node-taken",
    "title": "Node held by another agent",
    "status": 409,
    "detail": "another live agent holds node gpu-1",
}


class ControlPlane:
    """Just enough of ``/v1/agent`` for an agent: nodes, assignments, reports, logs, uploads."""

    def __init__(self, token: str = "t0ken") -> None:
        self.token = token
        self.jobs: dict[str, dict[str, Any]] = {}
        self.reports: list[dict[str, Any]] = []
        self.logs: dict[str, bytearray] = {}
        self.uploads: list[str] = []
        """``jobs/<id>/outputs/<k>`` and ``jobs/<id>/checkpoints/<name>``, once completed."""
        self.sessions: dict[str, dict[str, Any]] = {}
        self.heartbeats = 0
        self.registrations: list[dict[str, Any]] = []
        self.taken = False  # another agent holds the node: every call answers node-taken
        self.reports_tried_after_taken = 0
        self.lock = threading.Lock()

    def add_job(
        self, job_id: str, status: str, entry_point: list[str], url: str, **spec: Any
    ) -> None:
        spec = {"repository_url": url, "entry_point": entry_point, "accels": 1, "nodes": 1, **spec}
        self.jobs[job_id] = {"job_id": job_id, "name": job_id, "status": status, "spec": spec}

    def status(self, job_id: str) -> str:
        with self.lock:
            return str(self.jobs[job_id]["status"])

    def log_text(self, job_id: str) -> str:
        with self.lock:
            return self.logs.get(job_id, bytearray()).decode()

    def handle(self, method: str, url: str, body: bytes) -> tuple[int, dict[str, Any]]:
        path, query = urlparse(url).path, parse_qs(urlparse(url).query)
        parts = path.strip("/").split("/")[2:]  # after v1/agent
        with self.lock:
            if self.taken:
                self.reports_tried_after_taken += parts[-1:] == ["reports"]
                return 409, NODE_TAKEN
            if method == "POST" and parts == ["nodes"]:
                self.registrations.append(json.loads(body))
                return 200, {"node_id": "node-1", "name": json.loads(body)["name"]}
            if parts[-1:] == ["heartbeat"]:
                self.heartbeats += 1
                return 200, {"ok": True}
            if parts[-1:] == ["assignments"]:
                listed = [dict(job) for job in self.jobs.values() if job["status"] in LISTED]
                return 200, {"assignments": listed}
            if parts[-1:] == ["reports"]:
                return self.report(parts[1], json.loads(body))
            if parts[-1:] == ["logs"]:  # appended once at its offset, as the server does
                held = self.logs.setdefault(parts[1], bytearray())
                offset = int(query["offset"][0])
                if offset > len(held):
                    return 409, {"type": "https://flexai.dev/problems/log-offset-mismatch",
                                 "expected_offset": len(held)}  # fmt: skip
                held.extend(body[len(held) - offset :])
                return 200, {"size": len(held)}
            if method == "POST" and parts[-1:] == ["uploads"]:  # a session per archive
                upload_id = f"u{len(self.sessions)}"
                self.sessions[upload_id] = {"job_id": parts[1], **json.loads(body)}
                return 201, {"id": upload_id, "part_size": 1 << 20}
            if method == "POST" and parts[-1:] == ["parts"]:
                return 200, {"parts": [{"number": n, "url": f"{path}/{n}", "headers": {}}
                                       for n in json.loads(body)["numbers"]]}  # fmt: skip
            if method == "PUT" and parts[-2:-1] == ["parts"]:
                return 200, {"number": int(parts[-1]), "etag": f"part-{parts[-1]}"}
            if method == "POST" and parts[-1:] == ["complete"]:
                session = self.sessions[parts[1]]
                kind = "outputs" if session["kind"] == "output" else "checkpoints"
                which = session["node_index"] if kind == "outputs" else session["name"]
                self.uploads.append(f"jobs/{session['job_id']}/{kind}/{which}")
                return 200, {"size": json.loads(body)["size"]}
        return 404, {"type": "https://flexai.dev/problems/not-found"}

    def report(self, job_id: str, report: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        job = self.jobs[job_id]
        kind = report["type"]
        if job["status"] == "stop in progress" and kind not in ("stopped", "stop_failed"):
            problem = {
                "type": "https://flexai.dev/problems/illegal-transition",
                "current_status": "stop in progress",
                "attempted_status": kind,
            }
            return 409, problem
        self.reports.append({"job_id": job_id, **report})
        if kind == "exited":
            job["status"] = "succeeded" if report["exit_code"] == 0 else "failed"
        else:
            job["status"] = NEXT_STATUS[kind]
        if kind == "built":
            job["accelerators"] = [0]
        return 200, {"status": job["status"], "accelerators": job.get("accelerators")}


@pytest.fixture
def plane() -> Iterator[tuple[ControlPlane, str]]:
    state = ControlPlane()

    def answer(method: str, path: str, headers: Message, body: bytes) -> tuple[int, Any]:
        if headers.get("Authorization") != f"Bearer {state.token}":
            unauthorized = "https://flexai.dev/problems/unauthorized"
            return 401, {"type": unauthorized, "detail": "bad token"}
        return state.handle(method, path, body)

    server = serve_json(answer)
    yield state, server_url(server)
    server.shutdown()


def token_file(directory: Path, token: str = "t0ken", mode: int = 0o600) -> str:
    """A token file as an operator writes it: the owner's alone."""
    path = directory / f"token-{token}"
    path.write_text(token + "\n")
    path.chmod(mode)
    return str(path)


@pytest.fixture(autouse=True)
def no_token_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent run in this process must not execute itself again (over pytest)."""
    monkeypatch.delenv("FLEXAI_TOKEN", raising=False)


# pytest's temporary directories are their owner's alone: jobs run as the test's own user.
AS_ME = ["--job-user", pwd.getpwuid(os.geteuid()).pw_name, "--no-sandbox"]
"""The agent's own handling of processes, without a sandbox (tests/unit/test_agent_sandbox.py
runs them in one)."""

AGENTS: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def end_every_agent() -> Iterator[None]:
    """A failing test must not leave an agent (and its jobs) running."""
    yield
    while AGENTS:
        agent = AGENTS.pop()
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            agent.communicate(timeout=20)


def start_agent(
    tmp_path: Path, url: str, *extra: str, env: dict[str, str] | None = None,
    sandboxed: bool = False,
) -> subprocess.Popen[str]:  # fmt: skip
    """A real agent process; its token comes from a token file unless ``env`` holds one.
    ``sandboxed``: each job in a sandbox of its own, as its own id (else as the test's user)."""
    argv = ["--server", url, "--accels", "2", "--name", "gpu-1"]
    if "FLEXAI_TOKEN" not in (env or {}):
        argv += ["--token-file", token_file(tmp_path)]
    argv += ["--work-dir", str(tmp_path / "agent"), "--poll-interval", "0.1"]
    argv += ["--heartbeat-interval", "0.2", "--stop-grace", "0.5"]
    argv += [*([] if sandboxed else AS_ME), *extra]
    code = "import sys; from node_agent.main import main; sys.exit(main(sys.argv[1:]))"
    agent = subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, **(env or {})},
    )
    AGENTS.append(agent)
    return agent


def terminate(agent: subprocess.Popen[str]) -> tuple[int, str]:
    agent.send_signal(signal.SIGTERM)
    _, stderr = agent.communicate(timeout=20)
    return agent.returncode, stderr


def test_the_agent_runs_an_assigned_job_to_success_and_stops_on_sigterm(
    tmp_path: Path, plane: tuple[ControlPlane, str]
) -> None:
    state, url = plane
    train = "import os\nopen(os.environ['FLEXAI_OUTPUT_DIR'] + '/w', 'w')\nprint('trained')\n"
    state.add_job("job-1", "building", ["train.py"], str(job_repo(tmp_path, train)))
    agent = start_agent(tmp_path, url)
    wait_until(lambda: state.status("job-1") == "succeeded")
    assert "trained" in state.log_text("job-1")
    assert "jobs/job-1/outputs/0" in state.uploads
    assert state.heartbeats > 0
    code, stderr = terminate(agent)
    assert code == 0
    assert "registered node gpu-1 (id node-1) with 2 accelerators of type cpu" in stderr
    assert "job job-1 (job-1): taken" in stderr
    assert stderr.count("jobs run as") == 1  # the warning that jobs share the agent's user
    assert "Traceback" not in stderr


LONG_JOB = "import os, time\nprint('PID', os.getpid(), flush=True)\ntime.sleep(600)\n"


def start_long_job(
    tmp_path: Path, plane: tuple[ControlPlane, str]
) -> tuple[ControlPlane, subprocess.Popen[str], int]:
    """An agent running job-1, which sleeps; the job's pid once it has printed it."""
    state, url = plane
    state.add_job("job-1", "building", ["train.py"], str(job_repo(tmp_path, LONG_JOB)))
    agent = start_agent(tmp_path, url)
    wait_until(lambda: "PID" in state.log_text("job-1"))
    return state, agent, int(state.log_text("job-1").split("PID ")[1].split()[0])


def test_the_node_registers_with_its_address_for_its_peers_and_its_gpus(
    tmp_path: Path, plane: tuple[ControlPlane, str]
) -> None:
    state, url = plane
    agent = start_agent(tmp_path, url)
    wait_until(lambda: state.heartbeats > 0)
    (tmp_path / "second").mkdir()
    agent_at = start_agent(tmp_path / "second", url, "--address", "10.9.8.7")
    wait_until(lambda: len(state.registrations) == 2)
    terminate(agent), terminate(agent_at)
    first, second = state.registrations
    assert first["address"] == "127.0.0.1"  # the interface towards the control plane
    assert second["address"] == "10.9.8.7"
    assert isinstance(first["gpus"], list)  # what NVML finds (tests/unit/test_agent_accelerators)


def test_sigterm_ends_the_processes_of_the_running_jobs_too(
    tmp_path: Path, plane: tuple[ControlPlane, str]
) -> None:
    state, agent, pid = start_long_job(tmp_path, plane)
    assert alive(pid)
    code, stderr = terminate(agent)
    assert code == 0
    assert not alive(pid)
    assert "Traceback" not in stderr


def test_a_users_stop_reaches_the_running_job_through_the_poll(
    tmp_path: Path, plane: tuple[ControlPlane, str]
) -> None:
    state, agent, pid = start_long_job(tmp_path, plane)
    with state.lock:
        state.jobs["job-1"]["status"] = "stop in progress"
    wait_until(lambda: state.status("job-1") == "stopped")
    assert not alive(pid)
    terminate(agent)


def test_an_agent_whose_node_another_agent_took_over_ends_its_jobs_silently_and_exits_1(
    tmp_path: Path, plane: tuple[ControlPlane, str]
) -> None:
    state, agent, pid = start_long_job(tmp_path, plane)
    with state.lock:
        state.taken = True
    _, stderr = agent.communicate(timeout=20)
    assert agent.returncode == 1
    assert not alive(pid)
    assert state.reports_tried_after_taken == 0
    assert state.status("job-1") == "in progress"
    assert stderr.splitlines()[-1] == (
        "flexai agent: error: another agent took over node gpu-1 while this one was silent; "
        "this agent ended its jobs' processes: give it another --name, or stop the other agent"
    )


def test_jobs_listed_for_the_node_that_no_supervisor_knows_are_settled(
    tmp_path: Path, plane: tuple[ControlPlane, str]
) -> None:
    state, url = plane
    state.add_job("was-stopping", "stop in progress", ["train.py"], "/nowhere")
    state.add_job("was-running", "in progress", ["train.py"], "/nowhere")
    agent = start_agent(tmp_path, url)
    wait_until(lambda: state.status("was-running") == "failed")
    wait_until(lambda: state.status("was-stopping") == "stopped")
    failed = next(r for r in state.reports if r["job_id"] == "was-running")
    assert failed["code"] == "node_lost"
    assert failed["message"] == (  # no trace of it on the node: it never started here
        "the node agent went down before it started the entry point, and no process of the "
        "job ran"
    )
    terminate(agent)


# Ticks until the flag file exists (a minute at most), then exits with code 3.
TICKING_JOB = """
import os, pathlib, sys, time
print("PID", os.getpid(), flush=True)
for tick in range(600):
    if pathlib.Path(os.environ["FLAG"]).exists():
        break
    print("tick", tick, flush=True)
    time.sleep(0.1)
print("done", flush=True)
sys.exit(3)
"""


def ticking_job_of_a_killed_agent(
    tmp_path: Path, plane: tuple[ControlPlane, str]
) -> tuple[ControlPlane, int, Path]:
    """job-1, which ticks until its flag file exists, left by an agent killed with SIGKILL (no
    chance to end anything); the job's pid, its flag."""
    state, url = plane
    flag = tmp_path / "flag"
    repo = job_repo(tmp_path, TICKING_JOB)
    state.add_job("job-1", "building", ["train.py"], str(repo), env={"FLAG": str(flag)})
    agent = start_agent(tmp_path, url)
    wait_until(lambda: "tick 3" in state.log_text("job-1"))
    agent.kill()
    agent.communicate(timeout=20)
    return state, int(state.log_text("job-1").split("PID ")[1].split()[0]), flag


def ticks(log: str) -> list[int]:
    return [int(line.split()[1]) for line in log.splitlines() if line.startswith("tick ")]


def test_a_job_outlives_its_agents_death_and_a_new_agent_follows_it_to_its_end(
    tmp_path: Path, plane: tuple[ControlPlane, str]
) -> None:
    state, pid, flag = ticking_job_of_a_killed_agent(tmp_path, plane)
    assert alive(pid)
    shipped = ticks(state.log_text("job-1"))[-1]
    wait_until(lambda: ticks((tmp_path / "agent/jobs/job-1/job.log").read_text())[-1] > shipped)
    again = start_agent(tmp_path, url=plane[1])
    wait_until(lambda: "found the job running" in state.log_text("job-1"))
    wait_until(lambda: ticks(state.log_text("job-1"))[-1] > shipped + 5)  # output keeps coming
    flag.write_text("end")
    wait_until(lambda: state.status("job-1") == "failed")
    assert state.reports[-1]["type"] == "exited"
    assert state.reports[-1]["exit_code"] == 3
    log = state.log_text("job-1")
    assert ticks(log) == list(range(len(ticks(log))))  # nothing lost, nothing twice
    assert "done\n[agent] the entry point exited with code 3" in log
    code, stderr = terminate(again)
    assert code == 0
    assert "job job-1 (job-1): found again" in stderr
    assert "Traceback" not in stderr


def test_a_job_that_ended_while_its_agent_was_down_is_reported_with_its_exit_code(
    tmp_path: Path, plane: tuple[ControlPlane, str]
) -> None:
    state, pid, flag = ticking_job_of_a_killed_agent(tmp_path, plane)
    flag.write_text("end")
    wait_until(lambda: not alive(pid))
    again = start_agent(tmp_path, url=plane[1])
    wait_until(lambda: state.status("job-1") == "failed")
    assert [r["type"] for r in state.reports] == ["built", "exited"]
    assert state.reports[-1]["exit_code"] == 3
    log = state.log_text("job-1")
    assert log.endswith(
        "done\n[agent] the job ended while the node agent was down\n"
        "[agent] the entry point exited with code 3\n"
    )
    terminate(again)


def test_processes_of_a_job_no_longer_listed_for_the_node_are_ended_when_the_agent_starts(
    tmp_path: Path, plane: tuple[ControlPlane, str]
) -> None:
    state, pid, _ = ticking_job_of_a_killed_agent(tmp_path, plane)
    with state.lock:
        state.jobs["job-1"]["status"] = "failed"  # say, the node was lost meanwhile
    again = start_agent(tmp_path, url=plane[1])
    wait_until(lambda: not alive(pid))
    code, stderr = terminate(again)
    assert code == 0
    assert f"ending process {pid} of job job-1: it outlived an earlier agent" in stderr
    assert state.reports == [state.reports[0]]  # the built report; nothing since


def test_an_unreachable_server_fails_at_start_with_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["--server", "http://127.0.0.1:9", "--token-file", token_file(tmp_path), "--accels", "1"]
        + ["--work-dir", str(tmp_path), "--connect-timeout", "0.5", *AS_ME]
    )
    stderr = capsys.readouterr().err
    assert code == 1
    assert stderr.startswith(
        "flexai agent: error: cannot reach the control plane at http://127.0.0.1:9"
    )
    assert stderr.count("\n") == 1
    assert "--server" in stderr


def test_a_refused_token_fails_at_start_with_one_clear_line(
    tmp_path: Path, plane: tuple[ControlPlane, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = plane
    token = token_file(tmp_path, "wrong")
    code = main(
        ["--server", url, "--token-file", token, "--accels", "1", "--work-dir", str(tmp_path)]
        + AS_ME
    )
    stderr = capsys.readouterr().err
    assert code == 1
    assert stderr.startswith("flexai agent: error: the control plane refused the token")
    assert stderr.count("\n") == 1


def test_registering_a_node_another_live_agent_holds_fails_with_one_clear_line(
    tmp_path: Path, plane: tuple[ControlPlane, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, url = plane
    state.taken = True
    code = main(["--server", url, "--token-file", token_file(tmp_path), "--accels", "1"]
                + ["--name", "gpu-1"]
                + ["--work-dir", str(tmp_path), *AS_ME])  # fmt: skip
    assert code == 1
    assert capsys.readouterr().err == (
        "flexai agent: error: another agent holds node gpu-1: give this agent another --name, "
        "or stop the other agent first\n"
    )


def test_without_server_or_config_the_agent_says_how_to_configure_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLEXAI_CONFIG", str(tmp_path / "absent.json"))
    monkeypatch.delenv("FLEXAI_API_URL", raising=False)
    monkeypatch.delenv("FLEXAI_TOKEN", raising=False)
    assert main(["--accels", "1", "--work-dir", str(tmp_path)]) == 1
    assert "no API URL" in capsys.readouterr().err


def test_the_token_and_server_come_from_the_client_config_when_not_given(
    tmp_path: Path,
    plane: tuple[ControlPlane, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, url = plane
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"api_url": url, "token": "wrong"}))
    monkeypatch.setenv("FLEXAI_CONFIG", str(config))
    monkeypatch.delenv("FLEXAI_API_URL", raising=False)
    monkeypatch.delenv("FLEXAI_TOKEN", raising=False)
    assert main(["--accels", "1", "--work-dir", str(tmp_path / "agent"), *AS_ME]) == 1
    assert "refused the token" in capsys.readouterr().err  # it reached the configured server


def test_two_agents_cannot_share_a_work_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tmp_path.mkdir(exist_ok=True)
    with (tmp_path / "agent.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        argv = ["--server", "http://[::1]:9", "--token-file", token_file(tmp_path), "--accels", "1"]
        code = main([*argv, "--work-dir", str(tmp_path)])
    assert code == 1
    assert "another agent is running with the work directory" in capsys.readouterr().err


def test_bad_arguments_exit_with_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--accels", "none"]) == 2
    assert "--accels" in capsys.readouterr().err


def test_a_host_without_gpus_needs_accels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").symlink_to(shutil.which("git") or "/usr/bin/git")
    monkeypatch.setenv("PATH", str(bin_dir))
    token = token_file(tmp_path)
    argv = ["--server", "http://[::1]:9", "--token-file", token, "--work-dir", str(tmp_path)]
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        "flexai agent: error: no GPU found on this host; pass --accels N (the job slots to offer)\n"
    )


def test_a_token_on_the_command_line_is_refused_with_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--server", "http://x", "--token", "t0ken", "--accels", "1"]) == 2
    assert capsys.readouterr().err == (
        "flexai agent: error: --token is refused: on the command line the token is readable by "
        "every process on this host (`ps`); use --token-file PATH, FLEXAI_TOKEN, or the client "
        "config\n"
    )


def test_a_token_file_other_users_can_read_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = token_file(tmp_path, mode=0o644)
    argv = ["--server", "http://[::1]:9", "--token-file", path, "--accels", "1"]
    assert main([*argv, "--work-dir", str(tmp_path / "agent")]) == 1
    assert capsys.readouterr().err == (
        f"flexai agent: error: other users can read or change the token file {path} "
        f"(mode 0644); chmod 600 {path}\n"
    )


def test_a_token_from_the_environment_is_not_left_in_the_agents_proc_environ(
    tmp_path: Path, plane: tuple[ControlPlane, str]
) -> None:
    state, url = plane
    agent = start_agent(tmp_path, url, env={"FLEXAI_TOKEN": "t0ken"})
    wait_until(lambda: state.heartbeats > 0)  # it registered: the token reached the agent
    environ = Path(f"/proc/{agent.pid}/environ").read_bytes()
    cmdline = Path(f"/proc/{agent.pid}/cmdline").read_bytes()
    assert b"--heartbeat-interval" in cmdline  # the agent itself, executed again
    assert b"t0ken" not in environ
    assert b"t0ken" not in cmdline
    assert b"FLEXAI_TOKEN" not in environ
    code, stderr = terminate(agent)
    assert code == 0, stderr
