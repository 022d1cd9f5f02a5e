"""List and inspect on a big store: `GET /v1/jobs?limit=50` and `GET /v1/jobs/{name}` at N jobs.

Seeds ``--jobs`` jobs (default 100,000) of one user into a fresh store (SQLite in a throwaway
directory, and/or a throwaway PostgreSQL database) through the ledger: each job is made by the
domain's own factories and commands (``TrainingJob.submit``, ``begin_scheduling``, then
``reject``, or for one in ten ``request_stop`` + ``confirm_stopped``, so that the scheduler
leaves them alone) with its ``JobName`` claim, as ``TrainingJobs.submit`` makes them, but
``--batch`` jobs (500) are saved per ledger transaction rather than one: one at a time runs at
about 260 jobs/s on SQLite and 80 on PostgreSQL on the 2-core dev machine (``--batch 1`` does
that, with ``TrainingJobs.submit`` itself). Then one projector catch-up builds the views, and a
real ``flexai server`` starts on the store. Seeding 100,000 jobs is the slow part: about 3.5
minutes on SQLite and 7 on PostgreSQL (mostly its views' catch-up) on that machine, so
``--jobs 20000`` gives a quicker look.

Each of ``--requests`` rounds (500) calls, in turn, ``GET /health`` (the baseline), the first
page of ``GET /v1/jobs?limit=50``, a page half-way down the list (through a cursor), a page
half-way down ``status=stopped`` (a tenth of the jobs), and ``GET /v1/jobs/{name}`` of a
random job. Each row prints p50 and p99 in ms and p99 as a ratio to the baseline's; the target
is p99 <= 10 ms for list and inspect at 100,000 jobs. The server's RSS comes last.

    .venv/bin/python -m bench.views                       # both stores, 100,000 jobs, ~12 min
    .venv/bin/python -m bench.views --store sqlite --jobs 20000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from api.http.cursors import encode_cursor
from api.settings import Settings
from bench.seed_shapes import SPEC
from domain.actors import scheduler, user
from domain.application import TrainingJobs
from domain.job import TrainingJob
from domain.job_name import JobName
from ledger.database import open_database
from projections.projector import Projector

ROOT = Path(__file__).resolve().parent.parent

OWNER = "admin"
"""The admin token's user: the server's first token lists these jobs."""
TARGET_P99_MS = 10.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def job_name(index: int) -> str:
    return f"job-{index:06d}"


def finished_job(index: int) -> tuple[TrainingJob, JobName]:
    """A job submitted and then rejected (or, one in ten, stopped), with its name claim."""
    name = job_name(index)
    job = TrainingJob.submit(owner=OWNER, name=name, spec=SPEC, by=user(OWNER))
    job.begin_scheduling(by=scheduler())
    if index % 10 == 0:
        job.request_stop(by=user(OWNER))
        job.confirm_stopped(by=scheduler())
    else:
        job.reject(code="no_fit", message="no node has enough accelerators", by=scheduler())
    return job, JobName(owner=OWNER, name=name, job_id=job.id)


def seed(settings: Settings, count: int, batch: int) -> tuple[float, float]:
    """``count`` jobs through the ledger, then the views in one catch-up; the seconds each
    took."""
    jobs = TrainingJobs(env=settings.event_store_env())
    database = open_database(settings.resolved_database_url)
    try:
        started = time.perf_counter()
        for first in range(0, count, batch):
            if batch == 1:
                job_id = jobs.submit(OWNER, job_name(first), SPEC, by=user(OWNER)).job_id
                jobs.request_stop(job_id, by=user(OWNER))
                continue
            aggregates: list[Any] = []
            for index in range(first, min(first + batch, count)):
                aggregates += finished_job(index)
            jobs.save(*aggregates)
            if first and first % (20 * batch) == 0:
                print(f"  {first:,} jobs in the ledger", flush=True)
        ledger_s = time.perf_counter() - started
        started = time.perf_counter()
        Projector(jobs, database).catch_up()
        return ledger_s, time.perf_counter() - started
    finally:
        database.close()
        jobs.close()


def cursor_at(settings: Settings, place: int, status: str | None = None) -> str:
    """The cursor a client holds after reading ``place`` jobs (of ``status``) from the top."""
    database = open_database(settings.resolved_database_url)
    where = "owner = ? AND deleted_at IS NULL" + (" AND status = ?" if status else "")
    try:
        with database.transaction() as cursor:
            cursor.execute(
                f"SELECT created_at, id FROM job_list WHERE {where} "
                "ORDER BY created_at DESC, id DESC LIMIT 1 OFFSET ?",
                [OWNER, *([status] if status else []), place - 1],
            )
            row = cursor.fetchone()
    finally:
        database.close()
    assert row is not None, f"fewer than {place} jobs"
    return encode_cursor(row["created_at"], row["id"])


class Server:
    """A real `flexai server` process on the seeded store."""

    def __init__(self, root: Path, database_url: str | None) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        config = root / "config.json"
        env = {**os.environ, "FLEXAI_CONFIG": str(config), "PYTHONPATH": str(ROOT)}
        env.pop("FLEXAI_TOKEN", None)
        env.pop("FLEXAI_API_URL", None)
        args = ["server", "--data-dir", str(root / "data"), "--port", str(port)]
        if database_url:
            args += ["--database-url", database_url]
        self.log = (root / "server.log").open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", *args], env=env, stdout=self.log,
            stderr=subprocess.STDOUT, cwd=root,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while not (config.exists() and self._healthy()):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise RuntimeError(f"the server did not start; see {root / 'server.log'}")
            time.sleep(0.2)
        token = json.loads(config.read_text())["token"]
        self.http = httpx.Client(base_url=self.url, timeout=30,
                                 headers={"Authorization": f"Bearer {token}"})  # fmt: skip

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def rss_mib(self) -> tuple[float, float]:
        """The server's resident memory now and at its peak, in MiB."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def percentile(timings: list[float], q: int) -> float:
    return statistics.quantiles(timings, n=100, method="inclusive")[q - 1]


def measure(server: Server, calls: dict[str, Callable[[], httpx.Response]], rounds: int
            ) -> dict[str, list[float]]:  # fmt: skip
    """Each call once per round, in turn, so that load on the machine hits all alike."""
    timings: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():  # warm-up: connections, caches, first-call imports
        for _ in range(5):
            call().raise_for_status()
    for _ in range(rounds):
        for name, call in calls.items():
            started = time.perf_counter()
            response = call()
            timings[name].append(time.perf_counter() - started)
            response.raise_for_status()
    return timings


def serve_and_measure(
    stack: ExitStack, root: Path, settings: Settings, database_url: str | None, count: int,
    rounds: int, name: Callable[[int], str] = job_name,
) -> tuple[dict[str, list[float]], float, float]:  # fmt: skip
    """Start a server on the seeded views (closed with ``stack``) and time each list and
    inspect call (of jobs named ``name(index)``) next to ``GET /health``: the timings, and the
    server's RSS and peak in MiB."""
    deep = cursor_at(settings, count // 2)
    deep_stopped = cursor_at(settings, max(1, count // 20), "stopped")
    server = Server(root, database_url)
    stack.callback(server.close)
    http = server.http
    pick = random.Random(7)
    calls: dict[str, Callable[[], httpx.Response]] = {
        "GET /health (baseline)": lambda: http.get("/health"),
        "GET /v1/jobs?limit=50 (first page)": lambda: http.get("/v1/jobs?limit=50"),
        "GET /v1/jobs?limit=50 (page half-way, cursor)":
            lambda: http.get("/v1/jobs", params={"limit": 50, "cursor": deep}),
        "GET /v1/jobs?limit=50&status=stopped (half-way)":
            lambda: http.get("/v1/jobs", params={"limit": 50, "status": "stopped",
                                                 "cursor": deep_stopped}),
        "GET /v1/jobs/{name} (random job)":
            lambda: http.get(f"/v1/jobs/{name(pick.randrange(count))}"),
    }  # fmt: skip
    first = http.get("/v1/jobs?limit=50").json()
    assert first["count"] == min(50, count), first
    timings = measure(server, calls, rounds)
    rss, peak = server.rss_mib()
    return timings, rss, peak


def bench_store(store: str, count: int, batch: int, rounds: int) -> list[str]:
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-views-")))
        database_url = None
        if store == "postgres":
            from tests.pg import fresh_database

            database_url = stack.enter_context(fresh_database("bench_views"))
        settings = Settings(data_dir=root / "data", database_url=database_url)
        settings.data_dir.mkdir(parents=True)
        print(f"{store}: seeding {count:,} jobs through the ledger ({batch} per save) and "
              f"the views; at 100,000 this takes minutes (use --jobs for fewer)...",
              flush=True)  # fmt: skip
        ledger_s, views_s = seed(settings, count, batch)
        print(f"  ledger {ledger_s:.0f} s ({count / ledger_s:,.0f} jobs/s), views catch-up "
              f"{views_s:.0f} s ({count / views_s:,.0f} jobs/s)", flush=True)  # fmt: skip
        timings, rss, peak = serve_and_measure(stack, root, settings, database_url, count,
                                               rounds)  # fmt: skip
    baseline_p99 = percentile(next(iter(timings.values())), 99)
    lines = [f"\n{store}, {count:,} jobs, {rounds} calls each", "",
             f"| {'call':<52} | p50 ms | p99 ms | p99 / baseline |",
             f"| {'-' * 52} | ------ | ------ | -------------- |"]  # fmt: skip
    for name, values in timings.items():
        p50, p99 = percentile(values, 50) * 1000, percentile(values, 99) * 1000
        lines.append(f"| {name:<52} | {p50:6.2f} | {p99:6.2f} | "
                     f"{p99 / 1000 / baseline_p99:14.1f} |")  # fmt: skip
    verdicts = [name for name, values in timings.items() if "health" not in name
                and percentile(values, 99) * 1000 > TARGET_P99_MS]  # fmt: skip
    lines += ["", f"server RSS {rss:.0f} MiB (peak {peak:.0f} MiB); seeding: ledger "
              f"{ledger_s:.0f} s, views {views_s:.0f} s",
              f"target p99 <= {TARGET_P99_MS:g} ms: "
              + ("met" if not verdicts else "MISSED by " + ", ".join(verdicts))]  # fmt: skip
    return lines


def postgres_available() -> str | None:
    """Why PostgreSQL cannot be used, or None."""
    try:
        import psycopg

        from tests.pg import POSTGRES_ADMIN_URL

        psycopg.connect(POSTGRES_ADMIN_URL, connect_timeout=3).close()
    except Exception as error:  # noqa: BLE001 - any reason is reported, not raised
        return str(error).splitlines()[0]
    return None


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=positive, default=100_000)
    parser.add_argument("--store", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--batch", type=positive, default=500,
                        help="jobs per ledger save (1: TrainingJobs.submit, one per save)")
    parser.add_argument("--requests", type=positive, default=500, help="calls of each kind")
    args = parser.parse_args()
    for store in chosen_stores(args.store, ["sqlite", "postgres"]):
        print("\n".join(bench_store(store, args.jobs, args.batch, args.requests)), flush=True)
    return 0


def chosen_stores(choice: str, both: list[str]) -> list[str]:
    """The stores ``--store`` names (``both``: in that order, without PostgreSQL, said so, when
    it does not answer); PostgreSQL named alone and not answering ends the bench (exit 1)."""
    stores = both if choice == "both" else [choice]
    if "postgres" in stores and (reason := postgres_available()):
        if choice != "both":
            print(f"PostgreSQL unavailable: {reason}", file=sys.stderr)
            raise SystemExit(1)
        print(f"\npostgres skipped: {reason}")
        stores = [store for store in stores if store != "postgres"]
    return stores


if __name__ == "__main__":
    sys.exit(main())
