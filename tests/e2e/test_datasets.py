"""Datasets end to end: pushed with the CLI, read-only in jobs on the node, downloaded once per
node, each job pinned to the version it was submitted with, and a dataset never pushed failing
the build with what to do (real server and agent processes, each store)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.e2e.harness import Cluster, start_cluster
from tests.pg import fresh_database
from tests.support import can_run_jobs_as, python_for_user, world_readable_directory

pytestmark = pytest.mark.e2e
RepoFactory = Callable[[dict[str, str]], Path]

READER = """\
import os, pathlib, sys
here = pathlib.Path(os.environ["FLEXAI_INPUT_DIR"]) / sys.argv[1]
print("read", (here / "rows.csv").read_text().strip(), (here / "sub" / "more.txt").read_text())
for target in (here / "new.txt", here / "rows.csv"):
    try:
        with open(target, "a") as sink:
            sink.write("x")
        print("wrote", target.name)
    except OSError as error:
        print("refused", target.name, "EROFS" if error.errno == 30 else type(error).__name__)
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:  # fmt: skip
    """Jobs run as nobody when the tests run as root (root may write anywhere, so only another
    user shows that a dataset is read-only), else as the tests' own user."""
    with ExitStack() as stack:
        database_url = None
        if request.param == "postgres":
            database_url = stack.enter_context(fresh_database("flexai_e2e"))
        job_user = job_python = None
        root = tmp_path_factory.mktemp(f"datasets-{request.param}")
        if os.geteuid() == 0:
            job_python = python_for_user("nobody") if not can_run_jobs_as("nobody") else None
            if job_python is None:
                pytest.skip("as root, jobs must run as nobody here, and nobody has no Python")
            job_user = "nobody"
            root = stack.enter_context(world_readable_directory()) / "cluster"
        cluster = start_cluster(root, database_url, job_user=job_user, job_python=job_python)
        stack.callback(cluster.stop)
        yield cluster


def push(cluster: Cluster, name: str, source: Path) -> tuple[str, str]:
    """Push ``source`` as ``name``; what the CLI said and the hash it showed."""
    said = cluster.flexai("dataset", "push", name, str(source)).stdout
    found = re.search(r"^sha256 ([0-9a-f]{64})$", said, re.MULTILINE)
    assert found, said
    return said, found.group(1)


def rows(directory: Path, text: str) -> Path:
    (directory / "sub").mkdir(parents=True, exist_ok=True)
    (directory / "rows.csv").write_text(text)
    (directory / "sub" / "more.txt").write_text("more")
    return directory


def run_reader(cluster: Cluster, repo: Path, job: str, dataset: str) -> str:
    cluster.flexai("training", "run", job, "-u", str(repo), "-D", dataset,
                   "--", "train.py", dataset)  # fmt: skip
    cluster.wait_for(job, {"succeeded"})
    return cluster.flexai("training", "logs", job).stdout


def test_a_pushed_dataset_is_read_only_in_jobs_cached_on_the_node_and_pinned_per_job(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str, tmp_path: Path
) -> None:
    dataset = f"rows-{job_name}"
    said, first = push(cluster, dataset, rows(tmp_path / "v1", "a,b"))
    assert f"Pushed dataset {dataset} version 1: 2 files" in said
    listed = cluster.flexai("dataset", "list").stdout
    assert any(line.split()[0] == dataset and first[:12] in line for line in listed.splitlines())
    repo = repo_factory({"requirements.txt": "", "train.py": READER})

    logs = run_reader(cluster, repo, f"{job_name}-a", dataset)
    assert "read a,b more" in logs
    # read-only: a read-only mount in the job's sandbox, else the files' and folders' modes
    assert "refused new.txt EROFS" in logs or "refused new.txt PermissionError" in logs
    assert "refused rows.csv EROFS" in logs or "refused rows.csv PermissionError" in logs
    downloaded = f"[build] dataset {dataset}: version {first[:12]} downloaded into this node's"
    assert f"{downloaded} cache" in logs

    again = run_reader(cluster, repo, f"{job_name}-b", dataset)
    cached = [line for line in again.splitlines() if f"dataset {dataset}" in line]
    assert cached == [f"[build] dataset {dataset}: version {first[:12]} from this node's cache"]
    assert "read a,b more" in again

    said, second = push(cluster, dataset, rows(tmp_path / "v2", "c,d"))
    assert "version 2" in said and second != first
    newer = run_reader(cluster, repo, f"{job_name}-c", dataset)
    assert "read c,d more" in newer

    older = json.loads(cluster.flexai("training", "inspect", f"{job_name}-a", "--json").stdout)
    assert older["spec"]["dataset_hashes"] == {dataset: first}
    shown = cluster.flexai("training", "inspect", f"{job_name}-a").stdout
    assert f"{dataset} @ {first[:12]}" in shown
    assert cluster.inspect(f"{job_name}-c")["spec"]["dataset_hashes"] == {dataset: second}
    versions = json.loads(cluster.flexai("dataset", "inspect", dataset, "--json").stdout)
    assert [version["content_hash"] for version in versions["versions"]] == [second, first]


def test_a_job_naming_a_dataset_never_pushed_fails_its_build_saying_how_to_push_it(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str
) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": READER})
    missing = f"never-{job_name}"
    cluster.flexai("training", "run", job_name, "-u", str(repo), "-D", missing,
                   "--", "train.py", missing)  # fmt: skip
    failed = cluster.wait_for(job_name, {"failed"})
    assert failed["failure"]["code"] == "dataset_not_found"
    assert f"flexai dataset push {missing} PATH" in failed["failure"]["message"]
    assert f"'{missing}'" in cluster.flexai("training", "inspect", job_name).stdout
