"""Trivial jobs are quick: the agent takes a job as soon as it is assigned (no poll delay), and
a job whose requirements were built before says its environment came from the cache."""

from __future__ import annotations

import time
import zipfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.e2e.harness import Cluster, start_cluster
from tests.pg import fresh_database
from tests.support import make_repo

pytestmark = pytest.mark.e2e
POLL_INTERVAL_S = 20.0
"""An agent that slept this long between polls would rarely start three jobs within 5 s each."""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def slow_polling_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp(f"quick-{request.param}")
    with ExitStack() as stack:
        database_url = None
        if request.param == "postgres":
            database_url = stack.enter_context(fresh_database("flexai_quick"))
        cluster = start_cluster(
            root, database_url, agent_flags=("--poll-interval", str(POLL_INTERVAL_S))
        )
        stack.callback(cluster.stop)
        yield cluster


def test_jobs_start_at_once_and_the_second_environment_is_cached(
    slow_polling_cluster: Cluster, tmp_path: Path
) -> None:
    cluster = slow_polling_cluster
    repo = make_repo(tmp_path / "repo", {"train.py": "pass\n", "requirements.txt": ""})
    took = []
    for index in range(3):
        name = f"quick-{index}-{tmp_path.name[-6:]}"
        cluster.flexai("training", "run", name, "-u", str(repo), "--", "train.py")
        started = time.monotonic()
        cluster.wait_for(name, {"succeeded"}, timeout=60)
        took.append(time.monotonic() - started)
        logs = cluster.flexai("training", "logs", name).stdout
        said = [line for line in logs.splitlines() if line.startswith("[build] environment:")]
        assert len(said) == 1 if index else len(said) == 2, logs
        if index:
            assert said[0].startswith("[build] environment: cached (key "), logs
    assert max(took) < 5, took  # far from the 20 s an agent sleeping between polls waits
    # The agent uploads no empty output directory; fetching it gives the empty archive.
    cluster.flexai("training", "fetch", name, cwd=tmp_path)
    with zipfile.ZipFile(tmp_path / "output_0.zip") as archive:
        assert archive.namelist() == []
