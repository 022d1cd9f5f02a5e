"""What a benchmark run cost, looked at from outside the processes: the requests a server
answered (its ``/metrics``), the CPU each process spent (``/proc``), and where (``py-spy``).

``bench/e2e.py --throughput`` takes a :class:`Snapshot` before and after its jobs and prints
the difference per job, so a change that adds a request to a job's life shows at once.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

_SAMPLE = re.compile(r"^flexai_http_requests_total\{(?P<labels>.*)\} (?P<value>[0-9.e+]+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_ROUND = re.compile(r"^flexai_scheduler_round_seconds_(?P<what>count|sum) (?P<value>[0-9.e+]+)$")
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Snapshot:
    """Requests answered by route, scheduler rounds, and CPU seconds by process name."""

    requests: Counter[str] = field(default_factory=Counter)
    rounds: float = 0.0
    round_s: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    transactions: int = 0
    """Transactions PostgreSQL committed or rolled back in the database (0 on SQLite)."""

    def minus(self, before: Snapshot) -> Snapshot:
        return Snapshot(
            requests=self.requests - before.requests,
            rounds=self.rounds - before.rounds,
            round_s=self.round_s - before.round_s,
            cpu={name: seconds - before.cpu.get(name, 0.0) for name, seconds in self.cpu.items()},
            transactions=self.transactions - before.transactions,
        )

    def per_job(self, jobs: int) -> list[str]:
        """Lines saying what one job cost, on average."""
        total = sum(self.requests.values())
        lines = [f"  requests per job: {total / jobs:.2f}; scheduler rounds per job: "
                 f"{self.rounds / jobs:.2f} ({self.round_s * 1000 / jobs:.1f} ms)"]  # fmt: skip
        if self.transactions:
            lines[0] += f"; PostgreSQL transactions per job: {self.transactions / jobs:.1f}"
        for route, count in self.requests.most_common():
            lines.append(f"    {count / jobs:6.2f}  {route}")
        cpu = ", ".join(f"{name} {seconds / jobs * 1000:.1f}" for name, seconds in self.cpu.items())
        lines.append(f"  CPU ms per job (with children reaped): {cpu}")
        return lines


def snapshot(http: httpx.Client, pids: dict[str, int], database_url: str | None) -> Snapshot:
    """The server's counters now (``GET /metrics``), each process's CPU time so far, and the
    transactions of the PostgreSQL database at ``database_url``."""
    taken = Snapshot(cpu={name: cpu_seconds(pid) for name, pid in pids.items()})
    if database_url:
        taken.transactions = transactions(database_url)
    for line in http.get("/metrics").text.splitlines():
        if (sample := _SAMPLE.match(line)) is not None:
            labels = dict(_LABEL.findall(sample["labels"]))
            if labels.get("route") in ("/metrics", "/v1/jobs", "/v1/jobs/{name}") and (
                labels.get("method") == "GET"
            ):
                continue  # the benchmark's own looks, not a job's cost
            route = f"{labels.get('method')} {labels.get('route')} {labels.get('status')}"
            taken.requests[route] += int(float(sample["value"]))
        elif (rounds := _ROUND.match(line)) is not None:
            if rounds["what"] == "count":
                taken.rounds = float(rounds["value"])
            else:
                taken.round_s = float(rounds["value"])
    return taken


def transactions(database_url: str) -> int:
    """Committed and rolled back transactions of the database so far (its statistics are
    flushed within about a second: read them after a pause)."""
    import psycopg

    time.sleep(1.0)
    with psycopg.connect(database_url, autocommit=True) as connection:
        row = connection.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def cpu_seconds(pid: int) -> float:
    """User and system CPU of ``pid`` and of its children it has waited for."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    # After the command's closing parenthesis: utime, stime, cutime, cstime are fields 12-15.
    return sum(int(value) for value in fields[11:15]) / _TICKS


def postgres_pids() -> list[int]:
    """Every PostgreSQL process of this machine (the database's whole cost, its background
    writers too)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() in ("postgres", "postmaster"):
                    pids.append(int(entry.name))
            except OSError:
                continue  # it ended meanwhile
    return pids


class Profiles:
    """``py-spy record`` attached to each named process until :meth:`stop` (raw stacks, one
    file each, for flamegraph.pl or a count by frame)."""

    def __init__(self, directory: Path, pids: dict[str, int], rate: int = 100) -> None:
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.recorders = []
        for name, pid in pids.items():
            output = directory / f"{name}.txt"
            argv = [exe, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate),
                    "--nonblocking", "--gil", "--output", str(output)]  # fmt: skip
            self.recorders.append(subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            ))  # fmt: skip

    def stop(self) -> None:
        for recorder in self.recorders:
            recorder.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for recorder in self.recorders:
            try:
                recorder.wait(timeout=30)
            except subprocess.TimeoutExpired:
                recorder.kill()
