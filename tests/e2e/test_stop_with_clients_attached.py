"""SIGTERM with everything a server holds open (each store): an agent's long polls, `logs
--follow` clients and a debug session's relay. The server answers or ends each at once and
exits within 5 s; the followers resume once it is back, missing no line; then the agent
stops within 5 s, ending its job's processes, and says it left: the job fails at once, saying
so, with its log's last line the agent's. Neither logs a traceback."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh
import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.e2e.harness import FLEXAI, Cluster, start_cluster
from tests.pg import fresh_database
from tests.support import job_pids, make_repo, wait_until

pytestmark = pytest.mark.e2e

COUNT = """\
import itertools, time
for step in itertools.count():
    print(f"step {step}", flush=True)
    time.sleep(0.1)
"""
SLEEP = """\
import os, time
print(f"pid {os.getpid()}", flush=True)
time.sleep(600)
"""


@dataclass
class Follower:
    process: subprocess.Popen[bytes]
    out: Path
    err: Path


@pytest.fixture(params=["sqlite", "postgres"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """A server and an agent with two accelerators."""
    with ExitStack() as stack:
        database_url = None
        if request.param == "postgres":
            database_url = stack.enter_context(fresh_database("flexai_stop"))
        cluster = start_cluster(tmp_path / "cluster", database_url, accels=2)
        stack.callback(cluster.stop)
        yield cluster


def test_sigterm_ends_every_long_poll_stream_and_debug_session_at_once_and_clients_resume(
    cluster: Cluster, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", {"count.py": COUNT, "sleep.py": SLEEP,
                                         "requirements.txt": ""})  # fmt: skip
    cluster.flexai("training", "run", "counter", "-u", str(repo), "--", "count.py")
    cluster.flexai("training", "run", "sleeper", "-u", str(repo), "--", "sleep.py")
    cluster.wait_for("counter", {"in progress"})
    cluster.wait_for("sleeper", {"in progress"})
    with _debug_relay(cluster, "counter") as (relay, session_id):
        polls = _agent_long_polls(cluster)
        followers = [_follow(cluster, "counter", tmp_path / f"follower-{i}") for i in range(2)]
        wait_until(lambda: _metric(cluster, "flexai_log_followers") == 2, 30)
        assert not any(poll.done() for poll in polls.values()), "the long polls should be held"

        signalled = time.monotonic()
        cluster.parts["server"].send_signal(signal.SIGTERM)
        assert cluster.parts["server"].wait(timeout=10) == 0
        assert time.monotonic() - signalled < 5
        for name, poll in polls.items():
            status, answered = poll.result(timeout=5)
            assert status == 200, name
            assert answered - signalled < 1, f"the {name} long poll was held after the signal"
        with pytest.raises(ConnectionClosed):
            relay.recv(timeout=2)
    assert "graceful shutdown exceeded" not in cluster.log("server")

    cluster.processes.remove(cluster.parts["server"])
    cluster.restart("server")
    closed = [entry for entry in cluster.inspect("counter")["history"]
              if entry["event"] == "DebugSessionClosed"]  # fmt: skip
    assert [entry["facts"]["session_id"] for entry in closed] == [session_id]
    assert closed[0]["facts"]["reason"] == "the control plane stopped"

    cluster.flexai("training", "stop", "counter")
    for follower in followers:
        assert follower.process.wait(timeout=30) == 0, follower.err.read_text()
    whole = cluster.api("GET", "/v1/jobs/counter/logs").content
    assert b"step 3\n" in whole
    for follower in followers:  # every line once, in order, across the restart
        assert follower.out.read_bytes() == whole
        assert "Traceback" not in follower.err.read_text()
    assert "Traceback" not in cluster.log("server")

    job_pids = _job_pids(cluster, "sleeper")
    cluster.wait_for_node("test-node")
    signalled = time.monotonic()
    cluster.parts["agent"].send_signal(signal.SIGTERM)
    assert cluster.parts["agent"].wait(timeout=10) == 0
    assert time.monotonic() - signalled < 5
    assert not any(_running(pid) for pid in job_pids), "the agent left its job's process running"
    assert "Traceback" not in cluster.log("agent")
    wait_until(lambda: cluster.inspect("sleeper")["status"] == "failed")
    failure = cluster.inspect("sleeper")["failure"]  # the agent said it left: no lease waited
    assert failure["code"] == "node_lost"
    assert failure["message"].startswith("the agent of node test-node stopped at "), failure
    said = "[agent] the node agent is stopping: it ended the job's processes on this node\n"
    assert cluster.api("GET", "/v1/jobs/sleeper/logs").text.endswith(said)
    assert "failed" not in cluster.log("agent").split("SIGTERM received")[-1]


def _follow(cluster: Cluster, name: str, path: Path) -> Follower:
    out, err = path.with_suffix(".out"), path.with_suffix(".err")
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            [*FLEXAI, "training", "logs", name, "--follow"], env=cluster.env, cwd=cluster.root,
            stdout=stdout, stderr=stderr,
        )  # fmt: skip
    cluster.processes.append(process)  # ended with the cluster, should the test fail
    return Follower(process, out, err)


def _metric(cluster: Cluster, name: str) -> float:
    text = httpx.get(cluster.api_url + "/metrics").text
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else -1.0


@contextmanager
def _debug_relay(cluster: Cluster, name: str) -> Iterator[tuple[ClientConnection, str]]:
    """A debug session the agent took, with the user's side of its relay connected (as the
    CLI's ssh would be): the agent's SSH server has said hello through it."""
    key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    opened = cluster.api("POST", f"/v1/jobs/{name}/debug-sessions", json={"public_key": key})
    assert opened.status_code == 201, opened.text
    path = f"/v1/jobs/{name}/debug-sessions/{opened.json()['id']}"
    ready = cluster.api("GET", path, params={"wait": 20}).json()
    assert ready["state"] == "ready", ready
    with connect("ws" + cluster.api_url.removeprefix("http") + path + "/stream",
                 additional_headers={"Authorization": f"Bearer {cluster.token}"}
                 ) as relay:  # fmt: skip
        hello = relay.recv(timeout=10)
        assert isinstance(hello, bytes) and hello.startswith(b"SSH-2.0-"), hello
        yield relay, str(ready["id"])


def _agent_long_polls(cluster: Cluster) -> dict[str, Future[tuple[int, float]]]:
    """The node's two long polls, asked as its agent asks them, each held by the server (the
    assignments have not changed since the etag; no debug session waits for the node)."""
    agent_id = (cluster.root / "agent" / "agent-id").read_text().strip()
    headers = {"Authorization": f"Bearer {cluster.node_token('test-node')}",
               "X-Flexai-Agent-Id": agent_id}  # fmt: skip
    node_id = next(node["id"] for node in cluster.api("GET", "/v1/nodes").json()["nodes"])
    node = f"{cluster.api_url}/v1/agent/nodes/{node_id}"
    etag = httpx.get(f"{node}/assignments", headers=headers).json()["etag"]
    return {
        "assignments": _in_background(f"{node}/assignments", headers,
                                      {"wait": 30, "since": etag}),  # fmt: skip
        "debug-session offers": _in_background(f"{node}/debug-sessions", headers, {"wait": 30}),
    }


def _in_background(url: str, headers: dict[str, str], params: dict[str, Any]
                   ) -> Future[tuple[int, float]]:  # fmt: skip
    """GET ``url`` in a thread: its status and when it was answered."""
    answer: Future[tuple[int, float]] = Future()

    def ask() -> None:
        try:
            response = httpx.get(url, headers=headers, params=params, timeout=60)
        except httpx.HTTPError as error:
            answer.set_exception(error)
        else:
            answer.set_result((response.status_code, time.monotonic()))

    threading.Thread(target=ask, daemon=True).start()
    return answer


def _job_pids(cluster: Cluster, name: str) -> list[int]:
    """The job's processes, by their pids on this host (in its sandbox they have their own)."""
    logs = cluster.api("GET", f"/v1/jobs/{name}/logs").text
    assert re.search(r"^pid (\d+)$", logs, re.MULTILINE), logs  # it runs
    pids = job_pids(str(cluster.inspect(name)["id"]))
    assert pids
    return pids


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
