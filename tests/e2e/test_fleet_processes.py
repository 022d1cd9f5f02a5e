"""A fleet of real agents, end to end (each store): multi-node jobs that meet over TCP, node
loss told truthfully, jobs that outlive a server or agent crash, time limits, stops of escaped
processes, and waiting jobs that say why."""

from __future__ import annotations

import json
import os
import signal
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from node_agent.models import marker_prefix
from node_agent.run.processes import marked_processes, signal_pids
from tests.e2e.harness import Cluster, start_cluster
from tests.pg import fresh_database
from tests.support import job_pids, wait_until

pytestmark = pytest.mark.e2e
RepoFactory = Callable[[dict[str, str]], Path]
LEASE_S = 4


@pytest.fixture(params=["sqlite", "postgres"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """A server with a short node lease, and its agent `test-node` (2 accelerators)."""
    with ExitStack() as stack:
        database_url = None
        if request.param == "postgres":
            database_url = stack.enter_context(fresh_database("flexai_e2e"))
        cluster = start_cluster(tmp_path / "fleet", database_url, accels=2,
                                server_flags=("--node-timeout", str(LEASE_S)))  # fmt: skip
        stack.callback(cluster.stop)
        yield cluster


RENDEZVOUS = """\
import json, os, pathlib, socket, time
rank, world = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
print("rank", rank, "of", world, "devices", os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
if rank == 0:
    with socket.create_server((addr, port)) as server:
        server.settimeout(60)
        connection, _ = server.accept()
        with connection:
            got = connection.recv(64).decode()
            connection.sendall(b"hello rank 1")
else:
    deadline = time.time() + 60
    while True:
        try:
            connection = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    with connection:
        connection.sendall(b"hello rank 0")
        got = connection.recv(64).decode()
print("rank", rank, "got", got, flush=True)
out = pathlib.Path(os.environ["FLEXAI_OUTPUT_DIR"])
(out / f"rank-{rank}.json").write_text(json.dumps({"got": got, "world": os.environ["WORLD_SIZE"]}))
"""


def test_a_two_node_job_meets_over_tcp_and_ends_with_every_nodes_logs_and_outputs(
    fleet: Cluster, repo_factory: RepoFactory, job_name: str, tmp_path: Path
) -> None:
    fleet.start_agent("second-node", 2)
    repo = repo_factory({"requirements.txt": "", "train.py": RENDEZVOUS})
    fleet.flexai("training", "run", job_name, "-u", str(repo), "-n", "2", "-a", "2",
                 "--", "train.py")  # fmt: skip
    document = fleet.wait_for(job_name, {"succeeded"})
    assert len(document["placements"]) == 2
    assert {p["node"] for p in document["placements"]} == {"test-node", "second-node"}
    assert all(p["accelerators"] == [0, 1] and p["exit_code"] == 0
               for p in document["placements"])  # fmt: skip
    logs = fleet.flexai("training", "logs", job_name).stdout.splitlines()
    assert "[0] rank 0 of 2 devices 0,1" in logs and "[1] rank 1 got hello rank 1" in logs
    assert "[0] rank 0 got hello rank 0" in logs

    fetched = fleet.flexai("training", "fetch", job_name, "-o", str(tmp_path / "out")).stdout
    assert "output_0.zip" in fetched and "output_1.zip" in fetched
    for rank in (0, 1):
        with zipfile.ZipFile(tmp_path / "out" / f"output_{rank}.zip") as archive:
            assert json.loads(archive.read(f"rank-{rank}.json"))["world"] == "4"


def test_a_failing_node_fails_the_whole_job_naming_it_and_ends_the_other(
    fleet: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    fleet.start_agent("second-node", 2)
    crash = ("import os, time\nif os.environ['NODE_RANK'] == '1':\n"
             "    raise SystemExit(7)\ntime.sleep(300)\n")  # fmt: skip
    repo = repo_factory({"requirements.txt": "", "train.py": crash})
    fleet.flexai("training", "run", job_name, "-u", str(repo), "-n", "2", "--", "train.py")
    document = fleet.wait_for(job_name, {"failed"})
    assert document["failure"]["code"] == "entry_point_failed"
    assert "exited with code 7" in document["failure"]["message"]
    assert "index 1" in document["failure"]["message"]
    # node 0's process is ended: its node is free for a new job soon
    quick = repo_factory({"requirements.txt": "", "train.py": "print('next')\n"})
    fleet.flexai("training", "run", f"{job_name}-next", "-u", str(quick), "-a", "2",
                 "--", "train.py")  # fmt: skip
    fleet.wait_for(f"{job_name}-next", {"succeeded"}, timeout=60)


SLEEPER = ("import sys, time\nprint('working', flush=True)\n"
           "time.sleep(float(sys.argv[1]))\n")


def test_kill_9_of_an_agent_fails_its_running_job_node_lost_within_the_lease(
    fleet: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": SLEEPER})
    fleet.flexai("training", "run", job_name, "-u", str(repo), "--", "train.py", "300")
    job_id = fleet.wait_for(job_name, {"in progress"})["id"]
    # "in progress" comes a moment before the agent starts the job's process: a kill in
    # between would leave no process for the restarted agent to end
    wait_until(lambda: any(job_id in marker for marker in marked_processes().values()))
    fleet.kill("agent")
    killed = time.monotonic()
    document = fleet.wait_for(job_name, {"failed"}, timeout=LEASE_S + 30)
    assert time.monotonic() - killed < LEASE_S + 2  # the lease, then a scheduler round
    assert document["failure"]["code"] == "node_lost"
    assert "node test-node was lost: last heard of at" in document["failure"]["message"]

    fleet.restart("agent")  # it comes back: the orphan is ended, nothing runs twice
    wait_until(lambda: "ending" in fleet.log("agent") or "ended" in fleet.log("agent"),
               timeout=30, why=lambda: "agent log:\n" + fleet.log("agent")[-6000:])  # fmt: skip
    events = [entry["event"] for entry in fleet.inspect(job_name)["history"]]
    assert events.count("Failed") == 1 and events[-1] in ("Failed", "ReportRefused")


def test_jobs_finish_while_the_server_is_down_and_their_ends_are_recorded_when_it_is_back(
    fleet: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": SLEEPER})
    fleet.flexai("training", "run", job_name, "-u", str(repo), "--", "train.py", "3")
    fleet.wait_for(job_name, {"in progress"})
    fleet.kill("server")
    time.sleep(6)  # the job ends meanwhile; its agent keeps its report
    fleet.restart("server")
    document = fleet.wait_for(job_name, {"succeeded"}, timeout=60)
    assert "working" in fleet.flexai("training", "logs", job_name).stdout
    assert [e["event"] for e in document["history"]].count("Succeeded") == 1


def test_an_agent_restarted_while_its_job_runs_adopts_it_and_reports_its_end(
    fleet: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    talk = ("import time\nfor step in range(12):\n    print('step', step, flush=True)\n"
            "    time.sleep(0.5)\n")  # fmt: skip
    repo = repo_factory({"requirements.txt": "", "train.py": talk})
    fleet.flexai("training", "run", job_name, "-u", str(repo), "--", "train.py")
    fleet.wait_for(job_name, {"in progress"})
    wait_until(lambda: "step 1" in fleet.flexai("training", "logs", job_name).stdout, timeout=30)
    fleet.kill("agent")
    fleet.restart("agent")
    document = fleet.wait_for(job_name, {"succeeded"}, timeout=90)
    logs = fleet.flexai("training", "logs", job_name).stdout
    assert all(logs.count(f"step {step}\n") == 1 for step in range(12))  # none lost or twice
    assert [e["event"] for e in document["history"]].count("Started") == 1


def test_a_job_that_ended_while_its_agent_was_down_is_reported_with_its_exit_code(
    fleet: Cluster, repo_factory: RepoFactory, job_name: str, tmp_path: Path
) -> None:
    release = tmp_path / "release"  # the job sees it (read-only, from its sandbox)
    short = (
        "import os, pathlib, time\n"
        "(pathlib.Path(os.environ['FLEXAI_OUTPUT_DIR']) / 'running').touch()\n"
        f"while not pathlib.Path({str(release)!r}).exists():\n"
        "    time.sleep(0.05)\n"
        "raise SystemExit(3)\n"
    )
    repo = repo_factory({"requirements.txt": "", "train.py": short})
    fleet.flexai("training", "run", job_name, "-u", str(repo), "--", "train.py")
    wait_until(lambda: any((fleet.root / "agent" / "jobs").glob("*/output/running")),
               timeout=60)  # fmt: skip
    fleet.kill("agent")
    release.touch()  # the job ends while its agent is down, within the node's lease
    exit_codes = fleet.root / "agent" / "jobs"
    wait_until(lambda: any(exit_codes.glob("*/exit-code")), timeout=30)  # the shim wrote it
    fleet.restart("agent")
    document = fleet.wait_for(job_name, {"failed"}, timeout=60)
    assert document["failure"] == {
        "code": "entry_point_failed", "message": "the entry point exited with code 3",
        "kind": "user",
    }  # fmt: skip


def test_an_agent_killed_during_a_build_builds_again_when_it_is_back(
    fleet: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": "print('built twice, ran once')\n"})
    fleet.flexai("training", "run", job_name, "-u", str(repo), "--", "train.py")
    document = fleet.wait_for(job_name, {"building", "in progress", "succeeded"})
    if document["status"] == "in progress":  # not in the moment before its process starts:
        job_id = document["id"]  # a kill then leaves nothing to follow, and the job fails
        wait_until(lambda: any(job_id in marker for marker in marked_processes().values())
                   or fleet.inspect(job_name)["status"] == "succeeded")  # fmt: skip
    fleet.kill("agent")
    fleet.restart("agent")
    document = fleet.wait_for(job_name, {"succeeded"}, timeout=90)
    assert [e["event"] for e in document["history"]].count("Started") == 1


def test_a_job_past_its_time_limit_fails_naming_the_limit(
    fleet: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": SLEEPER})
    fleet.flexai("training", "run", job_name, "-u", str(repo), "--time-limit", "2s",
                 "--stop-grace", "1s", "--", "train.py", "300")  # fmt: skip
    document = fleet.wait_for(job_name, {"failed"}, timeout=60)
    assert document["failure"] == {
        "code": "time_limit_exceeded",
        "message": "the job ran past its time limit of 2s; it was ended",
        "kind": "user",
    }
    assert document["spec"]["time_limit_s"] == 2


ESCAPES = """\
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
print("escapee", child.pid, flush=True)
time.sleep(600)
"""


def test_a_stop_ends_a_process_that_left_the_jobs_process_group(
    fleet: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": ESCAPES})
    fleet.flexai("training", "run", job_name, "-u", str(repo), "--stop-grace", "1s",
                 "--", "train.py")  # fmt: skip
    wait_until(lambda: "escapee" in fleet.flexai("training", "logs", job_name).stdout,
               timeout=60)  # fmt: skip
    job_id = str(fleet.inspect(job_name)["id"])
    wait_until(lambda: len(job_pids(job_id)) >= 3)  # the shim, the entry point, the escapee
    pids = job_pids(job_id)  # their pids on this host (in the sandbox, they have their own)
    fleet.flexai("training", "stop", job_name)
    fleet.wait_for(job_name, {"stopped"}, timeout=60)

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return _is_zombie(pid)

    wait_until(lambda: all(gone(pid) for pid in pids), timeout=10)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def _one_running_one_enqueued(
    fleet: Cluster, repo_factory: RepoFactory, job_name: str
) -> str:
    """A job holding both of the node's accelerators for 300 s, and ``job_name`` enqueued
    behind it; the running one's name."""
    repo = repo_factory({"requirements.txt": "", "train.py": SLEEPER})
    busy = f"{job_name}-busy"
    fleet.flexai("training", "run", busy, "-u", str(repo), "-a", "2", "--", "train.py", "300")
    fleet.wait_for(busy, {"in progress"})
    fleet.flexai("training", "run", job_name, "-u", str(repo), "--", "train.py", "1")
    fleet.wait_for(job_name, {"enqueued"})
    return busy


def test_a_waiting_job_says_why_in_list_and_inspect(
    fleet: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    busy = _one_running_one_enqueued(fleet, repo_factory, job_name)

    def explained() -> bool:
        return "REASON" in fleet.flexai("training", "list").stdout

    wait_until(explained, timeout=10)
    assert "waits for 1 accelerator: test-node has 0 of 2 free" in fleet.flexai(
        "training", "list").stdout
    listed = json.loads(fleet.flexai("training", "list", "--json").stdout)
    rows = listed["jobs"] if isinstance(listed, dict) else listed
    [waiting] = [row for row in rows if row["name"] == job_name]
    assert waiting["reason"] == (
        f"waits for 1 accelerator: test-node has 0 of 2 free (held by {busy})"
    )
    shown = fleet.flexai("training", "inspect", job_name).stdout
    assert "waiting:" in shown and "asked for: 1 accelerator(s) on each of 1 node(s)" in shown
    assert f"held by {busy} 0,1" in shown
    fleet.flexai("training", "stop", busy)
    fleet.wait_for(job_name, {"succeeded"}, timeout=60)
    assert "REASON" not in fleet.flexai("training", "list").stdout


def test_a_node_lost_under_an_enqueued_job_sends_it_elsewhere(
    fleet: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    busy = _one_running_one_enqueued(fleet, repo_factory, job_name)
    fleet.start_agent("spare-node", 1)
    fleet.kill("agent")
    try:
        document = fleet.wait_for(job_name, {"succeeded"}, timeout=LEASE_S + 60)
        events = [entry["event"] for entry in document["history"]]
        assert "Requeued" in events
        assert document["placements"][0]["node"] == "spare-node"
        assert fleet.inspect(busy)["failure"]["code"] == "node_lost"
    finally:  # the killed agent's job runs on: no test leaves it behind
        prefix = marker_prefix(fleet.root / "agent")
        signal_pids([pid for pid, marker in marked_processes().items()
                     if marker.startswith(prefix)], signal.SIGKILL)  # fmt: skip
