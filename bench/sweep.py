"""A sweep of many jobs through the CLI: `flexai training run ... --sweep` against a real server.

    .venv/bin/python -m bench.sweep [--store postgres|sqlite|both] [--jobs N] [--repeat R]

For each store a real ``flexai server`` process starts on a throwaway database (``server()`` of
bench/scale.py). The subject is the wall time of one ``flexai training run NAME --sweep ...``
process that makes N jobs (default 1,000: three keys of 10 values each), from its start to its
exit: one ``POST /v1/jobs`` with the list, every job saved with its name claimed, the views
caught up, the answer printed. Target on PostgreSQL: under 2 s for 1,000 jobs.

Two baselines are measured in the same run, on the same server and database: the same N jobs
as N single ``POST /v1/jobs`` from one client (what a loop over `flexai training run` costs at
best), and the raw loop of bench/scale.py (one row inserted and committed per job on one
connection). Each figure is the median of R repeats (default 3), each on fresh names; the
subject and the single POSTs alternate. The machines are shared and noisy: watch the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.scale import SPEC, raw_commits, server, store_url

ROOT = Path(__file__).resolve().parents[1]

REPOSITORY = str(SPEC["repository_url"])


def grid(jobs: int) -> list[str]:
    """``--sweep`` flags whose product is ``jobs``: keys of 10 values, then the rest."""
    flags, left, key = [], jobs, 0
    while left > 1:
        values = 10 if left % 10 == 0 else left
        flags += ["--sweep", f"K{key}=" + ",".join(str(value) for value in range(values))]
        left //= values
        key += 1
    return flags or ["--sweep", "K0=0"]


def sweep_once(root: Path, name: str, jobs: int) -> float:
    """Seconds for one `flexai training run --sweep` process making ``jobs`` jobs."""
    env = {**os.environ, "FLEXAI_CONFIG": str(root / "config.json"), "PYTHONPATH": str(ROOT)}
    env.pop("FLEXAI_TOKEN", None)
    args = [sys.executable, "-m", "cli.main", "training", "run", name, "-u", REPOSITORY,
            *grid(jobs), "--", "train.py"]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0 or f"{jobs} of {jobs} jobs started" not in done.stdout:
        raise RuntimeError(f"the sweep failed ({done.returncode}): {done.stderr[-2000:]}")
    return elapsed


def singles_once(base: str, token: str, name: str, jobs: int) -> float:
    """Seconds for ``jobs`` single POSTs from one client."""
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"},
                      timeout=60) as http:  # fmt: skip
        started = time.perf_counter()
        for index in range(jobs):
            answer = http.post("/v1/jobs", json={**SPEC, "name": f"{name}-{index + 1}"})
            if answer.status_code != 201:
                raise RuntimeError(f"{answer.status_code} {answer.text}")
        return time.perf_counter() - started


def bench(store: str, root: Path, jobs: int, repeat: int) -> tuple[float, float, float]:
    """Median seconds: the sweep, the single POSTs, the raw commit loop."""
    sweeps, singles = [], []
    with store_url(store, root, "bench_sweep") as url, server(url, root) as (base, token, _):
        sweep_once(root, "warm-up", 1)
        for run in range(repeat):
            sweeps.append(sweep_once(root, f"sweep{run}", jobs))
            singles.append(singles_once(base, token, f"single{run}", jobs))
        raw = jobs / raw_commits(url, jobs)
    return statistics.median(sweeps), statistics.median(singles), raw


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("postgres", "sqlite", "both"), default="both")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    print(f"{'store':<9} {'sweep (CLI)':>12} {'single POSTs':>13} {'raw commits':>12}  "
          "sweep / singles   sweep / raw")  # fmt: skip
    for store in stores:
        with tempfile.TemporaryDirectory() as scratch:
            sweep, singles, raw = bench(store, Path(scratch), args.jobs, args.repeat)
        print(f"{store:<9} {sweep:>11.2f}s {singles:>12.2f}s {raw:>11.2f}s  "
              f"{sweep / singles:>14.2f}x  {sweep / raw:>11.2f}x")  # fmt: skip
    print(f"({args.jobs} jobs; median of {args.repeat}; target: the sweep under 2 s on "
          "PostgreSQL)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
