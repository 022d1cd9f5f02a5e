"""Faults a real fleet meets, end to end: a second agent under a live node's name, and an
artifact disk that refuses writes under a running job (each store)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.e2e.harness import FLEXAI, Cluster, start_cluster
from tests.pg import fresh_database
from tests.support import wait_until

pytestmark = pytest.mark.e2e
RepoFactory = Callable[[dict[str, str]], Path]
ME = pwd.getpwuid(os.geteuid()).pw_name


def test_a_second_agent_under_a_live_name_is_refused_and_every_job_runs_once(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str, tmp_path: Path
) -> None:
    second = subprocess.run(
        [*FLEXAI, "agent", "--server", cluster.api_url, "--accels", "1", "--name", "test-node",
         "--work-dir", str(tmp_path / "second-agent"), "--job-user", ME,
         "--token-file", str(cluster.node_token_file("test-node"))],
        env=cluster.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert second.returncode == 1
    assert "another agent holds node test-node" in second.stderr
    assert second.stderr.count("\n") == 1 and "Traceback" not in second.stderr

    repo = repo_factory({"requirements.txt": "", "train.py": "print('ran once')\n"})
    names = [f"{job_name}-{index}" for index in range(3)]
    for name in names:
        cluster.flexai("training", "run", name, "-u", str(repo), "--", "train.py")
    for name in names:
        document = cluster.wait_for(name, {"succeeded"})
        assert [entry["event"] for entry in document["history"]].count("Started") == 1
        assert cluster.flexai("training", "logs", name).stdout.count("ran once") == 1


@pytest.fixture(params=["sqlite", "postgres"])
def fragile(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """A cluster of its own (its disk is broken on purpose), whose agent waits 3 s at most
    for a finished job's logs."""
    with ExitStack() as stack:
        database_url = None
        if request.param == "postgres":
            database_url = stack.enter_context(fresh_database("flexai_e2e"))
        cluster = start_cluster(tmp_path / "fragile", database_url,
                                agent_flags=("--log-drain-timeout", "3"))  # fmt: skip
        stack.callback(cluster.stop)
        yield cluster


TALKS_UNTIL_THE_GATE = """\
import os, pathlib, time
gate = pathlib.Path(os.environ["GATE"])
step = 0
while not gate.exists() and step < 480:
    print(f"step {step}", flush=True)
    step += 1
    time.sleep(0.25)
for step in range(step, step + 4):  # and a while after: lines written once the disk broke
    print(f"step {step}", flush=True)
    time.sleep(0.25)
print("done")
"""


def test_a_job_whose_logs_cannot_be_stored_ends_anyway_and_inspect_says_why(
    fragile: Cluster, repo_factory: RepoFactory, job_name: str, tmp_path: Path
) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": TALKS_UNTIL_THE_GATE})
    gate = tmp_path / "gate"
    fragile.flexai("training", "run", job_name, "-u", str(repo), "-E", f"GATE={gate}", "--",
                   "train.py")  # fmt: skip
    fragile.wait_for(job_name, {"in progress"})
    wait_until(lambda: "step 1" in fragile.flexai("training", "logs", job_name).stdout,
               timeout=30)  # fmt: skip

    jobs_dir = fragile.root / "data" / "artifacts" / "jobs"
    removed = jobs_dir.with_name("jobs-removed")
    jobs_dir.rename(removed)  # at once: the server may be writing in it this very moment
    jobs_dir.write_text("the disk refuses writes here")  # even root cannot write under a file
    shutil.rmtree(removed, ignore_errors=True)
    gate.touch()  # the job talks on a while, then ends

    document = fragile.wait_for(job_name, {"succeeded"}, timeout=90)
    missing = document["logs_unavailable"]
    assert missing is not None and missing["offset"] < missing["written"]
    assert "job.log" in missing["message"]
    events = [entry["event"] for entry in document["history"]]
    assert events.index("LogsUnavailable") < events.index("Succeeded")
    shown = fragile.flexai("training", "inspect", job_name).stdout
    assert "logs:" in shown and "unavailable: stored up to byte" in shown
