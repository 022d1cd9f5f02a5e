"""A rebuild of the views from the ledger, against a raw batched insert of the very rows it
writes (issue 17: at least 0.3x).

The ledger: ``--jobs`` jobs (2,000), each through the commands ``submit``, ``begin_scheduling``,
``assign``, two reports (``built``, then ``exited`` 0), on one node: 9 events a job with the
name's claim and the node's allocation and release. The subject: ``Rebuilder(...).run()``, the
whole of ``flexai admin views rebuild``: the fold into fresh shadow views (SQLite: a file of
their own; PostgreSQL: a scratch SQLite file loaded with ``COPY``), the catch-up, and the swap
into the live views in one transaction. Each rebuild is timed twice: over live views that are
right (the ratio against the target), and over live views wrong in every row (a space added to
a text column of each), where SQLite's swap, which writes only the rows that differ, must
replace them all.

The baseline, timed next to each rebuild: the rows the rebuild left in the view tables, every
column, read back beforehand, inserted into empty tables of the same schema (the views' own
``CREATE`` statements, their indexes too) in a fresh SQLite file or a fresh PostgreSQL schema,
by ``executemany`` of 200 rows a transaction. That is what the rebuild's output costs to write
with no ledger to read and nothing to fold: the ratio is the baseline's time over the rebuild's.
The earlier baseline, as many one-column rows as the ledger has events, is printed too (each
event against a 90-byte row: far under what the rebuild must write).

    .venv/bin/python -m bench.rebuild                     # both stores, ~1 minute
    .venv/bin/python -m bench.rebuild --store sqlite --jobs 10000
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from api.settings import Settings
from domain.actors import user
from domain.application import TrainingJobs
from ledger.database import open_database
from projections.projector import Projector
from projections.rebuild import Rebuilder
from projections.views import SCHEMA, VIEW_TABLES
from tests.pg import fresh_database

SPEC = {"repository_url": "https://example.com/org/repo.git", "entry_point": ["train.py"],
        "accels": 1, "nodes": 1}  # fmt: skip
PAYLOAD = b'{"repository_url": "https://example.com/org/repo.git", "name": "xxxxxxxxxxxxxxxxxxxx"}'
BATCH = 200
SPOILED = {"job_list": "updated_at", "job_details": "document", "job_nodes": "allocated",
           "nodes": "updated_at"}  # fmt: skip
"""A text column of each view table the bench's jobs fill."""
TARGET = 0.3

Rows = dict[str, tuple[list[str], list[tuple[Any, ...]]]]


@contextmanager
def store_url(store: str, root: Path, prefix: str) -> Iterator[str]:
    if store == "sqlite":
        root.mkdir(parents=True, exist_ok=True)
        yield f"sqlite:///{root / f'{prefix}.sqlite3'}"
        return
    with fresh_database(prefix) as url:
        yield url


def write_ledger(app: TrainingJobs, jobs: int) -> None:
    node, _ = app.register_node("bench-node", accels=1024, accel_type="cpu")
    for index in range(jobs):
        job_id = app.submit("alice", f"r-{index}", dict(SPEC), by=user("alice")).job_id
        app.begin_scheduling(job_id)
        app.assign(job_id, str(node), "bench-node")
        app.report(job_id, str(node), {"node_id": str(node), "type": "built",
                                       "commit": "c0ffee"})  # fmt: skip
        exited = {"node_id": str(node), "type": "exited", "exit_code": 0}  # frees its slot
        app.report(job_id, str(node), exited)


def view_rows(url: str) -> Rows:
    """Every view table's rows, every column, in the table's own order."""
    rows: Rows = {}
    if url.startswith("sqlite:///"):
        connection = sqlite3.connect(url.removeprefix("sqlite:///"))
        for table in VIEW_TABLES:
            cursor = connection.execute(f"SELECT * FROM {table}")
            rows[table] = ([column[0] for column in cursor.description], cursor.fetchall())
        connection.close()
        return rows
    import psycopg

    with psycopg.connect(url) as pg:
        for table in VIEW_TABLES:
            read = pg.execute(f"SELECT * FROM {table}")  # type: ignore[arg-type]
            names = [column.name for column in read.description or ()]
            rows[table] = (names, [tuple(row) for row in read.fetchall()])
    return rows


def insert_same_rows(url: str, root: Path, rows: Rows, repeat: int) -> float:
    """Seconds to insert ``rows`` raw, :data:`BATCH` a transaction, into empty tables of the
    views' schema (a fresh file, or a fresh schema of the same PostgreSQL database)."""
    batches = [(f"INSERT INTO {table} ({', '.join(names)}) VALUES "
                f"({', '.join('?' * len(names))})", table_rows[start:start + BATCH])
               for table, (names, table_rows) in rows.items()
               for start in range(0, len(table_rows), BATCH)]  # fmt: skip
    if url.startswith("sqlite:///"):
        connection = sqlite3.connect(root / f"baseline-{repeat}.sqlite3", isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")  # as the views' connections
        for statement in SCHEMA:
            connection.execute(statement)
        started = time.perf_counter()
        for statement, batch in batches:
            connection.execute("BEGIN")
            connection.executemany(statement, batch)
            connection.execute("COMMIT")
        elapsed = time.perf_counter() - started
        connection.close()
        return elapsed
    import psycopg

    with psycopg.connect(url) as pg:
        schema = f"baseline_{repeat}"
        pg.execute(f"CREATE SCHEMA {schema}")  # type: ignore[arg-type]
        pg.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
        for statement in SCHEMA:
            pg.execute(statement)  # type: ignore[arg-type]
        pg.commit()
        cursor = pg.cursor()
        started = time.perf_counter()
        for statement, batch in batches:
            cursor.executemany(statement.replace("?", "%s"), batch)  # type: ignore[arg-type]
            pg.commit()
        elapsed = time.perf_counter() - started
        pg.execute(f"DROP SCHEMA {schema} CASCADE")  # type: ignore[arg-type]
        pg.commit()
    return elapsed


def insert_one_column_rows(url: str, count: int) -> float:
    """Seconds to insert ``count`` rows of one short blob, :data:`BATCH` a transaction, into a
    scratch table of the store (the earlier baseline: a row for each event)."""
    batches = [[(PAYLOAD,)] * min(BATCH, count - start) for start in range(0, count, BATCH)]
    if url.startswith("sqlite:///"):
        connection = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        connection.execute("CREATE TABLE IF NOT EXISTS bench_batched (id INTEGER PRIMARY KEY, "
                           "body BLOB)")  # fmt: skip
        started = time.perf_counter()
        for batch in batches:
            connection.execute("BEGIN")
            connection.executemany("INSERT INTO bench_batched (body) VALUES (?)", batch)
            connection.execute("COMMIT")
        elapsed = time.perf_counter() - started
        connection.execute("DROP TABLE bench_batched")
        connection.close()
        return elapsed
    import psycopg

    with psycopg.connect(url) as pg:
        pg.execute("CREATE TABLE IF NOT EXISTS bench_batched (id bigserial PRIMARY KEY, "
                   "body bytea)")  # fmt: skip
        pg.commit()
        cursor = pg.cursor()
        started = time.perf_counter()
        for batch in batches:
            cursor.executemany("INSERT INTO bench_batched (body) VALUES (%s)", batch)
            pg.commit()
        elapsed = time.perf_counter() - started
        pg.execute("DROP TABLE bench_batched")
        pg.commit()
    return elapsed


def same_rows(these: Rows, those: Rows) -> bool:
    """Whether two reads of the views hold the same rows (in whatever order)."""
    return all(these[table][0] == those[table][0]
               and sorted(these[table][1], key=repr) == sorted(those[table][1], key=repr)
               for table in VIEW_TABLES)  # fmt: skip


def median(values: Sequence[float]) -> float:
    return sorted(values)[len(values) // 2]


def bench_rebuild(store: str, root: Path, jobs: int, repeats: int = 3) -> dict[str, float]:
    """The rebuild's seconds and its baselines' (medians of ``repeats``, side by side), with
    the ledger's events and the view rows written."""
    with store_url(store, root, "bench_rebuild") as url:
        settings = Settings(data_dir=root / "rebuild", database_url=url)
        app = TrainingJobs(env=settings.event_store_env())
        write_ledger(app, jobs)
        events = app.recorder.max_notification_id() or 0  # type: ignore[attr-defined]
        database = open_database(url)
        projector = Projector(app, database)
        projector.catch_up()
        rows = view_rows(url)
        timings: dict[str, list[float]] = {"rebuild": [], "every row wrong": [], "same rows": [],
                                           "one-column": []}  # fmt: skip
        try:
            for repeat in range(repeats):
                for wrong in (False, True):
                    if wrong:
                        spoil_every_row(database)
                    rebuilder = Rebuilder(app, projector, database,
                                          shadow_sqlite_path=root / "shadow.sqlite3")  # fmt: skip
                    started = time.perf_counter()
                    progress = rebuilder.run()
                    timings["every row wrong" if wrong else "rebuild"].append(
                        time.perf_counter() - started)  # fmt: skip
                    if progress.state != "done":
                        raise RuntimeError(progress.error)
                timings["same rows"].append(insert_same_rows(url, root, rows, repeat))
                timings["one-column"].append(insert_one_column_rows(url, events))
            if not same_rows(view_rows(url), rows):
                raise RuntimeError("the rebuilt views differ from the views the events made")
        finally:
            database.close()
            app.close()
    return {"events": events, "rows": sum(len(table_rows) for _, table_rows in rows.values()),
            **{name: median(values) for name, values in timings.items()}}  # fmt: skip


def spoil_every_row(database: Any) -> None:
    """Every row of the views the bench's jobs fill made wrong: a rebuild must write them all
    (on SQLite its swap writes only the rows that differ)."""
    with database.transaction(write=True) as cursor:
        for table, column in SPOILED.items():
            cursor.execute(f"UPDATE {table} SET {column} = {column} || ' '")


def report(store: str, figures: dict[str, float]) -> list[tuple[str, str, str, str]]:
    rebuild, same, one = figures["rebuild"], figures["same rows"], figures["one-column"]
    wrong = figures["every row wrong"]
    events, rows = figures["events"], figures["rows"]
    return [
        (f"rebuild views, {events:.0f} events, {rows:.0f} rows ({store})",
         f"{rebuild * 1000:.0f} ms: {events / rebuild:,.0f} ev/s",
         f"same rows raw {same * 1000:.0f} ms",
         f"{same / rebuild:.2f}x (target >= {TARGET}x)"),
        (f"  the same, the live views wrong in every row ({store})",
         f"{wrong * 1000:.0f} ms: {events / wrong:,.0f} ev/s",
         f"same rows raw {same * 1000:.0f} ms", f"{same / wrong:.2f}x"),
        (f"  the earlier baseline: a one-column row an event ({store})",
         f"{events / rebuild:,.0f} ev/s", f"{events / one:,.0f} rows/s",
         f"{one / rebuild:.2f}x"),
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("postgres", "sqlite", "both"), default="both")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    lines = []
    for store in ["sqlite", "postgres"] if args.store == "both" else [args.store]:
        with tempfile.TemporaryDirectory() as root:
            lines += report(store, bench_rebuild(store, Path(root), args.jobs, args.repeats))
    width = max(len(line[0]) for line in lines)
    for name, subject, baseline, ratio in lines:
        print(f"{name:<{width}}  {subject:>24}  {baseline:>24}  {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
