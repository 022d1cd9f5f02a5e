"""The log path's step of bench/ledger.py: ``LocalArtifactStore.append_log`` and
``read_log`` against plain file writes and reads, and the peak RSS growth of a round, measured
in a fresh child process (bench/logpath.py)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import uuid
from functools import partial
from pathlib import Path

from api.artifacts.local import LocalArtifactStore
from bench import logpath
from bench.stores import Table, rate

LOG_ROUNDS = 5  # log rounds per repeat: each takes only milliseconds


def bench_log(repeats: int) -> dict[str, float]:
    chunks = logpath.log_chunks()
    store_write: list[float] = []
    store_read: list[float] = []
    plain_write: list[float] = []
    plain_read: list[float] = []
    with tempfile.TemporaryDirectory(prefix="flexai-bench-log-") as tmp:
        store = LocalArtifactStore(Path(tmp) / "artifacts")
        for repeat in range(repeats * LOG_ROUNDS):
            job_id = str(uuid.uuid4())
            plain = Path(tmp) / "plain" / f"{repeat}.txt"
            rounds = [
                (partial(logpath.store_round, store, job_id, chunks), store_write, store_read),
                (partial(logpath.plain_round, plain, chunks), plain_write, plain_read),
            ]
            if repeat % 2:
                rounds.reverse()
            for run, writes, reads in rounds:
                write_s, read_s = run()
                writes.append(write_s)
                reads.append(read_s)
        rss_store = log_rss_child("store", Path(tmp) / "rss-store")
        rss_plain = log_rss_child("plain", Path(tmp) / "rss-plain")
    return {
        "bytes": float(sum(map(len, chunks))),
        "chunks": float(len(chunks)),
        "store_write": statistics.median(store_write),
        "store_read": statistics.median(store_read),
        "plain_write": statistics.median(plain_write),
        "plain_read": statistics.median(plain_read),
        "rss_store": rss_store,
        "rss_plain": rss_plain,
    }


def log_rss_child(mode: str, directory: Path) -> float:
    """Peak RSS growth of one log write+read round, in a fresh, lightly loaded process."""
    # Through sh, which forks again: Linux carries ru_maxrss across exec, so a child exec'd
    # straight from this (large) process would start with this process's peak and show none.
    output = subprocess.run(
        ["sh", "-c", '"$0" "$@"; exit $?', sys.executable, "-m", "bench.logpath", mode,
         str(directory)],
        cwd=Path(logpath.__file__).resolve().parents[1],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(output.strip().splitlines()[-1])["rss_growth"])


def bench_files(repeats: int, table: Table) -> None:
    log = bench_log(repeats)
    size = log["bytes"]
    table.section(
        f"files: {logpath.LOG_LINES} lines, {size / 1024:,.0f} KiB in {int(log['chunks'])} chunks"
    )
    table.add("log: append_log (256 KiB chunks)", rate(int(size), log["store_write"] * 2**20,
              "MiB/s"), rate(int(size), log["plain_write"] * 2**20, "MiB/s"),
              log["store_write"] / log["plain_write"])
    table.add("log: read_log (1 MiB chunks)", rate(int(size), log["store_read"] * 2**20,
              "MiB/s"), rate(int(size), log["plain_read"] * 2**20, "MiB/s"),
              log["store_read"] / log["plain_read"])
    table.add("log: peak RSS growth / bytes written", f"{log['rss_store'] / 1024:,.0f} KiB",
              f"{size / 1024:,.0f} KiB", log["rss_store"] / size)
    table.add("log: same, plain write+read", f"{log['rss_plain'] / 1024:,.0f} KiB",
              f"{size / 1024:,.0f} KiB", log["rss_plain"] / size)
