"""A long queue: what thousands of waiting jobs cost a real ``flexai server`` that schedules them.

    .venv/bin/python -m bench.waiting [--store postgres|sqlite|both] [--waiting N] [--singles M]

For each store a real server starts on a throwaway database with no node (``server()`` of
bench/scale.py): every job waits in ``scheduling``. First, as the baseline, ``--singles`` (300)
single ``POST /v1/jobs`` from one client with no other job waiting, and the server's CPU over
``--idle`` seconds (10) with those few waiting. Then ``--waiting`` (5,000) more jobs are
submitted (lists of 1,000) and the same two figures are measured with them waiting: the
server's idle CPU (a scheduler that plans again while nothing changes pays for every waiting
job several times a second), and the single submissions' rate as a ratio to the baseline's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.probes import cpu_seconds
from bench.scale import SPEC, server, store_url


def singles(base: str, token: str, prefix: str, count: int) -> float:
    """Single submissions a second, one after another from one client."""
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as client:
        started = time.perf_counter()
        for index in range(count):
            answer = client.post("/v1/jobs", json={**SPEC, "name": f"{prefix}-{index}"})
            answer.raise_for_status()
        return count / (time.perf_counter() - started)


def idle_cpu(pid: int, seconds: float) -> float:
    """The share of one core the server used over ``seconds`` with no request."""
    time.sleep(2)  # the submissions' last rounds and catch-ups end
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / seconds


def bench(store: str, root: Path, waiting: int, count: int, idle_s: float) -> list[str]:
    with store_url(store, root, "bench_queue") as url, \
            server(url, root / store) as (base, token, pid):  # fmt: skip
        rate_few = singles(base, token, "few", count)
        idle_few = idle_cpu(pid, idle_s)
        headers = {"Authorization": f"Bearer {token}"}
        for start in range(0, waiting, 1000):
            names = range(start, min(waiting, start + 1000))
            jobs = [{**SPEC, "name": f"queued-{index}"} for index in names]
            answer = httpx.post(f"{base}/v1/jobs", json=jobs, headers=headers, timeout=300)
            answer.raise_for_status()
        idle_many = idle_cpu(pid, idle_s)
        rate_many = singles(base, token, "many", count)
    return [
        f"{store}: server CPU while idle, {count:,} waiting: {idle_few:.0%} of a core; "
        f"{count + waiting:,} waiting: {idle_many:.0%}",
        f"{store}: single submissions/s, {count:,} waiting: {rate_few:.0f}; with "
        f"{count + waiting:,} waiting: {rate_many:.0f} ({rate_many / rate_few:.2f}x)",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["postgres", "sqlite", "both"], default="both")
    parser.add_argument("--waiting", type=int, default=5000)
    parser.add_argument("--singles", type=int, default=300)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle measured")
    args = parser.parse_args()
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    lines = []
    with tempfile.TemporaryDirectory(prefix="flexai-bench-queue-") as scratch:
        for store in stores:
            lines += bench(store, Path(scratch), args.waiting, args.singles, args.idle)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
