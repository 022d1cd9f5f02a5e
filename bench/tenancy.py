"""What many users cost: token checks per request, revocation across replicas, log masking.

1. Starts a real ``flexai server`` (SQLite, and PostgreSQL when reachable) and measures, over
   ``--requests`` rounds, p50/p99 of ``GET /health`` (no token: the baseline), ``GET
   /v1/whoami`` with a user's token (remembered after its first use), ``GET /v1/jobs`` as that
   user, and ``GET /v1/whoami`` with an unknown token (a 401: looked up every time). Each p99
   is printed as a ratio to the baseline's.
2. On PostgreSQL, two replicas on one database: a token is used on replica B (so B remembers
   it), revoked through replica A, and B is polled until it answers 401; ``--revocations``
   times (20), printed as p50/max in ms.
3. The agent's masking of secret values in shipped logs (``node_agent.logs.masking.SecretMask``,
   5 values) over ``--log-mib`` MiB (64) of log in 256 KiB chunks, against copying the same
   bytes (the baseline): MiB/s and the ratio.

    .venv/bin/python -m bench.tenancy                  # ~1 minute
    .venv/bin/python -m bench.tenancy --requests 200 --no-postgres
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import psycopg

from node_agent.logs.masking import SecretMask

ROOT = Path(__file__).resolve().parent.parent

POSTGRES = os.environ.get("FLEXAI_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def server(data_dir: Path, database_url: str | None, config: Path | None) -> Iterator[str]:
    port = free_port()
    args = [sys.executable, "-m", "cli.main", "server", "--data-dir", str(data_dir),
            "--port", str(port)]  # fmt: skip
    if database_url:
        args += ["--database-url", database_url]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if config is None:
        args.append("--no-client-config")
    else:
        env["FLEXAI_CONFIG"] = str(config)
    log = (data_dir.parent / f"{data_dir.name}.log").open("wb")
    process = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit(f"the server at {url} did not start; see {log.name}")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def timings(call: Callable[[], httpx.Response], rounds: int, expect: int) -> tuple[float, float]:
    figures = []
    for _ in range(rounds):
        started = time.perf_counter()
        response = call()
        figures.append((time.perf_counter() - started) * 1000)
        assert response.status_code == expect, response.text
    figures.sort()
    return statistics.median(figures), figures[int(len(figures) * 0.99) - 1]


def requests_on(label: str, url: str, admin: str, rounds: int) -> None:
    client = httpx.Client(base_url=url, timeout=30)
    as_admin = {"Authorization": f"Bearer {admin}"}
    made = client.post("/v1/admin/users", headers=as_admin, json={"name": "bench"}).json()
    user = {"Authorization": f"Bearer {made['token']['token']}"}
    unknown = {"Authorization": f"Bearer {secrets.token_urlsafe(32)}"}
    client.get("/v1/whoami", headers=user)  # remembered from now on
    rows = [
        ("GET /health (baseline)", lambda: client.get("/health"), 200),
        ("GET /v1/whoami, user token", lambda: client.get("/v1/whoami", headers=user), 200),
        ("GET /v1/jobs, user token", lambda: client.get("/v1/jobs", headers=user), 200),
        ("GET /v1/whoami, unknown token", lambda: client.get("/v1/whoami", headers=unknown), 401),
    ]
    print(f"\n{label}: {rounds} requests each")
    base = None
    for name, call, expect in rows:
        p50, p99 = timings(call, rounds, expect)
        base = base or p99
        print(f"  {name:32} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  p99/baseline {p99 / base:5.2f}x")


def revocations(root: Path, database_url: str, times: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        one = stack.enter_context(server(root / "a", database_url, root / "config.json"))
        two = stack.enter_context(server(root / "b", database_url, None))
        token = json.loads((root / "config.json").read_text())["token"]
        admin = {"Authorization": f"Bearer {token}"}
        client = httpx.Client(timeout=30)
        figures = []
        for index in range(times):
            made = client.post(one + "/v1/admin/users", headers=admin,
                               json={"name": f"gone-{index}"}).json()["token"]  # fmt: skip
            token = {"Authorization": f"Bearer {made['token']}"}
            assert client.get(two + "/v1/whoami", headers=token).status_code == 200
            client.delete(f"{one}/v1/tokens/{made['token_id']}", headers=admin).raise_for_status()
            started = time.perf_counter()
            while client.get(two + "/v1/whoami", headers=token).status_code != 401:
                if time.perf_counter() - started > 10:
                    raise SystemExit("replica b still accepts a token revoked 10 s ago")
            figures.append((time.perf_counter() - started) * 1000)
    print(f"\nrevoked on replica a, refused by replica b (which remembered it) after: "
          f"p50 {statistics.median(figures):.1f} ms, max {max(figures):.1f} ms ({times} tokens)")


def masking(mib: int) -> None:
    values = [secrets.token_urlsafe(24) for _ in range(5)]
    line = b"step 1234 loss 0.4321 lr 0.0003 tokens/s 91234 " * 2 + b"\n"
    chunk = (line * (256 * 1024 // len(line) + 1))[: 256 * 1024]
    chunk = chunk[:1000] + values[0].encode() + chunk[1000 + len(values[0]) :]
    chunks = mib * 4

    def copy() -> None:
        sink = bytearray()
        for _ in range(chunks):
            sink += bytes(chunk)

    def mask() -> None:
        masker = SecretMask(values)
        for _ in range(chunks):
            masker.feed(chunk)
        masker.feed(b"", final=True)

    rates = {}
    for name, run in (("copy (baseline)", copy), ("mask 5 secrets", mask)):
        started = time.perf_counter()
        run()
        rates[name] = mib / (time.perf_counter() - started)
    base = rates["copy (baseline)"]
    print(f"\nshipped-log masking over {mib} MiB in 256 KiB chunks:")
    for name, rate in rates.items():
        print(f"  {name:18} {rate:9.1f} MiB/s  {rate / base:5.2f}x of the baseline")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--revocations", type=int, default=20)
    parser.add_argument("--log-mib", type=int, default=64)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="flexai-bench-") as scratch:
        root = Path(scratch)
        with server(root / "sqlite", None, root / "sqlite.json") as url:
            admin = json.loads((root / "sqlite.json").read_text())["token"]
            requests_on("SQLite", url, admin, args.requests)
        if not args.no_postgres:
            database = f"flexai_bench_{os.getpid()}"
            with psycopg.connect(POSTGRES, autocommit=True) as connection:
                connection.execute(f"CREATE DATABASE {database}")
            url_of = POSTGRES.rsplit("/", 1)[0] + "/" + database
            try:
                with server(root / "pg", url_of, root / "pg.json") as url:
                    admin = json.loads((root / "pg.json").read_text())["token"]
                    requests_on("PostgreSQL", url, admin, args.requests)
                revocations(root / "replicas", url_of, args.revocations)
            finally:
                with psycopg.connect(POSTGRES, autocommit=True) as connection:
                    connection.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    masking(args.log_mib)


if __name__ == "__main__":
    main()
