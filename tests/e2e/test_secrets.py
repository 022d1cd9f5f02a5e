"""Secrets end to end (real server and agent processes, each store): a job gets its owner's
secret in its environment and its shipped logs show `***` where it printed it; a job naming a
secret that does not exist fails `secret_not_found`; and the value is nowhere else: not in a
file of the server's data directory, the raw ledger, the server's or agent's log, an answer
of the API, or a file the agent wrote."""

from __future__ import annotations

import hashlib
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import FLEXAI, Cluster, start_cluster
from tests.pg import fresh_database

pytestmark = pytest.mark.e2e
RepoFactory = Callable[[dict[str, str]], Path]

USES_IT = """\
import hashlib, os, sys
value = os.environ["MY_TOKEN"]
print("token is", value, flush=True)
sys.stdout.write("split " + value[:5]); sys.stdout.flush()
sys.stdout.write(value[5:] + " twice " + value + "\\n"); sys.stdout.flush()
print("sha", hashlib.sha256(value.encode()).hexdigest(), flush=True)
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[Cluster, str | None]]:  # fmt: skip
    with ExitStack() as stack:
        database_url = None
        if request.param == "postgres":
            database_url = stack.enter_context(fresh_database("flexai_e2e"))
        cluster = start_cluster(tmp_path_factory.mktemp(f"secrets-{request.param}"), database_url)
        stack.callback(cluster.stop)
        yield cluster, database_url


def create_secret(cluster: Cluster, name: str, value: str) -> str:
    done = subprocess.run([*FLEXAI, "secret", "create", name], input=value + "\n", text=True,
                          env=cluster.env, capture_output=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def raw_ledger(database_url: str) -> bytes:
    import psycopg

    with psycopg.connect(database_url) as connection:
        rows = connection.execute("SELECT topic, state FROM flexai_events").fetchall()
        chain = connection.execute("SELECT * FROM flexai_events_chain").fetchall()
    assert rows
    return b"".join(row[0].encode() + bytes(row[1]) for row in rows) + repr(chain).encode()


def test_a_job_gets_its_secret_masked_in_its_logs_and_the_value_is_nowhere_else(
    fleet: tuple[Cluster, str | None], repo_factory: RepoFactory
) -> None:
    cluster, database_url = fleet
    value = f"sk-{uuid.uuid4().hex}"
    said = create_secret(cluster, "e2e-token", value)
    name, missing_name = f"s-{uuid.uuid4().hex[:8]}", f"m-{uuid.uuid4().hex[:8]}"
    repo = repo_factory({"uses.py": USES_IT, "requirements.txt": "# nothing\n"})
    cluster.flexai("training", "run", name, "-u", str(repo), "-S", "MY_TOKEN=e2e-token",
                   "--", "uses.py")  # fmt: skip
    job = cluster.wait_for(name, {"succeeded"})
    logs = cluster.flexai("training", "logs", name, "--follow").stdout
    assert "token is ***" in logs and "split *** twice ***" in logs
    assert f"sha {hashlib.sha256(value.encode()).hexdigest()}" in logs  # the job used it

    cluster.flexai("training", "run", missing_name, "-u", str(repo), "-S", "MY_TOKEN=nope",
                   "--", "uses.py")  # fmt: skip
    failed = cluster.wait_for(missing_name, {"failed"})
    assert failed["failure"]["code"] == "secret_not_found"
    assert "'nope'" in failed["failure"]["message"]
    assert "flexai secret create nope" in failed["failure"]["message"]

    inspected = cluster.flexai("training", "inspect", name).stdout
    assert "MY_TOKEN" in inspected and "e2e-token" in inspected
    listed = cluster.flexai("secret", "list").stdout
    assert "e2e-token" in listed

    seen = [said, logs, inspected, listed, cluster.flexai("training", "history", name).stdout]
    for each in (name, missing_name):
        document = cluster.inspect(each)
        job_id = document["id"]
        for path in (f"/v1/jobs/{each}", f"/v1/jobs/{each}/logs",
                     f"/v1/audit/jobs?name={each}", f"/v1/audit/jobs/{job_id}",
                     f"/v1/audit/jobs/{job_id}/state?version=3", "/v1/jobs", "/v1/secrets"):
            answer = cluster.api("GET", path)
            assert answer.status_code == 200, (path, answer.text)
            seen.append(answer.text)
    assert job["spec"]["secrets"] == {"MY_TOKEN": "e2e-token"}
    assert all(value not in text for text in seen)

    needle = value.encode()
    stored = [path for path in (cluster.root / "data").rglob("*") if path.is_file()]
    assert stored and [path for path in stored if needle in path.read_bytes()] == []
    if database_url is not None:
        assert needle not in raw_ledger(database_url)
    for part in ("server", "agent"):
        assert needle not in (cluster.root / f"{part}.log").read_bytes()
    agent_files = [path for path in (cluster.root / "agent").rglob("*")
                   if path.is_file() and not path.is_symlink() and path.name != "job.log"]
    assert [path for path in agent_files if needle in path.read_bytes()] == []
    # The job itself printed it into its log on the node, where only the node's operator reads.
    job_log = cluster.root / "agent" / "jobs" / job_id_of(cluster, name) / "job.log"
    assert needle in job_log.read_bytes()


def job_id_of(cluster: Cluster, name: str) -> str:
    return str(cluster.inspect(name)["id"])


QUIET = """\
import os, sys, time
print("loaded a key of", len(os.environ["SA_KEY"]), "bytes:", os.environ["SA_KEY"], flush=True)
print("marker", sys.argv[1], flush=True)
time.sleep(300)
"""


def service_account_json() -> str:
    """A 2,000-byte secret, as a service account's key file is."""
    head = '{"type": "service_account", "private_key": "'
    body = (uuid.uuid4().hex * 63)[: 2000 - len(head) - 2]
    return head + body + '"}'


def read_until(stream: Any, needle: str, timeout: float) -> str:
    """Lines of a running ``logs --follow`` until one holds ``needle`` (or the time is up)."""
    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in stream:
            seen.append(line)
            if needle in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    found.wait(timeout)
    return "".join(seen)


def test_a_quiet_job_with_a_long_secret_shows_its_last_line_while_it_runs(
    fleet: tuple[Cluster, str | None], repo_factory: RepoFactory
) -> None:
    cluster, _ = fleet
    value = service_account_json()
    assert len(value) == 2000
    create_secret(cluster, "sa-key", value)
    name, marker = f"q-{uuid.uuid4().hex[:8]}", f"mk-{uuid.uuid4().hex[:16]}"
    repo = repo_factory({"quiet.py": QUIET, "requirements.txt": "# nothing\n"})
    cluster.flexai("training", "run", name, "-u", str(repo), "-S", "SA_KEY=sa-key",
                   "--", "quiet.py", marker)  # fmt: skip
    cluster.wait_for(name, {"in progress"})
    follow = subprocess.Popen([*FLEXAI, "training", "logs", name, "--follow"], env=cluster.env,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        followed = read_until(follow.stdout, f"marker {marker}", timeout=30)
        assert f"marker {marker}" in followed, followed
        logs = cluster.flexai("training", "logs", name).stdout
        assert logs.rstrip("\n").endswith(f"marker {marker}"), logs
        # The job sleeps on for minutes: it is running while its last line is read.
        assert cluster.inspect(name)["status"] == "in progress"
        assert "loaded a key of 2000 bytes: ***" in logs
        assert value not in logs and value not in followed
        assert value[:40] not in logs + followed  # not even the start of it
    finally:
        cluster.flexai("training", "stop", name)
        cluster.wait_for(name, {"stopped"})
        assert follow.wait(timeout=30) == 0
