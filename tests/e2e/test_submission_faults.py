"""`kill -9` of the server while several clients submit 700 jobs, then a restart: every
submission answered 201 exists exactly once and reaches its status; one whose answer was lost
exists whole or not at all; the ledger's chain holds."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.harness import Cluster, start_server
from tests.pg import fresh_database

pytestmark = pytest.mark.e2e

SUBMISSIONS = 700
CLIENTS = 4
KILL_AFTER = 300
SPEC = {"repository_url": "https://example.com/org/repo.git", "entry_point": ["train.py"],
        "accels": 1}  # fmt: skip


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """A server alone (no node: each job is rejected once its scheduling patience runs out)."""
    with ExitStack() as stack:
        database_url = None
        if request.param == "postgres":
            database_url = stack.enter_context(fresh_database("flexai_e2e_kill"))
        cluster = start_server(tmp_path, database_url, scheduling_patience=1)
        stack.callback(cluster.stop)
        yield cluster


class Load:
    """Clients that submit job ``sub-N`` for each N in turn; an answer lost to the kill is
    not retried (its name is then 'unknown'), and a client waits for the server to be back."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.names = (f"sub-{n}" for n in itertools.count())
        self.taken = 0
        self.lock = threading.Lock()
        self.created: list[str] = []
        self.refused: dict[str, int] = {}
        self.unknown: list[str] = []

    def next_name(self) -> str | None:
        with self.lock:
            if self.taken >= SUBMISSIONS:
                return None
            self.taken += 1
            return next(self.names)

    def client(self) -> None:
        headers = {"Authorization": f"Bearer {self.cluster.token}"}
        with httpx.Client(base_url=self.cluster.api_url, headers=headers, timeout=30) as http:
            while (name := self.next_name()) is not None:
                try:
                    answer = http.post("/v1/jobs", json={**SPEC, "name": name})
                except httpx.HTTPError:
                    with self.lock:
                        self.unknown.append(name)
                    self._wait_for_server(http)
                    continue
                with self.lock:
                    if answer.status_code == 201:
                        self.created.append(name)
                    else:
                        self.refused[name] = answer.status_code

    def _wait_for_server(self, http: httpx.Client) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if http.get("/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)


def every_job(http: httpx.Client) -> list[dict[str, Any]]:
    """Every live job, page after page."""
    jobs: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 500}
    while True:
        page = http.get("/v1/jobs", params=params).json()
        jobs.extend(page["jobs"])
        if not page["next_cursor"]:
            return jobs
        params["cursor"] = page["next_cursor"]


def jobs_named(cluster: Cluster, http: httpx.Client, name: str) -> list[dict[str, Any]]:
    answer = http.get("/v1/audit/jobs", params={"name": name})
    assert answer.status_code == 200, answer.text
    jobs: list[dict[str, Any]] = answer.json()["jobs"]
    return jobs


def test_kill_9_under_submission_load_loses_no_answered_job(server: Cluster) -> None:
    load = Load(server)
    clients = [threading.Thread(target=load.client) for _ in range(CLIENTS)]
    for client in clients:
        client.start()
    deadline = time.monotonic() + 120
    while len(load.created) < KILL_AFTER:
        assert time.monotonic() < deadline, "the load did not get going"
        time.sleep(0.01)
    server.kill("server")
    killed_at = len(load.created)
    time.sleep(0.5)
    server.restart("server")
    for client in clients:
        client.join(timeout=300)
        assert not client.is_alive()

    assert load.taken == SUBMISSIONS
    assert load.unknown, "the kill cut no submission short: it did not land mid-load"
    assert len(load.created) > killed_at, "nothing was answered after the restart"
    assert not load.refused, load.refused  # every answer was 201, or lost to the kill
    headers = {"Authorization": f"Bearer {server.token}"}
    with httpx.Client(base_url=server.api_url, headers=headers, timeout=30) as http:
        listed = every_job(http)
        names = [job["name"] for job in listed]
        assert len(names) == len(set(names)), "a name held by two live jobs"
        missing = set(load.created) - set(names)
        assert not missing, sorted(missing)[:10]  # answered 201: there, once
        for name in load.unknown:  # answer lost: whole or absent
            jobs = jobs_named(server, http, name)
            assert len(jobs) <= 1, jobs
            if jobs:
                shown = http.get(f"/v1/jobs/{name}")
                assert shown.status_code == 200 and shown.json()["id"] == jobs[0]["id"]
        # Every job reaches its status: no node ever registered, so each is rejected.
        last = load.created[-1]
        wait_until = time.monotonic() + 120
        while http.get(f"/v1/jobs/{last}").json()["status"] != "rejected":
            assert time.monotonic() < wait_until, http.get(f"/v1/jobs/{last}").json()
            time.sleep(0.2)
        for name in load.created[:: max(1, len(load.created) // 50)]:
            document = http.get(f"/v1/jobs/{name}").json()
            assert document["status"] == "rejected", document
        verified = http.post("/v1/admin/verify", json={})
        assert verified.status_code == 200, verified.text
        result = verified.json()
        assert result["ok"], result
        assert result["jobs"] == len(listed)
        assert len(listed) == len(load.created) + sum(
            1 for name in load.unknown if jobs_named(server, http, name)
        )
