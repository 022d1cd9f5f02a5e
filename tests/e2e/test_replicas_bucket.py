"""Two `flexai server` replicas with different data directories on one PostgreSQL and one S3
bucket (SeaweedFS): a job run through replica A is fetched, its whole log read and its
checkpoints listed through replica B. No disk is shared; every byte of the job is in the
bucket or the database. Then, through the CLI, `admin verify` finds the store whole, and once
the job is deleted and purged, fetching it by id says when its artifacts were purged."""

from __future__ import annotations

import json
import os
import pwd
import zipfile
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.e2e.harness import ROOT, Cluster, _start, _wait, free_port
from tests.e2e.test_replicas import Replica, _postgres_absent
from tests.pg import fresh_database
from tests.s3 import REGION, SeaweedFS
from tests.support import make_repo

pytestmark = pytest.mark.e2e

TRAIN = """\
import os, pathlib
checkpoints = pathlib.Path(os.environ["FLEXAI_OUTPUT_CHECKPOINT_DIR"])
(checkpoints / ".partial").mkdir()
(checkpoints / ".partial" / "trainer_state.json").write_text('{"global_step": 2}')
(checkpoints / ".partial").rename(checkpoints / "checkpoint-2")
for step in range(200):
    print(f"step {step} loss {1 / (step + 1):.4f}", flush=True)
(pathlib.Path(os.environ["FLEXAI_OUTPUT_DIR"]) / "model.bin").write_bytes(b"w" * 100_000)
print("the last line", flush=True)
"""


@pytest.fixture
def replicas(tmp_path: Path, s3_server: SeaweedFS) -> Iterator[tuple[Replica, Replica]]:
    absent = _postgres_absent()
    if absent:
        pytest.skip(absent)
    root = tmp_path / "replicas"
    (root / "wheels").mkdir(parents=True)
    with ExitStack() as stack:
        database_url = stack.enter_context(fresh_database("flexai_replicas"))
        s3_server.start()
        bucket = stack.enter_context(s3_server.bucket())
        env = {
            **os.environ, "FLEXAI_CONFIG": str(root / "config.json"), "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(root / "wheels"),
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        }  # fmt: skip
        env.pop("FLEXAI_API_URL", None)
        env.pop("FLEXAI_TOKEN", None)
        cluster = Cluster(root=root, api_url="", env=env, token="")
        stack.callback(cluster.stop)
        replicas = []
        for part in ("server-a", "server-b"):
            port = free_port()
            args = ["server", "--data-dir", str(root / part), "--port", str(port),
                    "--database-url", database_url, "--artifact-store", f"s3://{bucket}/fleet",
                    "--s3-endpoint-url", s3_server.endpoint_url, "--s3-region", REGION]  # fmt: skip
            if part == "server-b":
                args.append("--no-client-config")  # the client config names server a
            _start(cluster, part, args, {**env, **s3_server.env()})
            replica = Replica(cluster, part, f"http://127.0.0.1:{port}")
            stack.callback(replica.client.close)
            _wait(replica.ready, f"{part} start", cluster)
            replicas.append(replica)
        cluster.token = json.loads((root / "config.json").read_text())["token"]
        cluster.api_url = replicas[0].url
        yield replicas[0], replicas[1]


def through(replica: Replica, *args: str, check: bool = True) -> tuple[int, str, str]:
    """`flexai ARGS` against one replica; its exit code, stdout and stderr."""
    cluster = replica.cluster
    saved = cluster.env
    cluster.env = {**saved, "FLEXAI_API_URL": replica.url, "FLEXAI_TOKEN": cluster.token}
    try:
        result = cluster.flexai(*args, check=check)
    finally:
        cluster.env = saved
    return result.returncode, result.stdout, result.stderr


def test_a_job_run_through_one_replica_is_read_whole_through_another_with_no_shared_disk(
    replicas: tuple[Replica, Replica], tmp_path: Path
) -> None:
    a, b = replicas
    cluster = a.cluster
    _start(cluster, "agent", ["agent", "--server", a.url, "--accels", "1", "--name", "node-a",
                              "--work-dir", str(cluster.root / "agent"),
                              "--job-user", pwd.getpwuid(os.geteuid()).pw_name,
                              "--token-file", str(cluster.node_token_file("node-a")),
                              "--address", "127.0.0.1"], cluster.env)  # fmt: skip
    repo = make_repo(tmp_path / "repo", {"train.py": TRAIN, "requirements.txt": ""})
    through(a, "training", "run", "trained", "-u", str(repo), "--", "train.py")
    b.wait_for("trained", "succeeded", timeout=120)

    _, log_b, _ = through(b, "training", "logs", "trained")
    _, log_a, _ = through(a, "training", "logs", "trained")
    assert log_b == log_a
    assert log_b.endswith("step 199 loss 0.0050\nthe last line\n"
                          "[agent] the entry point exited with code 0\n")  # the log's own end
    _, listed, _ = through(b, "training", "checkpoints", "trained", "--json")
    [checkpoint] = json.loads(listed)["checkpoints"]
    assert (checkpoint["name"], checkpoint["step"]) == ("checkpoint-2", 2)
    through(b, "training", "fetch", "trained", "-o", str(tmp_path / "fetched"))
    with zipfile.ZipFile(tmp_path / "fetched" / "output_0.zip") as archive:
        assert archive.read("model.bin") == b"w" * 100_000
    job_id = b.api("GET", "/v1/jobs/trained").json()["id"]
    for data_dir in (cluster.root / "server-a", cluster.root / "server-b"):
        held = [path for path in data_dir.rglob("*") if job_id in str(path)]
        assert held == [] and not (data_dir / "artifacts").exists()

    code, said, _ = through(b, "admin", "verify", "--artifacts", "deep")
    assert code == 0 and "artifacts: 2 the ledger names" in said
    through(a, "training", "delete", "trained")
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    _, said, _ = through(b, "admin", "purge", "--deleted-before", tomorrow)
    assert f"purged admin/trained ({job_id}" in said and "1 job(s)" in said
    code, _, refused = through(a, "training", "fetch", "--id", job_id, "-o", str(tmp_path),
                               check=False)  # fmt: skip
    assert code == 1 and "were purged on" in refused and len(refused.strip().splitlines()) == 1
