"""Sharing a fleet, end to end (each store, real agents): a high-priority job preempts a low one,
which waits in line and then resumes from its last checkpoint; a job with retries whose agent is
killed runs again on the other node from its checkpoint; a user's quota holds while she submits
ten jobs at once."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from node_agent.models import marker_prefix
from node_agent.run.processes import marked_processes, signal_pids
from tests.e2e.harness import FLEXAI, TLS, Cluster, start_cluster
from tests.pg import fresh_database

pytestmark = pytest.mark.e2e
RepoFactory = Callable[[dict[str, str]], Path]
LEASE_S = 4

RESUMABLE = """\
import json, os, pathlib, sys, time
total = int(sys.argv[1])
hold = int(sys.argv[2]) if len(sys.argv) > 2 else 0
given = pathlib.Path(os.environ["FLEXAI_INPUT_CHECKPOINT_DIR"])
restarts = os.environ["FLEXAI_RESTART_COUNT"]
start = 0
if (given / "trainer_state.json").exists():
    start = json.loads((given / "trainer_state.json").read_text())["global_step"]
    print("resumed from step", start, "restart", restarts, flush=True)
else:
    print("fresh start, restart", restarts, flush=True)
checkpoints = pathlib.Path(os.environ["FLEXAI_OUTPUT_CHECKPOINT_DIR"])
for step in range(start + 1, total + 1):
    time.sleep(0.15)
    partial = checkpoints / f".partial-{step}"
    partial.mkdir(parents=True)
    history = [{"step": step, "loss": 1.0 / step}]
    (partial / "trainer_state.json").write_text(
        json.dumps({"global_step": step, "log_history": history}))
    partial.rename(checkpoints / f"checkpoint-{step}")
    print("step", step, flush=True)
    if step == hold and restarts == "0":
        time.sleep(120)  # the first attempt goes no further: it waits to be preempted
print("finished at step", total, flush=True)
"""


class User:
    """One user's token, through the API and the CLI."""

    def __init__(self, cluster: Cluster, name: str, token: str) -> None:
        self.cluster, self.name, self.token = cluster, name, token
        self.env = {**cluster.env, "FLEXAI_TOKEN": token, "FLEXAI_API_URL": cluster.api_url}

    def flexai(self, *args: str) -> str:
        done = subprocess.run([*FLEXAI, *args], env=self.env, capture_output=True, text=True,
                              timeout=120, cwd=self.cluster.root)  # fmt: skip
        assert done.returncode == 0, f"flexai {' '.join(args)}: {done.stderr}"
        return done.stdout

    def job(self, name: str) -> dict[str, Any]:
        response = httpx.get(f"{self.cluster.api_url}/v1/jobs/{name}", timeout=30, verify=TLS,
                             headers={"Authorization": f"Bearer {self.token}"})  # fmt: skip
        response.raise_for_status()
        document: dict[str, Any] = response.json()
        return document

    def wait_for(self, name: str, statuses: set[str], timeout: float = 90) -> dict[str, Any]:
        return self.cluster.wait_for(name, statuses, timeout, inspect=self.job)


def _user(cluster: Cluster, name: str) -> User:
    token = cluster.flexai("admin", "user", "create", name).stdout.strip().splitlines()[-1]
    return User(cluster, name, token)


@pytest.fixture(params=["sqlite", "postgres"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """A server that preempts after 1 s and loses a silent node after 4 s, and its agent
    `test-node` with 2 accelerators."""
    with ExitStack() as stack:
        database_url = None
        if request.param == "postgres":
            database_url = stack.enter_context(fresh_database("flexai_e2e"))
        cluster = start_cluster(tmp_path / "fleet", database_url, accels=2,
                                server_flags=("--node-timeout", str(LEASE_S),
                                              "--preempt-after", "1"))  # fmt: skip
        stack.callback(cluster.stop)
        yield cluster


def _events(document: dict[str, Any]) -> list[str]:
    return [entry["event"] for entry in document["history"]]


def test_a_high_job_preempts_a_low_one_which_resumes_from_its_checkpoint_after(
    fleet: Cluster, repo_factory: RepoFactory
) -> None:
    alice, bob = _user(fleet, "alice"), _user(fleet, "bob")
    fleet.flexai("admin", "user", "high-priority", "bob", "--allow")
    resumable = repo_factory({"requirements.txt": "", "train.py": RESUMABLE})
    alice.flexai("training", "run", "long", "-u", str(resumable), "--priority", "low",
                 "--accels", "2", "--", "train.py", "12", "5")  # fmt: skip
    alice.wait_for("long", {"in progress"})
    deadline = time.monotonic() + 60
    while len(alice.flexai("training", "checkpoints", "long").splitlines()) < 4:  # 3 and a header
        assert time.monotonic() < deadline, alice.flexai("training", "logs", "long")
        time.sleep(0.2)

    quick = repo_factory({"requirements.txt": "", "train.py": "print('bob ran')\n"})
    bob.flexai("training", "run", "urgent", "-u", str(quick), "--priority", "high",
               "--accels", "2", "--", "train.py")  # fmt: skip
    urgent = bob.wait_for("urgent", {"succeeded"}, timeout=60)
    assert urgent["spec"]["priority"] == "high"

    done = alice.wait_for("long", {"succeeded"}, timeout=90)
    events = _events(done)
    assert events.count("PreemptionRequested") == events.count("Preempted") == 1
    assert events.count("Started") == 2
    preempted = next(e for e in done["history"] if e["event"] == "Preempted")
    assert preempted["status"] == "enqueued" and preempted["facts"]["for_owner"] == "bob"
    resumed_at = [e["at"] for e in done["history"] if e["event"] == "Started"][-1]
    bob_started = next(e["at"] for e in urgent["history"] if e["event"] == "Started")
    assert preempted["at"] <= bob_started <= resumed_at  # bob ran in between
    assert [attempt["attempt"] for attempt in done["attempts"]] == [1, 2]
    assert done["attempts"][0]["cause"] == "preempted by bob's job urgent"
    assert done["attempts"][-1]["cause"] == "succeeded" and done["attempt"] == 2
    second = alice.flexai("training", "logs", "long", "--attempt", "2")
    assert "resumed from step" in second and "restart 1" in second
    resumed = int(second.split("resumed from step", 1)[1].split()[0])
    assert resumed >= 3 and f"step {resumed + 1}\n" in second and "step 1\n" not in second
    first = alice.flexai("training", "logs", "long", "--attempt", "1")
    assert "fresh start, restart 0" in first and "finished" not in first
    assert alice.flexai("training", "logs", "long") == second  # the last attempt by default


def test_a_job_with_a_retry_runs_again_on_the_other_node_when_its_agent_is_killed(
    fleet: Cluster, repo_factory: RepoFactory
) -> None:
    fleet.start_agent("spare-node", 1)
    resumable = repo_factory({"requirements.txt": "", "train.py": RESUMABLE})
    fleet.flexai("training", "run", "sturdy", "-u", str(resumable), "--max-retries", "1",
                 "--", "train.py", "16")  # fmt: skip
    admin = User(fleet, "admin", fleet.token)
    running = admin.wait_for("sturdy", {"in progress"})
    assert running["placements"][0]["node"] == "test-node"  # the most free accelerators
    deadline = time.monotonic() + 60
    while len(admin.flexai("training", "checkpoints", "sturdy").splitlines()) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    fleet.kill("agent")
    try:
        done = admin.wait_for("sturdy", {"succeeded"}, timeout=LEASE_S + 60)
    finally:  # the killed agent's job runs on: no test leaves it behind
        prefix = marker_prefix(fleet.root / "agent")
        signal_pids([pid for pid, marker in marked_processes().items()
                     if marker.startswith(prefix)], signal.SIGKILL)  # fmt: skip
    retried = [entry for entry in done["history"] if entry["event"] == "Retried"]
    assert len(retried) == 1 and retried[0]["facts"]["cause"] == "node_lost"
    assert retried[0]["status"] == "scheduling"
    assert [a["nodes"] for a in done["attempts"]] == [["test-node"], ["spare-node"]]
    assert done["attempts"][0]["cause"] == "node_lost"
    second = admin.flexai("training", "logs", "sturdy")
    assert "resumed from step" in second and "restart 1" in second
    assert "finished at step 16" in second


def test_a_quota_holds_while_its_user_submits_ten_jobs(
    fleet: Cluster, repo_factory: RepoFactory
) -> None:
    alice = _user(fleet, "alice")
    said = fleet.flexai("admin", "user", "quota", "alice", "--accels", "1").stdout
    assert "alice" in said and "1" in said
    quick = repo_factory({"requirements.txt": "", "train.py": "import time; time.sleep(0.3)\n"})
    alice.flexai("training", "run", "many", "-u", str(quick), "--sweep",
                 "I=" + ",".join(str(i) for i in range(10)), "--", "train.py")  # fmt: skip
    names = [f"many-{i}" for i in range(1, 11)]
    said_why, most = "", 0
    deadline = time.monotonic() + 120
    while True:
        response = httpx.get(f"{fleet.api_url}/v1/jobs", params={"limit": 100}, timeout=30,
                             verify=TLS,
                             headers={"Authorization": f"Bearer {alice.token}"})  # fmt: skip
        jobs = {job["name"]: job for job in response.json()["jobs"]}
        on_nodes = [job for job in jobs.values()
                    if job["status"] in ("building", "enqueued", "in progress")]  # fmt: skip
        most = max(most, len(on_nodes))
        waiting = [name for name in names if jobs.get(name, {}).get("status") == "scheduling"]
        if waiting and not said_why:
            said_why = str(alice.job(waiting[0]).get("waiting") or "")
        if all(jobs.get(name, {}).get("status") == "succeeded" for name in names):
            break
        assert time.monotonic() < deadline, jobs
        time.sleep(0.05)
    assert most == 1
    assert "quota: alice runs 1 of 1 accelerators" in said_why
