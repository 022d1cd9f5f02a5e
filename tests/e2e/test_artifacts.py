"""A job's checkpoint and output end to end, on each artifact store (files under the server's
data directory, an S3 bucket on SeaweedFS) and each database: uploaded by the agent in parts,
recorded with their size and SHA-256, listed by `checkpoints`, fetched and checked by `fetch`;
and, on S3, nothing lost while the bucket is away or the agent is killed mid-upload."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import time
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from cli.output.formats import format_size
from tests.e2e.harness import Cluster, start_cluster
from tests.pg import fresh_database
from tests.s3 import REGION, SeaweedFS
from tests.support import wait_until

pytestmark = pytest.mark.e2e
RepoFactory = Callable[[dict[str, str]], Path]
WEIGHTS = 40 * 2**20 + 123
"""An output file over one part (32 MiB): it goes in two."""

TRAIN = f"""\
import json, os, pathlib, random, time
out = pathlib.Path(os.environ["FLEXAI_OUTPUT_DIR"])
checkpoints = pathlib.Path(os.environ["FLEXAI_OUTPUT_CHECKPOINT_DIR"])
rng = random.Random(15)
partial = checkpoints / ".partial"
partial.mkdir()
(partial / "trainer_state.json").write_text(
    json.dumps({{"global_step": 3, "log_history": [{{"step": 3, "loss": 0.25}}]}}))
(partial / "model.safetensors").write_bytes(rng.randbytes(3 * 2**20))
partial.rename(checkpoints / "checkpoint-3")
gate = os.environ.get("GATE")
while gate and not pathlib.Path(gate).exists():
    time.sleep(0.1)
(out / "weights.bin").write_bytes(rng.randbytes({WEIGHTS}))
(out / "notes.txt").write_text("trained for one epoch\\n" * 1000)
print("training finished", flush=True)
"""


def expected_weights() -> bytes:
    rng = random.Random(15)
    rng.randbytes(3 * 2**20)
    return rng.randbytes(WEIGHTS)


STORES = [("sqlite", "local"), ("postgres", "local"), ("sqlite", "s3"), ("postgres", "s3")]
ON_S3 = pytest.mark.parametrize("cluster", STORES[2:], ids=["-".join(p) for p in STORES[2:]],
                                indirect=True)  # fmt: skip
"""The bucket's outage is an S3 store's."""


@pytest.fixture(scope="module", params=STORES, ids=["-".join(p) for p in STORES])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:  # fmt: skip
    database, store = request.param
    with ExitStack() as stack:
        database_url = None
        if database == "postgres":
            database_url = stack.enter_context(fresh_database("flexai_e2e"))
        flags: tuple[str, ...] = ()
        env: dict[str, str] = {}
        if store == "s3":
            server: SeaweedFS = request.getfixturevalue("s3_server")
            server.start()
            bucket = stack.enter_context(server.bucket())
            flags = ("--artifact-store", f"s3://{bucket}/e2e", "--s3-endpoint-url",
                     server.endpoint_url, "--s3-region", REGION)  # fmt: skip
            env = server.env()
        root = tmp_path_factory.mktemp(f"artifacts-{database}-{store}")
        cluster = start_cluster(root, database_url, server_flags=flags, server_env=env)
        stack.callback(cluster.stop)
        yield cluster


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(2**20):
            digest.update(chunk)
    return digest.hexdigest()


def run(cluster: Cluster, repo_factory: RepoFactory, name: str, *env: str) -> None:
    repo = repo_factory({"requirements.txt": "", "train.py": TRAIN})
    flags = [flag for pair in (("-E", item) for item in env) for flag in pair]
    cluster.flexai("training", "run", name, "-u", str(repo), *flags, "--", "train.py")


def fetched_and_checked(cluster: Cluster, name: str, where: Path) -> dict[str, Any]:
    """`fetch` the job's output into ``where``; the ledger's record of it, which it matched."""
    said = cluster.flexai("training", "fetch", name, "-o", str(where)).stdout
    recorded = cluster.inspect(name)["outputs"][0]
    assert recorded["sha256"] in said
    assert sha256_of(where / "output_0.zip") == recorded["sha256"]
    assert (where / "output_0.zip").stat().st_size == recorded["size"]
    return dict(recorded)


def test_a_jobs_checkpoint_and_output_are_recorded_with_their_hash_and_fetched_whole(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str, tmp_path: Path
) -> None:
    run(cluster, repo_factory, job_name)
    cluster.wait_for(job_name, {"succeeded"}, timeout=180)

    listed = json.loads(cluster.flexai("training", "checkpoints", job_name, "--json").stdout)
    [checkpoint] = listed["checkpoints"] if isinstance(listed, dict) else listed
    assert (checkpoint["name"], checkpoint["step"], checkpoint["train_loss"]) == (
        "checkpoint-3", 3, 0.25)  # fmt: skip
    assert checkpoint["archive_size"] > 3 * 2**20 and len(checkpoint["sha256"]) == 64
    fetched_and_checked(cluster, job_name, tmp_path)
    with zipfile.ZipFile(tmp_path / "output_0.zip") as archive:
        assert archive.read("weights.bin") == expected_weights()
        methods = {info.filename: info.compress_type for info in archive.infolist()}
    assert methods == {"weights.bin": zipfile.ZIP_STORED, "notes.txt": zipfile.ZIP_DEFLATED}
    shown = cluster.flexai("training", "inspect", job_name).stdout
    recorded = cluster.inspect(job_name)["outputs"][0]
    assert f"output_0.zip: {format_size(recorded['size'])}, SHA-256 {recorded['sha256']}" in shown


@ON_S3
def test_a_job_whose_bucket_is_away_waits_and_ends_with_nothing_lost_once_it_is_back(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str, tmp_path: Path,
    s3_server: SeaweedFS,
) -> None:  # fmt: skip
    s3 = s3_server
    before = f"{job_name}-before"
    run(cluster, repo_factory, before)
    cluster.wait_for(before, {"succeeded"}, timeout=180)
    gate = tmp_path / "gate"
    run(cluster, repo_factory, job_name, f"GATE={gate}")
    wait_until(lambda: "checkpoint-3" in cluster.flexai("training", "checkpoints",
                                                        job_name).stdout, timeout=120)

    def fetch_before() -> tuple[subprocess.CompletedProcess[str], float]:
        started = time.monotonic()
        said = cluster.flexai("training", "fetch", before, "-o", str(tmp_path), check=False)
        return said, time.monotonic() - started

    with s3.stopped(), ThreadPoolExecutor(1) as pool:
        gate.touch()  # the entry point writes its output and ends
        # `fetch` keeps trying for a while before it says the store is away: it does so while
        # the agent, meanwhile, tries its parts for a while before it says it waits.
        fetching = pool.submit(fetch_before)
        waits = f"job {cluster.inspect(job_name)['id']}: output_0.zip waits for the artifact"
        wait_until(lambda: waits in cluster.log("agent"), timeout=120)
        assert cluster.inspect(job_name)["status"] == "in progress"
        refused, took = fetching.result(timeout=150)
        assert refused.returncode == 1 and took < 30
        assert "storage-unavailable" in refused.stderr and "Traceback" not in refused.stderr
        assert not (tmp_path / "output_0.zip").exists()
        assert cluster.inspect(job_name)["status"] == "in progress"

    cluster.wait_for(job_name, {"succeeded"}, timeout=180)
    fetched_and_checked(cluster, job_name, tmp_path)
    with zipfile.ZipFile(tmp_path / "output_0.zip") as archive:
        assert archive.read("weights.bin") == expected_weights()


@ON_S3
def test_an_agent_killed_mid_upload_uploads_again_once_restarted_and_the_output_is_whole(
    cluster: Cluster, repo_factory: RepoFactory, job_name: str, tmp_path: Path,
    s3_server: SeaweedFS,
) -> None:  # fmt: skip
    s3 = s3_server
    gate = tmp_path / "gate"
    run(cluster, repo_factory, job_name, f"GATE={gate}")
    wait_until(lambda: "checkpoint-3" in cluster.flexai("training", "checkpoints",
                                                        job_name).stdout, timeout=120)
    job_id = cluster.inspect(job_name)["id"]
    waits = f"job {job_id}: output_0.zip waits for the artifact store"  # this job's, no other's
    with s3.stopped():  # the upload begins, and its parts wait for the bucket
        gate.touch()
        wait_until(lambda: waits in cluster.log("agent"), timeout=120)
        cluster.kill("agent")
    cluster.restart("agent")

    cluster.wait_for(job_name, {"succeeded"}, timeout=180)
    recorded = fetched_and_checked(cluster, job_name, tmp_path)
    with zipfile.ZipFile(tmp_path / "output_0.zip") as archive:
        assert archive.read("weights.bin") == expected_weights()
    events = cluster.api("GET", f"/v1/audit/jobs/{cluster.inspect(job_name)['id']}").json()
    outputs = [e["facts"] for e in events["events"] if e["type"] == "OutputsRecorded"]
    assert [fact["sha256"] for fact in outputs] == [recorded["sha256"]]
