"""Many `logs --follow` clients on one job: the server must stay quick for everyone else.

Starts a real ``flexai server`` (SQLite, a throwaway data directory), registers a node the way
an agent does and submits a job that stays quiet. Then it measures the latency of ``GET
/health``, ``GET /v1/jobs`` (list) and the agent heartbeat:

1. with no follower (the baseline, measured in the same run);
2. with N followers open on the job (default 1,000), which ship nothing;
3. with N followers while log bytes arrive for the job 20 times a second (every follower is
   woken and reads each chunk);

then closes every follower and times until the server's ``flexai_log_followers`` metric is
back to 0 (and counts the server's threads), opens N again, and times SIGTERM to exit.

The followers live in a child process of their own (``--hold N``), so the latency client does
not share an interpreter with them. Figures are printed as p50/p99 in ms and as the ratio of
each p99 to the baseline's p99; the target is p99 under 100 ms with 1,000 followers.

    .venv/bin/python -m bench.followers               # 1,000 followers, ~1 minute
    .venv/bin/python -m bench.followers --followers 200 --requests 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from common.contract import AGENT_ID_HEADER

ROOT = Path(__file__).resolve().parent.parent
AGENT_ID = "bench-agent-0123456789abcdef"
TARGET_P99_MS = 100.0
CHUNKS_PER_S = 5
"""The agent ships a chatty job's log every 0.2 s (node_agent.logs.shipper.FLUSH_INTERVAL)."""


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """A real `flexai server` process on SQLite, with a registered node and a quiet job."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = data_dir / "config.json"
        env = {**os.environ, "FLEXAI_CONFIG": str(config), "PYTHONPATH": str(ROOT)}
        self.log = (data_dir / "server.log").open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "server", "--data-dir", str(data_dir / "data"),
             "--port", str(self.port)],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not (config.exists() and self._healthy()):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"the server did not start; see {data_dir / 'server.log'}")
            time.sleep(0.1)
        self.token = json.loads(config.read_text())["token"]
        self.headers = {"Authorization": f"Bearer {self.token}"}
        self.http = httpx.Client(base_url=self.url, headers=self.headers, timeout=30)
        made = self.http.post("/v1/admin/node-tokens", json={"node": "bench-node"}).json()
        self.agent = {"Authorization": f"Bearer {made['token']}", AGENT_ID_HEADER: AGENT_ID}
        node = self.http.post("/v1/agent/nodes", headers=self.agent, json={
            "name": "bench-node", "accels": 8, "accel_type": "cpu", "agent_id": AGENT_ID,
        }).json()  # fmt: skip
        self.node_id = node["node_id"]
        job = self.http.post("/v1/jobs", json={
            "name": "quiet-job", "repository_url": "/nowhere", "entry_point": ["train.py"],
        }).json()  # fmt: skip
        self.job_id = job["id"]
        # The node's token reaches the job's log once the scheduler placed the job there.
        while not self.http.get("/v1/jobs/quiet-job").json().get("node"):
            if time.monotonic() > deadline:
                raise RuntimeError("the job was not placed on bench-node within a minute")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def requests(self) -> dict[str, Callable[[], httpx.Response]]:
        agent = self.agent
        return {
            "health": lambda: self.http.get("/health"),
            "list": lambda: self.http.get("/v1/jobs"),
            "heartbeat": lambda: self.http.post(
                f"/v1/agent/nodes/{self.node_id}/heartbeat", json={}, headers=agent
            ),
        }

    def ship_log(self, offset: int, data: bytes) -> int:
        answer = self.http.post(
            f"/v1/agent/jobs/{self.job_id}/logs", params={"offset": offset}, content=data,
            headers=self.agent,
        )  # fmt: skip
        answer.raise_for_status()
        return int(answer.json()["size"])

    def followers(self) -> int:
        for line in self.http.get("/metrics").text.splitlines():
            if line.startswith("flexai_log_followers "):
                return int(float(line.split()[1]))
        raise RuntimeError("no flexai_log_followers metric")

    def threads(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines()
                        if line.startswith("Threads:")))  # fmt: skip

    def close(self) -> None:
        self.http.close()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.log.close()


def latencies(send: Callable[[], httpx.Response], count: int) -> list[float]:
    timings = []
    for _ in range(count):
        start = time.perf_counter()
        response = send()
        timings.append(time.perf_counter() - start)
        if response.status_code >= 400:
            raise RuntimeError(f"{response.status_code}: {response.text[:300]}")
    return timings


def p(timings: list[float], percentile: int) -> float:
    ordered = sorted(timings)
    return ordered[min(len(ordered) - 1, round(percentile / 100 * (len(ordered) - 1)))] * 1000


class Holder:
    """The child process that holds the followers open."""

    def __init__(self, server: Server, count: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.followers", "--hold", str(count), "--url", server.url,
             f"--token={server.token}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        if not line.startswith("ready"):
            raise RuntimeError(f"the followers did not open: {line!r}")
        self.open_s = float(line.split()[1])

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()  # the child closes every socket and exits
        self.process.wait(timeout=60)


async def hold(count: int, url: str, token: str) -> None:
    """Open ``count`` follow streams, drain them, and close them all when stdin closes."""
    host, port = url.removeprefix("http://").split(":")
    request = (
        "GET /v1/jobs/quiet-job/logs?follow=true HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\nAuthorization: Bearer {token}\r\n\r\n"
    ).encode()

    async def open_one() -> asyncio.StreamWriter:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request)
        await writer.drain()
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(status.decode(errors="replace"))
        asyncio.get_running_loop().create_task(drain(reader))
        return writer

    async def drain(reader: asyncio.StreamReader) -> None:
        while await reader.read(65536):
            pass

    start = time.perf_counter()
    writers: list[asyncio.StreamWriter] = []
    while len(writers) < count:
        batch = min(100, count - len(writers))
        writers += await asyncio.gather(*(open_one() for _ in range(batch)))
    print(f"ready {time.perf_counter() - start:.3f}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for writer in writers:
        writer.close()


def measure(server: Server, rows: dict[str, list[float]], label: str, count: int) -> None:
    for name, send in server.requests().items():
        rows[f"{name}: {label}"] = latencies(send, count)


def report(rows: dict[str, list[float]], notes: list[str]) -> None:
    print(f"\n{'row':<36} {'p50 ms':>8} {'p99 ms':>8} {'p99 / baseline p99':>19}")
    for row, timings in rows.items():
        name = row.split(":")[0]
        baseline = p(rows[f"{name}: no follower"], 99)
        ratio = p(timings, 99) / baseline
        mark = "" if p(timings, 99) < TARGET_P99_MS else f"  over {TARGET_P99_MS:g} ms"
        print(f"{row:<36} {p(timings, 50):>8.2f} {p(timings, 99):>8.2f} {ratio:>18.2f}x{mark}")
    print()
    for note in notes:
        print(note)


def run(followers: int, count: int) -> None:
    raise_fd_limit()
    rows: dict[str, list[float]] = {}
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="flexai-bench-") as scratch:
        server = Server(Path(scratch))
        try:
            threads_before = server.threads()
            measure(server, rows, "no follower", count)
            holder = Holder(server, followers)
            notes.append(f"{followers} followers opened in {holder.open_s:.2f} s; server "
                         f"threads {threads_before} before, {server.threads()} with them")
            measure(server, rows, f"{followers} quiet followers", count)
            stop = threading.Event()

            def ship() -> None:
                offset = 0
                while not stop.wait(1 / CHUNKS_PER_S):
                    offset = server.ship_log(offset, b"step 1 loss 0.5\n" * 64)

            shipper = threading.Thread(target=ship)
            shipper.start()
            measure(server, rows, f"{followers} followers, {CHUNKS_PER_S} chunks/s", count)
            stop.set()
            shipper.join()
            start = time.perf_counter()
            holder.close()
            while server.followers():
                time.sleep(0.01)
            notes.append(f"all {followers} disconnects freed in "
                         f"{time.perf_counter() - start:.2f} s; server threads "
                         f"{server.threads()} after")  # fmt: skip
            again = Holder(server, followers)
            start = time.perf_counter()
            server.process.send_signal(signal.SIGTERM)
            code = server.process.wait(timeout=30)
            again.close()
            notes.append(f"SIGTERM with {followers} followers open: exit {code} in "
                         f"{time.perf_counter() - start:.2f} s (target: 5 s)")  # fmt: skip
        finally:
            server.close()
    report(rows, notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--followers", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=300, help="per row and request kind")
    parser.add_argument("--hold", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.hold:
        raise_fd_limit()
        asyncio.run(hold(args.hold, args.url, args.token))
        return 0
    run(args.followers, args.requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
