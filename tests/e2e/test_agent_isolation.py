"""A job cannot get at the agent's token: a root agent given FLEXAI_TOKEN runs the job as
nobody, and the job looks for the token everywhere it could."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Cluster, start_cluster
from tests.support import (
    build_wheel,
    can_run_jobs_as,
    make_repo,
    python_for_user,
    world_readable_directory,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(bool(can_run_jobs_as("nobody")), reason=can_run_jobs_as("nobody")),
]

# Every place a job could find the token: its environment, the environment and command line of
# every process, the agent's and the server's files, any file under the cluster's directory.
# It knows the token only by its SHA-256, so it cannot leak it by itself.
PRYING_JOB = """
import hashlib, json, os, pathlib, re
import tinydep

wanted = os.environ["TOKEN_SHA256"]
found, read = [], 0

def holds_token(data):
    words = re.findall(rb"[A-Za-z0-9_-]{16,}", data)
    return any(hashlib.sha256(word).hexdigest() == wanted for word in words)

def look(path):
    global read
    try:
        data = pathlib.Path(path).read_bytes()
    except OSError as error:
        return type(error).__name__
    read += 1
    if holds_token(data):
        found.append(str(path))
    return "read"

for name, value in os.environ.items():
    if name == "FLEXAI_TOKEN" or holds_token(value.encode()):
        found.append(f"env:{name}")
for process in pathlib.Path("/proc").iterdir():
    if process.name.isdigit():
        look(process / "environ")
        look(process / "cmdline")
named = {path: look(path) for path in json.loads(os.environ["AGENT_FILES"])}
for path in pathlib.Path(os.environ["CLUSTER_ROOT"]).rglob("*"):
    if path.is_file() and str(path) not in named:
        look(path)
summary = {"uid": os.getuid(), "found": found, "read": read, "named": named}
print("PROBE " + json.dumps(summary) + " dependency " + tinydep.VALUE)
"""


@pytest.fixture
def isolated_cluster() -> Iterator[Cluster]:
    """An agent running as root, given its token in FLEXAI_TOKEN, running jobs as nobody, with
    everything in a directory nobody may enter (pytest's are root's alone)."""
    python = python_for_user("nobody")
    if python is None:
        pytest.skip("no Python interpreter here that nobody can run with venv and pip")
    with world_readable_directory() as root:
        cluster = start_cluster(
            root / "cluster", None, job_user="nobody", job_python=python,
            token_in_environment=True,
        )  # fmt: skip
        try:
            # The server prints the admin token on its first start; its log is the test's.
            (cluster.root / "server.log").chmod(0o600)
            yield cluster
        finally:
            cluster.stop()


def test_a_job_run_as_nobody_finds_the_agents_token_nowhere_and_still_succeeds(
    isolated_cluster: Cluster, job_name: str
) -> None:
    cluster = isolated_cluster
    root = cluster.root
    planted = root / "planted-token.txt"  # the one copy the job may read: proves it searches
    planted.write_text(f"token {cluster.token}\n")
    build_wheel(root / "wheels", "tinydep", "1.0", "VALUE = 'installed'\n")
    repo = make_repo(root / "repo", {"train.py": PRYING_JOB, "requirements.txt": "tinydep\n"})
    agent_files = [
        str(root / "config.json"),  # the client config the agent could read the token from
        str(root / "data" / "admin.token"),
        str(root / "agent" / "agent-id"),
        str(root / "agent" / "agent.lock"),
    ]
    digest = hashlib.sha256(cluster.token.encode()).hexdigest()
    cluster.flexai(
        "training", "run", job_name, "-u", str(repo), "-E", f"TOKEN_SHA256={digest}",
        "-E", f"CLUSTER_ROOT={root}", "-E", f"AGENT_FILES={json.dumps(agent_files)}",
        "--", "train.py",
    )  # fmt: skip
    assert cluster.wait_for(job_name, {"succeeded"})["status"] == "succeeded"

    logs = cluster.flexai("training", "logs", job_name).stdout
    line = next(line for line in logs.splitlines() if line.startswith("PROBE "))
    probe = json.loads(line[len("PROBE ") :].rsplit(" dependency ", 1)[0])
    assert line.endswith(" dependency installed")  # pip, too, ran as nobody
    assert probe["uid"] == 65534
    assert probe["found"] == [str(planted)]
    # unreadable: not even there in its sandbox (the agent's work directory is hidden, and
    # the rest of the cluster's folder is root's), else refused
    assert set(probe["named"]) == set(agent_files)
    assert set(probe["named"].values()) <= {"PermissionError", "FileNotFoundError"}
    assert probe["read"] > 10  # its own processes' environ and cmdline, files of the cluster

    agent = cluster.processes[1]
    environ = Path(f"/proc/{agent.pid}/environ").read_bytes()
    assert cluster.token.encode() not in environ
    assert b"FLEXAI_TOKEN" not in environ
