"""Two `flexai server` processes on one PostgreSQL (replicas behind a load balancer): they
serve the same views, a job name is taken once across both, one of them schedules, and the
other takes over when it is killed (PostgreSQL only: one server per SQLite file)."""

from __future__ import annotations

import json
import os
import pwd
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.harness import ROOT, TERMINAL, TLS, Cluster, _start, _wait, free_port
from tests.pg import POSTGRES_ADMIN_URL, fresh_database
from tests.support import make_repo, wait_until

pytestmark = pytest.mark.e2e


def _postgres_absent() -> str:
    try:
        import psycopg

        psycopg.connect(POSTGRES_ADMIN_URL, connect_timeout=2).close()
    except Exception as error:
        return f"no PostgreSQL at {POSTGRES_ADMIN_URL}: {error}"
    return ""


class Replica:
    def __init__(self, cluster: Cluster, part: str, url: str) -> None:
        self.cluster = cluster
        self.part = part
        self.url = url
        self.client = httpx.Client(timeout=30)  # kept-alive connections: timings are the views'

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.cluster.token}"}
        return self.client.request(method, self.url + path, headers=headers, **kwargs)

    def health(self) -> dict[str, Any]:
        try:
            response = httpx.get(self.url + "/health", timeout=5, verify=TLS)
        except httpx.HTTPError:
            return {}
        document: dict[str, Any] = response.json()
        return document

    def ready(self) -> bool:
        return self.health().get("ok") is True

    def leads(self) -> bool:
        return self.health().get("scheduler") == "leader"

    def submit(self, name: str, repo: Path) -> httpx.Response:
        """A new job (a client of its own: 50 of these may run at once)."""
        headers = {"Authorization": f"Bearer {self.cluster.token}"}
        return httpx.request("POST", self.url + "/v1/jobs", headers=headers, timeout=30,
                             json={"name": name, "repository_url": str(repo),
                                   "entry_point": ["train.py"]})  # fmt: skip

    def status(self, name: str) -> str | None:
        response = self.api("GET", f"/v1/jobs/{name}")
        return str(response.json()["status"]) if response.status_code == 200 else None

    def wait_for(self, name: str, status: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while (now := self.status(name)) != status:
            assert now not in TERMINAL and time.monotonic() < deadline, (
                f"job {name} is {now!r} on {self.part}, waited for {status!r}\n"
                f"{self.part} log:\n{self.cluster.log(self.part)[-3000:]}\n"
                f"agent log:\n{self.cluster.log('agent')[-3000:]}"
            )
            time.sleep(0.1)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Replica, Replica]]:
    absent = _postgres_absent()
    if absent:
        pytest.skip(absent)
    root = tmp_path_factory.mktemp("replicas")
    with ExitStack() as stack:
        database_url = stack.enter_context(fresh_database("flexai_replicas"))
        env = {
            **os.environ, "FLEXAI_CONFIG": str(root / "config.json"), "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(root / "wheels"),
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        }  # fmt: skip
        env.pop("FLEXAI_API_URL", None)
        env.pop("FLEXAI_TOKEN", None)
        (root / "wheels").mkdir()
        cluster = Cluster(root=root, api_url="", env=env, token="")
        stack.callback(cluster.stop)
        replicas = []
        for part in ("server-a", "server-b"):
            port = free_port()
            args = ["server", "--data-dir", str(root / part), "--port", str(port),
                    "--database-url", database_url, "--scheduling-patience", "5"]  # fmt: skip
            if part == "server-b":
                args.append("--no-client-config")  # the client config names server a
            _start(cluster, part, args, env)
            replica = Replica(cluster, part, f"http://127.0.0.1:{port}")
            stack.callback(replica.client.close)
            _wait(replica.ready, f"{part} start", cluster)
            replicas.append(replica)
        # Each server made an admin token of its own; both live in the one database.
        cluster.token = json.loads((root / "config.json").read_text())["token"]
        cluster.api_url = replicas[0].url
        yield replicas[0], replicas[1]


def test_two_replicas_share_views_names_and_one_scheduler(
    replicas: tuple[Replica, Replica], tmp_path: Path
) -> None:
    one, two = replicas
    cluster = one.cluster
    repo = make_repo(tmp_path / "repo", {"train.py": "print('hello')\n", "requirements.txt": ""})

    # Exactly one replica schedules, and it stays so.
    wait_until(lambda: one.leads() or two.leads(), timeout=10)
    time.sleep(2)  # the standby tried to take the lock again meanwhile
    assert [one.leads(), two.leads()].count(True) == 1
    leader, standby = (one, two) if one.leads() else (two, one)
    assert "flexai_scheduler_leader 1.0" in leader.api("GET", "/metrics").text
    assert "flexai_scheduler_leader 0.0" in standby.api("GET", "/metrics").text
    assert standby.health()["scheduler"] == "standby"

    # The agent talks to the standby (it registers through it), so it survives the leader.
    _start(cluster, "agent", ["agent", "--server", standby.url, "--accels", "1",
                              "--name", "replica-node", "--work-dir", str(cluster.root / "agent"),
                              "--job-user", pwd.getpwuid(os.geteuid()).pw_name,
                              "--token-file", str(cluster.node_token_file("replica-node")),
                              "--address", "127.0.0.1"], cluster.env)  # fmt: skip

    def node_alive(replica: Replica) -> bool:
        nodes = replica.api("GET", "/v1/nodes").json().get("nodes", [])
        return any(node["name"] == "replica-node" and node["alive"] for node in nodes)

    _wait(lambda: node_alive(standby) and node_alive(leader), "agent registration", cluster)

    # A write through one replica shows in the other's views within milliseconds.
    for writer, reader in ((leader, standby), (standby, leader)):
        figures = []
        for index in range(3):
            name = f"seen-{writer.part}-{index}"
            assert writer.submit(name, repo).status_code == 201
            started = time.monotonic()
            while reader.status(name) is None:
                assert time.monotonic() - started < 5
                time.sleep(0.005)
            figures.append(time.monotonic() - started)
        print(f"a write on {writer.part} showed on {reader.part} after "
              + ", ".join(f"{s * 1000:.0f} ms" for s in figures))  # fmt: skip
        assert max(figures) < 1.0, figures

    # Jobs submitted through both run, and both replicas show the same views.
    names = [f"seen-{replica.part}-{index}" for replica in (one, two) for index in range(3)]
    for name in names:
        leader.wait_for(name, "succeeded")

    def same_views() -> bool:
        lists = [replica.api("GET", "/v1/jobs").json() for replica in (one, two)]
        inspected = [[replica.api("GET", f"/v1/jobs/{name}").json() for name in names]
                     for replica in (one, two)]  # fmt: skip
        return lists[0] == lists[1] and inspected[0] == inspected[1]

    wait_until(same_views, timeout=5)

    # 50 concurrent submissions of one name, spread over both: one job, 49 conflicts.
    def submit(index: int) -> httpx.Response:
        return (one, two)[index % 2].submit("one-name", repo)

    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(submit, range(50)))
    codes = sorted(answer.status_code for answer in answers)
    assert codes == [201] + [409] * 49, codes
    for answer in answers:
        if answer.status_code == 409:
            assert answer.headers["content-type"].startswith("application/problem+json")
            assert answer.json()["status"] == 409
    jobs = [job for job in one.api("GET", "/v1/jobs").json()["jobs"] if job["name"] == "one-name"]
    assert len(jobs) == 1, jobs
    leader.wait_for("one-name", "succeeded")

    # A token revoked through one replica stops working on the other at once, though that
    # one used it a moment ago (and remembers valid tokens for a few seconds).
    made = one.api("POST", "/v1/admin/users", json={"name": "carol"}).json()["token"]
    as_carol = {"Authorization": f"Bearer {made['token']}"}
    assert two.client.get(two.url + "/v1/whoami", headers=as_carol).status_code == 200
    assert one.api("DELETE", f"/v1/tokens/{made['token_id']}").status_code == 200
    wait_until(lambda: two.client.get(two.url + "/v1/whoami", headers=as_carol).status_code
               == 401, timeout=1)  # fmt: skip
    refused = two.client.get(two.url + "/v1/jobs", headers=as_carol).json()
    assert refused["type"].endswith("/token-revoked"), refused

    # kill -9 the leader: the standby takes over within seconds and schedules new jobs onto
    # the agent connected to it.
    cluster.kill(leader.part)
    started = time.monotonic()
    wait_until(standby.leads, timeout=10)
    took = time.monotonic() - started
    print(f"{standby.part} took over scheduling {took:.2f} s after {leader.part} was killed")
    assert took < 5
    assert standby.submit("after-failover", repo).status_code == 201
    standby.wait_for("after-failover", "succeeded", timeout=60)
