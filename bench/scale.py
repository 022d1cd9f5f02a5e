"""The ledger at production scale: submissions through the API, projection lag, view rebuilds.

    .venv/bin/python -m bench.scale [--store postgres|sqlite|both] [--submissions N]
                                    [--clients C] [--rate EVENTS_PER_S] [--seconds S]
                                    [--rebuild-jobs N]

Each figure is printed next to a baseline measured in the same run on the same database, and
the ratio is the number to watch (the machines are shared and noisy):

1. submit: N ``POST /v1/jobs`` (default 800) from C client threads (default 8) to a real
   ``flexai server`` process, in jobs/s; baseline: a raw psycopg (or sqlite3) loop on one
   connection that inserts and commits one row per submission into a scratch table of the same
   database. Target on PostgreSQL: at least 0.5 x the baseline. Beside it (unless
   ``--no-slurm``): Slurm's ``sbatch --wrap true`` from as many threads (``bench/slurm.py``;
   target: at least 3 x), and the CPU one submission cost the server, the database and the
   clients, with the rate the machine's cores allow at that cost. Then as many ``GET /health``
   from the same clients, next to the same baseline: the ceiling that the HTTP stack (uvicorn,
   Starlette, httpx) puts on any route of this server, before the route does anything.
2. lag: a steady stream of events (default 500/s for 10 s: job submissions, two events each,
   from ``--writers`` writer processes, 2 by default, each an application of its own) while
   this process's projector (another replica: on PostgreSQL it follows by LISTEN/NOTIFY, on
   SQLite by its poll) applies them; the lag of each event is the time from its commit to the
   views holding it. p50 and p99; target p99 <= 50 ms. The rate actually reached is printed.
3. rebuild: the views of N jobs (default 2,000; 9 events each) rebuilt from the ledger with
   ``Rebuilder`` (shadow tables, then the swap); baseline: the rows it writes inserted raw in
   batches of 200 into empty tables of the views' schema (``bench/rebuild.py``). Target: at
   least 0.3 x.

PostgreSQL is ``FLEXAI_TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/
postgres``); each step uses a throwaway database.
"""

from __future__ import annotations

import argparse
import bisect
import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from api.settings import Settings
from bench.probes import cpu_seconds, postgres_pids
from bench.rebuild import bench_rebuild, store_url
from bench.rebuild import report as rebuild_report
from bench.slurm import SlurmUnavailable, sbatch_rate
from domain.actors import user
from domain.application import TrainingJobs
from ledger.database import (
    LEDGER_CHANNEL,
    LedgerListener,
    PostgresDatabase,
    open_database,
)
from ledger.group_commit import PostgresGroupCommit
from ledger.schema import schema_lock
from projections.projector import Projector

ROOT = Path(__file__).resolve().parents[1]

SPEC = {"repository_url": "https://example.com/org/repo.git", "entry_point": ["train.py"],
        "accels": 1, "nodes": 1}  # fmt: skip
PAYLOAD = json.dumps({**SPEC, "name": "x" * 20}).encode()


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- 1. submissions through the API ----------------------------------------------------------


@contextmanager
def server(url: str, root: Path) -> Iterator[tuple[str, str, int]]:
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "FLEXAI_CONFIG": str(root / "config.json"), "PYTHONPATH": str(ROOT)}
    env.pop("FLEXAI_TOKEN", None)
    args = [sys.executable, "-m", "cli.main", "server", "--data-dir", str(root / "data"),
            "--port", str(port), "--scheduling-patience", "3600"]  # fmt: skip
    if not url.startswith("sqlite:///"):
        args += ["--database-url", url]
    log = (root / "server.log").open("wb")
    process = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/health").status_code == 200 and (
                    root / "config.json"
                ).exists():
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"the server did not start; see {root / 'server.log'}")
            time.sleep(0.1)
        token = json.loads((root / "config.json").read_text())["token"]
        yield base, token, process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)


def bench_submit(
    store: str, root: Path, count: int, clients: int
) -> tuple[float, float, dict[str, float], float]:
    """Jobs/s through the API, the raw one-row-per-commit loop's rows/s, the CPU time one
    submission cost the server, the database and the clients (ms), and the rate of as many
    ``GET /health`` from the same clients: what the HTTP stack alone allows."""
    with store_url(store, root, "bench_submit") as url, \
            server(url, root) as (base, token, server_pid):  # fmt: skip
        headers = {"Authorization": f"Bearer {token}"}

        def submit(http: httpx.Client, index: int) -> httpx.Response:
            return http.post("/v1/jobs", json={**SPEC, "name": f"s-{index}"})

        database = postgres_pids() if store == "postgres" else []
        before = (cpu_seconds(server_pid), sum(map(cpu_seconds, database)), time.process_time())
        ours = drive(base, headers, clients, count, submit, 201)
        after = (cpu_seconds(server_pid), sum(map(cpu_seconds, database)), time.process_time())
        cpu = {part: (end - start) * 1000 / count for part, start, end in
               zip(("server", "database", "clients"), before, after, strict=True)}  # fmt: skip
        health = drive(base, headers, clients, count, lambda http, _: http.get("/health"), 200)
        baseline = raw_commits(url, count)
    return ours, baseline, cpu, health


def drive(base: str, headers: dict[str, str], clients: int, count: int,
          call: Callable[[httpx.Client, int], httpx.Response], status: int) -> float:  # fmt: skip
    """``count`` calls from ``clients`` threads, each with a connection of its own; calls/s."""
    indexes = iter(range(count))
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
            while True:
                with lock:
                    index = next(indexes, None)
                if index is None:
                    return
                answer = call(http, index)
                if answer.status_code != status:
                    raise RuntimeError(f"{answer.status_code} {answer.text}")

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client) for _ in range(clients)]:
            future.result()
    return count / (time.perf_counter() - started)


def raw_commits(url: str, count: int) -> float:
    """One row inserted and committed per submission, on one connection."""
    if url.startswith("sqlite:///"):
        connection = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("CREATE TABLE IF NOT EXISTS bench_raw (id INTEGER PRIMARY KEY, "
                           "body BLOB)")  # fmt: skip
        started = time.perf_counter()
        for _ in range(count):
            connection.execute("BEGIN")
            connection.execute("INSERT INTO bench_raw (body) VALUES (?)", (PAYLOAD,))
            connection.execute("COMMIT")
        elapsed = time.perf_counter() - started
        connection.close()
        return count / elapsed
    import psycopg

    with psycopg.connect(url) as pg:
        pg.execute("CREATE TABLE IF NOT EXISTS bench_raw (id bigserial PRIMARY KEY, "
                   "body bytea)")  # fmt: skip
        pg.commit()
        started = time.perf_counter()
        for _ in range(count):
            pg.execute("INSERT INTO bench_raw (body) VALUES (%s)", (PAYLOAD,))
            pg.commit()
        return count / (time.perf_counter() - started)


# -- 2. projection lag -----------------------------------------------------------------------


def bench_lag(
    store: str, root: Path, rate: float, seconds: float, writers: int = 2
) -> tuple[float, float, float]:
    """p50 and p99 lag in seconds, and the events/s reached.

    The writers are processes of their own (another replica's requests, which share neither
    this process's interpreter nor its connections); each submission's commit is timed there
    on the machine's monotonic clock, which this process reads too."""
    with store_url(store, root, "bench_lag") as url:
        settings = Settings(data_dir=root / "lag", database_url=url)
        reader = TrainingJobs(env=settings.event_store_env())
        database = open_database(url)
        projector = Projector(reader, database)
        applied: list[tuple[int, float]] = []

        def seen(events: Any) -> None:
            applied.append((projector.heard, time.perf_counter()))  # the last of these events

        projector.listeners.append(seen)
        if database.dialect == "postgres":
            assert isinstance(database, PostgresDatabase)
            projector.follow_by(LedgerListener(database.dedicated_connection), poll_s=1.0)
            projector.start()
        else:
            projector.start(interval=0.01)
        context = multiprocessing.get_context("spawn")
        ready, go, results = context.Barrier(writers + 1), context.Event(), context.Queue()
        processes = [context.Process(target=_write_lag, args=(
            url, root / "lag", index, rate / writers, seconds, ready, go, results,
        )) for index in range(writers)]  # fmt: skip
        for process in processes:
            process.start()
        ready.wait(timeout=120)
        began = time.perf_counter()
        go.set()
        committed = dict(pair for _ in processes for pair in results.get(timeout=300))
        for process in processes:
            process.join()
        reached = 2 * len(committed) / (time.perf_counter() - began)
        last = max(committed)
        deadline = time.monotonic() + 30
        while projector.position() < last and time.monotonic() < deadline:
            time.sleep(0.01)
        projector.stop()
        reader.close()
        database.close()
    marks = [position for position, _ in applied]
    lags = []
    for position, at in committed.items():
        index = bisect.bisect_left(marks, position)
        if index < len(applied):
            lags.append(max(0.0, applied[index][1] - at))
    lags.sort()
    return lags[len(lags) // 2], lags[min(len(lags) - 1, int(len(lags) * 0.99))], reached


def _write_lag(
    url: str, data_dir: Path, index: int, rate: float, seconds: float, ready: Any, go: Any,
    results: Any,
) -> None:  # fmt: skip
    """One writer process: submissions (two events each) at ``rate`` events/s for ``seconds``,
    from ``go`` on; puts the last position of each and when its commit returned in ``results``."""
    database = open_database(url)
    with schema_lock(database):  # as servers do: writers starting together race otherwise
        writer = TrainingJobs(env=Settings(data_dir=data_dir, database_url=url).event_store_env())
    if isinstance(database, PostgresDatabase):  # told as api.services tells the replicas
        if isinstance(writer.recorder, PostgresGroupCommit):
            writer.recorder.ledger_channel = LEDGER_CHANNEL
        else:
            writer.after_save = (database.notify_ledger,)
    writer.submit("alice", f"lag-{index}-warm", dict(SPEC), by=user("alice"))  # connections
    ready.wait(timeout=120)
    go.wait(timeout=120)
    committed = []
    next_at = time.perf_counter()
    stop = next_at + seconds
    count = 0
    while next_at < stop:
        count += 1
        outcome = writer.submit("alice", f"lag-{index}-{count}", dict(SPEC), by=user("alice"))
        assert outcome.position is not None
        committed.append((outcome.position, time.perf_counter()))
        next_at += 2 / rate
        time.sleep(max(0.0, next_at - time.perf_counter()))
    writer.close()
    database.close()
    results.put(committed)


# -- the report ------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("postgres", "sqlite", "both"), default="both")
    parser.add_argument("--submissions", type=int, default=800)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--writers", type=int, default=2, help="lag: writer threads")
    parser.add_argument("--rebuild-jobs", type=int, default=2000)
    parser.add_argument("--only", choices=("submit", "lag", "rebuild"), default=None)
    parser.add_argument("--no-slurm", action="store_true",
                        help="submit: leave out Slurm's sbatch baseline")  # fmt: skip
    args = parser.parse_args()
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    rows: list[tuple[str, str, str, str]] = []
    sbatch: float | None = None  # measured once, beside the first store's submissions
    slurm_missing = ""
    for store in stores:
        with ExitStack() as stack:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            if args.only in (None, "submit"):
                ours, base, cpu, health = bench_submit(store, root / "submit",
                                                       args.submissions, args.clients)  # fmt: skip
                rows.append((f"submit via API, {args.clients} clients ({store})",
                             f"{ours:.0f} jobs/s", f"{base:.0f} commits/s",
                             f"{ours / base:.2f}x (target >= 0.5x)"))  # fmt: skip
                rows.append((f"GET /health, the same clients ({store})", f"{health:.0f} req/s",
                             f"{base:.0f} commits/s",
                             f"{health / base:.2f}x: the HTTP stack's ceiling"))  # fmt: skip
                if sbatch is None and not args.no_slurm:
                    try:
                        sbatch = sbatch_rate(root / "slurm", args.submissions, args.clients)
                    except SlurmUnavailable as error:
                        sbatch, slurm_missing = 0.0, str(error)
                if sbatch:
                    rows.append((f"submit via API / sbatch, {args.clients} clients ({store})",
                                 f"{ours:.0f} jobs/s", f"{sbatch:.0f} sbatch/s",
                                 f"{ours / sbatch:.2f}x (target >= 3x)"))  # fmt: skip
                    rows.append((f"GET /health / sbatch ({store})", f"{health:.0f} req/s",
                                 f"{sbatch:.0f} sbatch/s",
                                 f"{health / sbatch:.2f}x: the HTTP stack's ceiling"))  # fmt: skip
                ceiling = (os.cpu_count() or 1) * 1000 / sum(cpu.values())
                rows.append((f"CPU per submission ({store})", f"server {cpu['server']:.2f} ms",
                             f"database {cpu['database']:.2f} ms",
                             f"clients {cpu['clients']:.2f} ms: the cores allow "
                             f"{ceiling:.0f} jobs/s"))  # fmt: skip
            if args.only in (None, "lag"):
                p50, p99, reached = bench_lag(store, root, args.rate, args.seconds,
                                              args.writers)  # fmt: skip
                rows.append((f"projection lag at {reached:.0f} ev/s ({store})",
                             f"p50 {p50 * 1000:.1f} ms", f"p99 {p99 * 1000:.1f} ms",
                             "target p99 <= 50 ms"))  # fmt: skip
            if args.only in (None, "rebuild"):
                rows += rebuild_report(store, bench_rebuild(store, root / "rebuild",
                                                            args.rebuild_jobs))  # fmt: skip
    width = max(len(row[0]) for row in rows)
    print(f"\n{'row':<{width}}  {'subject':>14}  {'baseline':>18}  ratio")
    for name, subject, baseline, ratio in rows:
        print(f"{name:<{width}}  {subject:>14}  {baseline:>18}  {ratio}")
    if slurm_missing:
        print(f"\nno Slurm baseline: {slurm_missing}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
