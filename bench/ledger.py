"""Ledger, projection, read and log-path benchmarks, reported as ratios to same-run baselines.

    .venv/bin/python -m bench.ledger [--jobs N] [--store sqlite|postgres|both] [--repeats R]
                                     [--profile write|project|read|log]

The machines are shared and noisy, so every figure is printed next to a baseline measured in
the same run, on the same database server or file, and the ratio (subject / baseline) is the
number to watch. Every timing is repeated (3 times by default) and the median is kept; the
subject and its baseline alternate between repeats so that drift hits both.

Steps, per store (SQLite file, PostgreSQL database):

1. write: N jobs through submit -> begin_scheduling -> assign -> report started -> report
   exited 0 on ``TrainingJobs`` over ``Settings(...).event_store_env()`` (6 events a job:
   submit also records the JobName claim), each repeat on a fresh database with one node and
   one warm-up job. Baseline: as many plain single-row INSERT transactions of the same mean
   payload size (taken from the ledger's own stored events) into a scratch table in the same
   database. The jobs run in 10 slices, each timed next to its own baseline slice.
2. project: a fresh ``Projector`` catching up from position 0 over the last ledger (SQLite:
   views in a separate, fresh file per repeat; PostgreSQL: the ledger's database, view tables
   dropped between repeats), against the same raw-insert baseline for as many rows, timed
   next to it.
3. read: median latency of ``Queries.list_jobs`` (all N rows) and ``Queries.job_by_name``
   against a raw ``SELECT 1`` round trip on the same database (driver connection, no pool, no
   wrapper), the calls taken round robin; ``SELECT 1`` through ``Database.transaction()`` too.

Then, once (files only; 5 rounds a repeat): ``LocalArtifactStore.append_log`` of 20,000
50-byte lines in 256 KiB line-aligned chunks and ``read_log`` in 1 MiB chunks against plain
open/write/fsync and a plain read; and the peak RSS growth (``resource.getrusage``) of the log
step, measured in a fresh child process (bench/logpath.py), as a ratio to the bytes written.

``--profile STEP`` runs one step once more under cProfile (first store chosen) and prints the
top functions by cumulative and internal time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import pstats
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

from api.artifacts.local import LocalArtifactStore
from api.settings import Settings
from bench import logpath
from bench.logbench import bench_files
from bench.logpath import timed
from bench.stores import (
    PostgresStore,
    SQLiteStore,
    Store,
    Table,
    micros,
    rate,
)
from domain.actors import user
from domain.application import TrainingJobs
from projections.projector import Projector
from projections.queries import Queries

OWNER = "alice"
NODE_NAME = "bench-node-01"
READ_CALLS = 200
WRITE_SLICES = 10

SPEC: dict[str, Any] = {
    "repository_url": "https://github.com/example/spiral-classifier.git",
    "repository_revision": None,
    "requirements_path": "requirements.txt",
    "accels": 1,
    "nodes": 1,
    "env": {"LEARNING_RATE": "0.01", "EPOCHS": "10"},
    "secrets": {},
    "datasets": [],
    "checkpoint": None,
    "entry_point": ["train.py", "--lr", "0.01", "--epochs", "10"],
}
COMMIT = "3f9a6c1e0b7d4a2f8e5c9b1d0a6f3e7c2b8d4a1f"


# -- step 1: the ledger write path ---------------------------------------------------------


def run_lifecycles(
    jobs: TrainingJobs, node_id: str, names: range, prefix: str, owner: str = OWNER
) -> None:
    by = user(owner)
    for index in names:
        job_id = jobs.submit(owner, f"{prefix}-{index:05d}", SPEC, by).job_id
        jobs.begin_scheduling(job_id)
        jobs.assign(job_id, node_id, NODE_NAME)
        jobs.report(job_id, node_id, {"type": "built", "commit": COMMIT})
        jobs.report(job_id, node_id, {"type": "exited", "exit_code": 0})


def new_ledger(settings: Settings) -> tuple[TrainingJobs, str]:
    """A ledger with one node and one warm-up job (another owner's, so lists leave it out)."""
    jobs = TrainingJobs(env=settings.event_store_env())
    node_id, _ = jobs.register_node(NODE_NAME, 8, "H100")
    run_lifecycles(jobs, node_id, range(1), "warm-up", owner="warm-up")
    return jobs, node_id


def payloads(count: int, size: int) -> list[bytes]:
    """Distinct JSON documents of ``size`` bytes each (about the ledger's mean state size)."""
    result = []
    for index in range(count):
        head = json.dumps({"originator_id": uuid.uuid4().hex, "seq": index, "pad": ""})
        pad = max(0, size - len(head))
        result.append(head.replace('"pad": ""', f'"pad": "{"x" * pad}"').encode())
    return result


def slices(count: int) -> list[range]:
    bounds = [count * k // WRITE_SLICES for k in range(WRITE_SLICES + 1)]
    return [range(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]


class WriteResult:
    def __init__(self) -> None:
        self.events_per_job = 0.0
        self.events = 0  # the timed lifecycles' events
        self.ledger_events = 0  # everything in the ledger (node, warm-up job too)
        self.payload = 0
        self.ledger_s = 0.0
        self.baseline_s = 0.0


def bench_write(
    store: Store, job_count: int, repeats: int, keep: ExitStack
) -> tuple[WriteResult, Settings, Path]:
    """Fresh database per repeat; the last one stays open (on ``keep``) for the next steps.

    The jobs run in WRITE_SLICES slices, each next to its own baseline slice (the order
    alternating), so that load on the machine hits both alike."""
    result = WriteResult()
    ledger_times: list[float] = []
    baseline_times: list[float] = []
    settings, work = None, None
    for repeat in range(repeats):
        with ExitStack() as stack:
            settings, work = stack.enter_context(store.fresh())
            url = settings.resolved_database_url
            jobs, node_id = new_ledger(settings)
            stack.callback(jobs.close)
            insert = stack.enter_context(store.raw_inserter(url))
            before = jobs.recorder.max_notification_id() or 0
            ledger_s = baseline_s = 0.0
            for index, names in enumerate(slices(job_count)):
                lifecycles = partial(run_lifecycles, jobs, node_id, names, f"job-r{repeat}")
                if not result.events_per_job:  # calibrate: events per job, payload size
                    ledger_s += timed(lifecycles)
                    written = (jobs.recorder.max_notification_id() or 0) - before
                    result.events_per_job = written / len(names)
                    result.payload = store.mean_payload(url)
                    rows = payloads(written, result.payload)
                    baseline_s += insert(rows)
                    continue
                rows = payloads(round(result.events_per_job * len(names)), result.payload)
                if (index + repeat) % 2 == 0:
                    ledger_s += timed(lifecycles)
                    baseline_s += insert(rows)
                else:
                    baseline_s += insert(rows)
                    ledger_s += timed(lifecycles)
            result.events = (jobs.recorder.max_notification_id() or 0) - before
            result.ledger_events = jobs.recorder.max_notification_id() or 0
            ledger_times.append(ledger_s)
            baseline_times.append(baseline_s)
            if repeat == repeats - 1:
                keep.push(stack.pop_all())  # closed by the caller after steps 2 and 3
    assert settings is not None and work is not None
    result.ledger_s = statistics.median(ledger_times)
    result.baseline_s = statistics.median(baseline_times)
    return result, settings, work


# -- step 2: projection catch-up ------------------------------------------------------------


def bench_project(
    store: Store, settings: Settings, work: Path, write: WriteResult, repeats: int
) -> tuple[float, float]:
    """Median catch-up time over the whole ledger, and of the raw baseline for as many rows,
    measured next to it (the order alternating)."""
    url = settings.resolved_database_url
    times: list[float] = []
    baseline_times: list[float] = []
    with store.raw_inserter(url) as insert:
        for repeat in range(repeats):
            rows = payloads(write.ledger_events, write.payload)
            if repeat % 2:
                baseline_times.append(insert(rows))
            jobs = TrainingJobs(env=settings.event_store_env())
            try:
                with store.view_database(url, work, f"r{repeat}") as (database, _):
                    projector = Projector(jobs, database)  # creates the tables: not timed
                    times.append(timed(projector.catch_up))
                    assert projector.position() == write.ledger_events
            finally:
                jobs.close()
            if not repeat % 2:
                baseline_times.append(insert(rows))
    return statistics.median(times), statistics.median(baseline_times)


# -- step 3: the read path ------------------------------------------------------------------


def bench_read(
    store: Store, settings: Settings, work: Path, job_count: int, repeats: int
) -> dict[str, float]:
    """Median latency per call (median over repeats of the median over READ_CALLS calls)."""
    url = settings.resolved_database_url
    jobs = TrainingJobs(env=settings.event_store_env())
    samples: dict[str, list[float]] = {"list": [], "by_name": [], "select1": [], "wrapped": []}
    rows_listed = 0
    try:
        with store.view_database(url, work, "read") as (database, view_url), store.raw_select_one(
            view_url
        ) as select_one:
            Projector(jobs, database).catch_up()
            queries = Queries(database)
            names = [f"job-r{repeats - 1}-{i:05d}" for i in range(job_count)]
            random.Random(7).shuffle(names)
            rows_listed = len(queries.list_jobs(OWNER))
            assert queries.job_by_name(OWNER, names[-1]) is not None

            def wrapped_select_one() -> None:
                with database.transaction() as cursor:
                    cursor.execute("SELECT 1")
                    cursor.fetchone()

            cycle = itertools.cycle(names)
            calls: dict[str, Callable[[], Any]] = {
                "select1": select_one,
                "wrapped": wrapped_select_one,
                "list": lambda: queries.list_jobs(OWNER),
                "by_name": lambda: queries.job_by_name(OWNER, next(cycle)),
            }
            for call in calls.values():
                call()  # warm up
            for _ in range(repeats):
                # Round robin, one call of each in turn, so that noise hits all alike.
                times: dict[str, list[float]] = {key: [] for key in calls}
                for _ in range(READ_CALLS):
                    for key, call in calls.items():
                        start = time.perf_counter()
                        call()
                        times[key].append(time.perf_counter() - start)
                for key, values in times.items():
                    samples[key].append(statistics.median(values))
    finally:
        jobs.close()
    result = {key: statistics.median(values) for key, values in samples.items()}
    result["rows_listed"] = rows_listed
    return result


# -- the run --------------------------------------------------------------------------------


def bench_store(store: Store, job_count: int, repeats: int, table: Table) -> None:
    with ExitStack() as keep:
        started = time.perf_counter()
        write, settings, work = bench_write(store, job_count, repeats, keep)
        project_s, project_baseline_s = bench_project(store, settings, work, write, repeats)
        read = bench_read(store, settings, work, job_count, repeats)
        elapsed = time.perf_counter() - started
    events = write.events
    table.section(
        f"{store.name}: {job_count} jobs, {events} events, mean payload {write.payload} B, "
        f"{elapsed:.1f} s"
    )
    baseline = rate(events, write.baseline_s)
    table.add("write: ledger lifecycle", rate(events, write.ledger_s), baseline,
              write.ledger_s / write.baseline_s)
    table.add("write: ledger, per job", f"{write.ledger_s / job_count * 1e3:.2f} ms",
              f"{write.baseline_s / job_count * 1e3:.2f} ms", write.ledger_s / write.baseline_s)
    table.add(f"project: catch-up from 0 ({write.ledger_events} ev)",
              rate(write.ledger_events, project_s),
              rate(write.ledger_events, project_baseline_s), project_s / project_baseline_s)
    select1 = micros(read["select1"])
    table.add("read: SELECT 1 via ledger.database", micros(read["wrapped"]), select1,
              read["wrapped"] / read["select1"])
    table.add(f"read: list_jobs ({int(read['rows_listed'])} rows)", micros(read["list"]),
              select1, read["list"] / read["select1"])
    table.add("read: job_by_name", micros(read["by_name"]), select1,
              read["by_name"] / read["select1"])


def profile_step(step: str, store: Store, job_count: int) -> None:
    profiler = cProfile.Profile()
    if step == "log":
        chunks = logpath.log_chunks()
        with tempfile.TemporaryDirectory() as tmp:
            artifacts = LocalArtifactStore(Path(tmp))

            def log_round() -> None:  # store_round without its gc.collect() calls
                offset = 0
                for chunk in chunks:
                    offset = artifacts.append_log("job", offset, chunk)
                offset = 0
                while data := artifacts.read_log("job", offset, logpath.READ_CHUNK):
                    offset += len(data)

            profiler.runcall(log_round)
    else:
        with store.fresh() as (settings, work):
            jobs, node_id = new_ledger(settings)
            if step == "write":
                profiler.runcall(run_lifecycles, jobs, node_id, range(job_count), "job-r0")
            else:
                run_lifecycles(jobs, node_id, range(job_count), "job-r0")
                with store.view_database(settings.resolved_database_url, work, "p") as (db, _):
                    projector = Projector(jobs, db)
                    if step == "project":
                        profiler.runcall(projector.catch_up)
                    else:
                        projector.catch_up()
                        queries = Queries(db)

                        def reads() -> None:
                            for index in range(READ_CALLS):
                                queries.list_jobs(OWNER)
                                queries.job_by_name(OWNER, f"job-r0-{index % job_count:05d}")

                        profiler.runcall(reads)
            jobs.close()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).strip_dirs()
    stats.sort_stats("cumulative").print_stats(25)
    stats.sort_stats("tottime").print_stats(15)
    print(out.getvalue())


def postgres_available() -> str | None:
    try:
        import psycopg

        from tests.pg import POSTGRES_ADMIN_URL

        psycopg.connect(POSTGRES_ADMIN_URL, connect_timeout=3).close()
    except Exception as error:  # report and carry on with the other store
        return str(error).strip().splitlines()[0]
    return None


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=positive, default=300)
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--repeats", type=positive, default=3)
    parser.add_argument("--profile", choices=("write", "project", "read", "log"))
    args = parser.parse_args()
    stores: list[Store] = []
    skipped = []
    if args.store in ("sqlite", "both"):
        stores.append(SQLiteStore())
    if args.store in ("postgres", "both"):
        problem = postgres_available()
        if problem is None:
            stores.append(PostgresStore())
        else:
            skipped.append(f"postgres skipped: {problem}")
    if args.profile:
        if not stores:
            print("\n".join(skipped), file=sys.stderr)
            return 1
        profile_step(args.profile, stores[0], args.jobs)
        return 0

    started = time.perf_counter()
    table = Table()
    for store in stores:
        bench_store(store, args.jobs, args.repeats, table)
    bench_files(args.repeats, table)
    print(table.render())
    for line in skipped:
        print(line)
    print(f"(median of {args.repeats}; ratio = subject time / baseline time, lower is better; "
          f"total {time.perf_counter() - started:.1f} s)")
    return 1 if skipped and args.store == "postgres" else 0


if __name__ == "__main__":
    sys.exit(main())
