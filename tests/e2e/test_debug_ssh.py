"""`flexai training debug-ssh` end to end: the real CLI and the user's own `ssh`, through the
real server's relay, into a real job's environment on the real agent's node (each store)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.e2e.harness import FLEXAI, Cluster, free_port
from tests.support import make_repo, wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client"),
]

SERVE = """\
import http.server, os, pathlib, threading, time

(pathlib.Path(os.environ["FLEXAI_OUTPUT_DIR"]) / "written-by-job.txt").write_text("hi")


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from inside the job"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", int(os.environ["JOB_PORT"])), Hello)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
time.sleep(600)
"""


@dataclass(frozen=True)
class RunningJob:
    name: str
    port: int


@pytest.fixture(scope="module")
def running_job(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningJob]:
    """A job that wrote a file to its output directory and serves HTTP on the node's loopback."""
    files = {"serve.py": SERVE, "requirements.txt": ""}
    repo = make_repo(tmp_path_factory.mktemp("debug") / "repo", files)
    job = RunningJob(f"debugged-{free_port()}", free_port())
    cluster.flexai("training", "run", job.name, "-u", str(repo), "-E", "SOME_ENV=hello-debug",
                   "-E", f"JOB_PORT={job.port}", "--", "serve.py")  # fmt: skip
    cluster.wait_for(job.name, {"in progress"})
    wait_until(lambda: b"ready" in cluster.api("GET", f"/v1/jobs/{job.name}/logs").content, 60)
    yield job
    cluster.flexai("training", "stop", job.name, check=False)
    cluster.wait_for(job.name, {"stopped", "failed", "stop failed"}, timeout=60)


def test_a_command_runs_in_the_jobs_environment_and_exits_with_its_status(
    cluster: Cluster, running_job: RunningJob
) -> None:
    command = ["sh", "-c", "echo $SOME_ENV; ls $FLEXAI_OUTPUT_DIR"]
    ran = cluster.flexai("training", "debug-ssh", running_job.name, "--", *command, timeout=90)
    assert ran.stdout.splitlines() == ["hello-debug", "written-by-job.txt"]
    failed = cluster.flexai("training", "debug-ssh", running_job.name, "--", "sh", "-c",
                            "exit 3", check=False, timeout=90)  # fmt: skip
    assert failed.returncode == 3, failed.stderr


def test_a_local_port_is_forwarded_to_a_port_of_the_job_on_its_node(
    cluster: Cluster, running_job: RunningJob
) -> None:
    local = free_port()
    forward = subprocess.Popen(
        [*FLEXAI, "training", "debug-ssh", running_job.name, "-N",
         "-L", f"{local}:localhost:{running_job.port}"],
        env=cluster.env, cwd=cluster.root, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    answers: list[str] = []

    def answered() -> bool:
        assert forward.poll() is None, forward.communicate()
        try:
            answers.append(httpx.get(f"http://127.0.0.1:{local}/", timeout=5).text)
        except httpx.HTTPError:
            return False
        return True

    try:
        wait_until(answered, 60)
    finally:
        forward.terminate()
        forward.communicate(timeout=30)
    assert answers == ["hello from inside the job"]


def test_another_user_is_told_the_job_does_not_exist(
    cluster: Cluster, running_job: RunningJob
) -> None:
    created = cluster.api("POST", "/v1/admin/users", json={"name": f"bob{free_port()}"})
    assert created.status_code == 201, created.text
    bob = {**cluster.env, "FLEXAI_TOKEN": created.json()["token"]["token"]}
    refused = subprocess.run(
        [*FLEXAI, "training", "debug-ssh", running_job.name, "--", "true"], env=bob,
        cwd=cluster.root, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 1
    assert f"no job named '{running_job.name}'" in refused.stderr


def test_the_sessions_show_in_the_jobs_history_and_a_finished_job_refuses_them(
    cluster: Cluster, running_job: RunningJob
) -> None:
    document = cluster.inspect(running_job.name)
    opened = [e for e in document["history"] if e["event"] == "DebugSessionOpened"]
    closed = [e for e in document["history"] if e["event"] == "DebugSessionClosed"]
    assert len(opened) >= 3 and len(closed) == len(opened)
    assert opened[0]["by"] == {"kind": "user", "id": "admin"}
    assert opened[0]["facts"]["node"] == "test-node"
    assert opened[0]["facts"]["key_fingerprint"].startswith("SHA256:")
    assert {e["status"] for e in opened + closed} == {"in progress"}
    history = cluster.flexai("training", "history", running_job.name).stdout
    assert "DebugSessionOpened" in history and "DebugSessionClosed" in history

    cluster.flexai("training", "stop", running_job.name)
    cluster.wait_for(running_job.name, {"stopped"}, timeout=60)
    refused = cluster.flexai("training", "debug-ssh", running_job.name, "--", "true",
                             check=False)  # fmt: skip
    assert refused.returncode == 1
    assert "is 'stopped'" in refused.stderr and "flexai training run" in refused.stderr
