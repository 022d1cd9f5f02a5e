"""List and inspect at a million jobs, and the bulk seeder that puts them there.

Seeds jobs of one user into a fresh store (SQLite in a throwaway directory, and/or a throwaway
PostgreSQL database) with the bulk seeder (:mod:`bench.seed`: the events, hash chain and
view rows the commands write, in big batches), first ``--small`` jobs (100,000), then as many
more as make ``--jobs`` (1,000,000). After each, a real ``flexai server`` starts on the store and
each of ``--requests`` rounds (500) calls, in turn, ``GET /health`` (the baseline), the first
page of ``GET /v1/jobs?limit=50``, the page half-way down the list (through its keyset cursor),
a page half-way down ``status=stopped`` (a tenth of the jobs), and ``GET /v1/jobs/{name}`` of a
random job; then its RSS is read and it stops.

Targets at the large size: list and inspect p99 at most 1.5 x ``/health``'s p99 in the same
rounds, and the server's RSS within 10% of the small size's. The seeder's jobs/s is printed too
(target: 20,000).

    .venv/bin/python -m bench.million                      # both stores, ~25 minutes
    .venv/bin/python -m bench.million --store sqlite --small 10000 --jobs 100000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from api.settings import Settings
from bench.seed import job_name, seed_jobs
from bench.views import chosen_stores, percentile, positive
from bench.views import serve_and_measure as views_calls
from domain.application import TrainingJobs
from ledger.database import open_database

TARGET_RATIO = 1.5
TARGET_RSS = 0.10
TARGET_SEED = 20_000


def seed(settings: Settings, count: int, start: int) -> float:
    """Jobs ``start`` to ``count`` into the store; their jobs/s."""
    app = TrainingJobs(env=settings.event_store_env())
    database = open_database(settings.resolved_database_url)

    def progress(done: int) -> None:
        if done % 200_000 == 0:
            print(f"  {start + done:,} jobs", flush=True)

    try:
        seeded = seed_jobs(app, database, count - start, first=start, progress=progress)
    finally:
        database.close()
        app.close()
    return seeded.jobs / seeded.seconds


def serve_and_measure(root: Path, settings: Settings, database_url: str | None, count: int,
                      rounds: int) -> tuple[dict[str, list[float]], float]:  # fmt: skip
    """p99s of each call, and the server's RSS in MiB after them."""
    with ExitStack() as stack:
        timings, rss, _ = views_calls(stack, root, settings, database_url, count, rounds,
                                      job_name)
    return timings, rss


def bench_store(store: str, small: int, large: int, rounds: int) -> list[str]:
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-million-")))
        database_url = None
        if store == "postgres":
            from tests.pg import fresh_database

            database_url = stack.enter_context(fresh_database("bench_million"))
        settings = Settings(data_dir=root / "data", database_url=database_url)
        settings.data_dir.mkdir(parents=True)
        results: dict[int, tuple[dict[str, list[float]], float]] = {}
        rates = []
        seeded = 0
        for count in (small, large):
            print(f"{store}: seeding jobs {seeded:,} to {count:,}...", flush=True)
            started = time.perf_counter()
            rates.append(seed(settings, count, seeded))
            print(f"  {count - seeded:,} jobs in {time.perf_counter() - started:.0f} s "
                  f"({rates[-1]:,.0f} jobs/s)", flush=True)  # fmt: skip
            seeded = count
            results[count] = serve_and_measure(root, settings, database_url, count, rounds)
    return report(store, results, rates, rounds)


def report(store: str, results: dict[int, tuple[dict[str, list[float]], float]],
           rates: list[float], rounds: int) -> list[str]:  # fmt: skip
    (small, (_, small_rss)), (large, (timings, large_rss)) = sorted(results.items())
    lines = [
        f"\n{store}, {large:,} jobs, {rounds} calls each", "",
        f"| {'call':<50} | p50 ms | p99 ms | p99 / health | at {small:,}: p99 / health |",
        f"| {'-' * 50} | ------ | ------ | ------------ | ---------------------- |",
    ]  # fmt: skip
    small_timings = results[small][0]
    baseline = percentile(timings["GET /health (baseline)"], 99)
    small_baseline = percentile(small_timings["GET /health (baseline)"], 99)
    missed = []
    for name, values in timings.items():
        p50, p99 = percentile(values, 50), percentile(values, 99)
        before = percentile(small_timings[name], 99) / small_baseline
        lines.append(f"| {name:<50} | {p50 * 1000:6.2f} | {p99 * 1000:6.2f} | "
                     f"{p99 / baseline:12.2f} | {before:22.2f} |")  # fmt: skip
        if p99 / baseline > TARGET_RATIO:
            missed.append(name)
    growth = large_rss / small_rss - 1
    lines += [
        "",
        f"server RSS: {small_rss:.0f} MiB at {small:,} jobs, {large_rss:.0f} MiB at {large:,} "
        f"({growth:+.1%}; target within {TARGET_RSS:.0%})",
        f"seeder: {rates[0]:,.0f} jobs/s (first {small:,}), {rates[1]:,.0f} jobs/s (the rest; "
        f"target {TARGET_SEED:,})",
        f"target p99 <= {TARGET_RATIO:g} x /health: "
        + ("met" if not missed else "MISSED by " + ", ".join(missed)),
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=positive, default=1_000_000)
    parser.add_argument("--small", type=positive, default=100_000)
    parser.add_argument("--store", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--requests", type=positive, default=500, help="calls of each kind")
    args = parser.parse_args()
    if args.small >= args.jobs:
        parser.error("--small must be under --jobs")
    for store in chosen_stores(args.store, ["postgres", "sqlite"]):
        print("\n".join(bench_store(store, args.small, args.jobs, args.requests)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
