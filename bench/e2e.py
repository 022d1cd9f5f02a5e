"""From `run` to `succeeded`: a trivial job end to end, and 200 of them, next to Slurm.

Starts a real ``flexai server`` (SQLite in a throwaway directory, then a throwaway PostgreSQL
database) and real ``flexai agent`` processes, with a local git repository whose ``train.py``
is ``pass`` and whose requirements are empty. One warm-up job fills the agent's caches (its
git mirror and environment); then each of ``--jobs`` jobs (20) is timed from the moment its
``POST /v1/jobs`` (what ``flexai training run`` sends) returned to the moment the API shows it
``succeeded`` (polled every 5 ms). p50 and p90 are printed; the target is p50 <= 250 ms.

``--slurm`` measures the baseline in the same run: a one-node Slurm cluster on loopback
(``bench/slurm.py``; slurm-wlm is installed with apt-get if missing, which needs root), where
each ``sbatch --wrap true`` is timed from sbatch's return to ``COMPLETED`` (``scontrol show
job`` polled every 5 ms), and prints the ratio (target: flexai p50 <= 0.25 x Slurm's p50).

``--throughput`` sends 200 trivial jobs through two agents with 4 accelerators each and prints
jobs/s from the first submission to the last ``succeeded`` (target: 20 jobs/s), and, with
``--slurm``, Slurm's 200 ``sbatch --wrap true`` on a node with 8 CPUs, and the ratio.

``--sandbox-cost`` times the same jobs through an agent started with ``--no-sandbox`` in the
same run: what each job's sandbox (bubblewrap, its cgroup) costs from run to succeeded.

``--https-cost`` starts two clusters side by side, one over plain HTTP and one whose server
serves HTTPS (``--tls-cert``, a certificate of a CA made for the run; the agent and the
bench's client verify it; the agents present client certificates, ``--agent-client-ca``), and
times jobs on each in turn: what TLS on every hop costs from run to succeeded (target: at most
1.10x plain HTTP's p50).

    .venv/bin/python -m bench.e2e                       # both stores, ~30 s
    .venv/bin/python -m bench.e2e --store sqlite --sandbox-cost
    .venv/bin/python -m bench.e2e --https-cost --jobs 40
    .venv/bin/python -m bench.e2e --slurm --throughput  # everything, ~2 minutes
    .venv/bin/python -m bench.e2e --store sqlite --jobs 50
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.probes import Profiles, snapshot
from bench.slurm import SlurmCluster, SlurmUnavailable, stop_all
from common.contract import TERMINAL
from tests.support import make_repo

ROOT = Path(__file__).resolve().parents[1]

POLL_S = 0.005
TARGET_P50_S = 0.25
TARGET_RATIO = 0.25
TARGET_JOBS_PER_S = 20.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Flexai:
    """A real server and ``agents`` real agents with ``accels`` accelerators each."""

    def __init__(self, root: Path, database_url: str | None, agents: int, accels: int,
                 agent_args: tuple[str, ...] = (), https: bool = False) -> None:  # fmt: skip
        self.root = root
        self.database_url = database_url
        root.mkdir(parents=True)
        self.port = free_port()
        self.url = f"{'https' if https else 'http'}://127.0.0.1:{self.port}"
        server_tls: list[str] = []
        self.verify: ssl.SSLContext | bool = True
        if https:
            from tests.tls import TestCA

            ca = TestCA(root / "tls")
            issued = ca.issue("server")
            client = ca.issue("agent", ("bench-agents",), client=True)
            server_tls = ["--tls-cert", str(issued.cert), "--tls-key", str(issued.key),
                          "--agent-client-ca", str(ca.path)]  # fmt: skip
            agent_args = (*agent_args, "--ca-file", str(ca.path), "--client-cert",
                          str(client.cert), "--client-key", str(client.key))  # fmt: skip
            self.verify = ca.client_context()
        self.env = {**os.environ, "FLEXAI_CONFIG": str(root / "config.json"),
                    "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}  # fmt: skip
        self.env.pop("FLEXAI_TOKEN", None)
        self.env.pop("FLEXAI_API_URL", None)
        self.processes: list[subprocess.Popen[bytes]] = []
        self.pids: dict[str, int] = {}
        self.counter = 0
        try:
            server = ["server", "--data-dir", str(root / "data"), "--port", str(self.port),
                      "--scheduling-patience", "600", *server_tls]  # fmt: skip
            self._start("server", server + (["--database-url", database_url] if database_url
                                            else []))  # fmt: skip
            self._wait(self._healthy, "the server to start")
            token = json.loads((root / "config.json").read_text())["token"]
            self.http = httpx.Client(base_url=self.url, timeout=60, verify=self.verify,
                                     headers={"Authorization": f"Bearer {token}"})  # fmt: skip
            me = pwd.getpwuid(os.geteuid()).pw_name
            for index in range(agents):
                token_file = root / f"agent-{index}.token"
                made = self.http.post("/v1/admin/node-tokens", json={"node": f"bench-node-{index}"})
                token_file.write_text(made.json()["token"] + "\n")
                token_file.chmod(0o600)
                self._start(f"agent-{index}", [
                    "agent", "--server", self.url, "--accels", str(accels), "--name",
                    f"bench-node-{index}", "--work-dir", str(root / f"agent-{index}"),
                    "--job-user", me, "--token-file", str(token_file), *agent_args,
                ])  # fmt: skip
            self._wait(lambda: self._alive_nodes() == agents, "the agents to register")
        except BaseException:
            self.close()
            raise

    def _start(self, name: str, args: list[str]) -> None:
        log = (self.root / f"{name}.log").open("wb")
        self.processes.append(subprocess.Popen(
            [sys.executable, "-m", "cli.main", *args], env=self.env, stdout=log,
            stderr=subprocess.STDOUT, cwd=self.root,
        ))  # fmt: skip
        self.pids[name] = self.processes[-1].pid

    def _wait(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 60
        while not condition():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                raise RuntimeError(f"waited in vain for {what}; see the logs in {self.root}")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        try:
            ready = httpx.get(f"{self.url}/health", timeout=2,
                              verify=self.verify).status_code == 200  # fmt: skip
            return ready and (self.root / "config.json").exists()
        except httpx.HTTPError:
            return False

    def _alive_nodes(self) -> int:
        nodes = self.http.get("/v1/nodes").json()["nodes"]
        return sum(1 for node in nodes if node["alive"])

    def submit(self, repo: Path, accels: int = 1) -> tuple[str, float]:
        """Submit a trivial job; its name and when the submission returned."""
        self.counter += 1
        name = f"bench-{self.counter}"
        answer = self.http.post("/v1/jobs", json={
            "name": name, "repository_url": str(repo), "entry_point": ["train.py"],
            "accels": accels,
        })  # fmt: skip
        returned = time.perf_counter()
        if answer.status_code != 201:
            raise RuntimeError(f"submission refused: {answer.status_code} {answer.text}")
        return name, returned

    def wait_succeeded(self, name: str, poll: float = POLL_S) -> float:
        """When the job was first seen ``succeeded``."""
        deadline = time.monotonic() + 120
        while True:
            status = self.http.get(f"/v1/jobs/{name}").json()["status"]
            if status == "succeeded":
                return time.perf_counter()
            if status in TERMINAL or time.monotonic() > deadline:
                raise RuntimeError(f"job {name} is {status}; see the logs in {self.root}")
            time.sleep(poll)

    def succeeded(self, names: set[str]) -> int:
        failed = [job["name"] for job in self._every("failed,rejected,stopped")
                  if job["name"] in names]  # fmt: skip
        if failed:
            raise RuntimeError(f"jobs {failed[:5]} did not succeed; see the logs in {self.root}")
        return sum(1 for job in self._every("succeeded") if job["name"] in names)

    def _every(self, statuses: str) -> list[dict[str, Any]]:
        """Every job with one of these statuses, page after page."""
        jobs: list[dict[str, Any]] = []
        params: dict[str, Any] = {"status": statuses, "limit": 500}
        while True:
            page = self.http.get("/v1/jobs", params=params).json()
            jobs.extend(page["jobs"])
            if not page.get("next_cursor"):
                return jobs
            params["cursor"] = page["next_cursor"]

    def close(self) -> None:
        if hasattr(self, "http"):
            self.http.close()
        stop_all(self.processes)


@contextmanager
def flexai(store: str, root: Path, agents: int, accels: int,
           agent_args: tuple[str, ...] = (), https: bool = False) -> Iterator[Flexai]:  # fmt: skip
    with ExitStack() as stack:
        url = None
        if store == "postgres":
            from tests.pg import fresh_database

            url = stack.enter_context(fresh_database("bench_e2e"))
        cluster = Flexai(root, url, agents, accels, agent_args, https)
        stack.callback(cluster.close)
        yield cluster


def latencies(cluster: Flexai, repo: Path, jobs: int) -> list[float]:
    cluster.wait_succeeded(cluster.submit(repo)[0])  # warm-up: the mirror, the environment
    timings = []
    for _ in range(jobs):
        name, returned = cluster.submit(repo)
        timings.append(cluster.wait_succeeded(name) - returned)
    return timings


def paired_latencies(clusters: list[Flexai], repo: Path, jobs: int) -> list[list[float]]:
    """``jobs`` timed jobs on each cluster, one on each in turn (the machine's noise falls on
    both alike)."""
    for cluster in clusters:
        cluster.wait_succeeded(cluster.submit(repo)[0])  # warm-up
    timings: list[list[float]] = [[] for _ in clusters]
    for _ in range(jobs):
        for cluster, taken in zip(clusters, timings, strict=True):
            name, returned = cluster.submit(repo)
            taken.append(cluster.wait_succeeded(name) - returned)
    return timings


def throughput(
    cluster: Flexai, repo: Path, count: int, notes: list[str], profile: Path | None = None
) -> float:
    warm = [cluster.submit(repo, accels=4)[0] for _ in range(2)]  # one per agent
    for name in warm:
        cluster.wait_succeeded(name, poll=0.05)
    before = snapshot(cluster.http, cluster.pids, cluster.database_url)
    profiles = Profiles(profile, cluster.pids) if profile else None
    start = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        names = {name for name, _ in pool.map(lambda _: cluster.submit(repo), range(count))}
    deadline = time.monotonic() + 600
    while cluster.succeeded(names) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} jobs not succeeded within 600 s; see {cluster.root}")
        time.sleep(0.2)  # a list of every job: asked for often, it would load the server
    rate = count / (time.perf_counter() - start)
    if profiles is not None and profile is not None:
        profiles.stop()
        for log in cluster.root.glob("*.log"):
            shutil.copy(log, profile / log.name)
        notes.append(f"py-spy stacks (--gil) and logs of the server and agents: {profile}")
    notes += snapshot(cluster.http, cluster.pids, cluster.database_url).minus(before).per_job(count)
    return rate


def slurm_latencies(slurm: SlurmCluster, jobs: int) -> list[float]:
    slurm_wait(slurm, slurm.submit())  # warm-up
    timings = []
    for _ in range(jobs):
        job_id = slurm.submit()
        returned = time.perf_counter()
        timings.append(slurm_wait(slurm, job_id) - returned)
    return timings


def slurm_wait(slurm: SlurmCluster, job_id: str) -> float:
    """When the job was first seen ``COMPLETED``."""
    deadline = time.monotonic() + 120
    while (state := slurm.states([job_id]).get(job_id)) != "COMPLETED":
        if state in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") or (
            time.monotonic() > deadline
        ):
            raise SlurmUnavailable(f"slurm job {job_id} is {state or 'unknown'}")
        time.sleep(POLL_S)
    return time.perf_counter()


def slurm_throughput(slurm: SlurmCluster, count: int) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(lambda _: slurm.submit(), range(count)))
    deadline = time.monotonic() + 600
    while sum(1 for state in slurm.states(ids).values() if state == "COMPLETED") < count:
        if time.monotonic() > deadline:
            raise SlurmUnavailable(f"{count} Slurm jobs not COMPLETED within 600 s")
        time.sleep(0.2)
    return count / (time.perf_counter() - start)


def percentile(timings: list[float], q: int) -> float:
    ordered = sorted(timings)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def report(rows: dict[str, list[float]], rates: dict[str, float], notes: list[str]) -> None:
    slurm = rows.get("slurm: sbatch --wrap true")
    base = statistics.median(slurm) if slurm else None
    if rows:
        print(f"\n{'row':<34} {'p50 ms':>8} {'p90 ms':>8} {'p50 / Slurm p50':>16}")
    for row, timings in rows.items():
        p50 = percentile(timings, 50)
        ratio = f"{p50 / base:>15.2f}x" if base else f"{'-':>16}"
        mark = "" if row.startswith("slurm") or p50 <= TARGET_P50_S else "  over 250 ms"
        if base and not row.startswith("slurm") and p50 > TARGET_RATIO * base:
            mark += "  over 0.25x Slurm"
        print(f"{row:<34} {p50 * 1000:>8.1f} {percentile(timings, 90) * 1000:>8.1f} {ratio}{mark}")
    if rates:
        slurm_rate = next((rate for row, rate in rates.items() if row.startswith("slurm")), 0)
        print(f"\n{'row':<34} {'jobs/s':>8} {'ours / Slurm':>18}")
        for row, rate in rates.items():
            ratio = f"{rate / slurm_rate:>17.2f}x" if slurm_rate else f"{'-':>18}"
            mark = "" if row.startswith("slurm") or rate >= TARGET_JOBS_PER_S else "  under 20/s"
            print(f"{row:<34} {rate:>8.1f} {ratio}{mark}")
    for note in notes:
        print(note)


def postgres_available() -> bool:
    try:
        import psycopg

        from tests.pg import POSTGRES_ADMIN_URL

        psycopg.connect(POSTGRES_ADMIN_URL, connect_timeout=3).close()
        return True
    except Exception:
        return False


def run(args: argparse.Namespace) -> None:
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    rows: dict[str, list[float]] = {}
    rates: dict[str, float] = {}
    notes: list[str] = []
    if "postgres" in stores and not postgres_available():
        stores.remove("postgres")
        notes.append("PostgreSQL does not answer (tests/pg.py's URL): skipped")
    with tempfile.TemporaryDirectory(prefix="flexai-bench-e2e-") as scratch:
        tmp = Path(scratch)
        repo = make_repo(tmp / "repo", {"train.py": "pass\n", "requirements.txt": ""})
        for store in stores:
            if args.jobs:
                with flexai(store, tmp / f"latency-{store}", agents=1, accels=1) as cluster:
                    rows[f"flexai: run -> succeeded ({store})"] = latencies(
                        cluster, repo, args.jobs
                    )
            if args.jobs and args.sandbox_cost:  # the baseline: the same, no sandbox
                with flexai(store, tmp / f"unsandboxed-{store}", agents=1, accels=1,
                            agent_args=("--no-sandbox",)) as cluster:  # fmt: skip
                    rows[f"flexai: run -> succeeded, no sandbox ({store})"] = latencies(
                        cluster, repo, args.jobs
                    )
            if args.jobs and args.https_cost:
                with (flexai(store, tmp / f"http-{store}", 1, 1) as plain,
                      flexai(store, tmp / f"https-{store}", 1, 1, https=True) as secure):
                    http_s, https_s = paired_latencies([plain, secure], repo, args.jobs)
                rows[f"flexai: http, paired ({store})"] = http_s
                rows[f"flexai: https, paired ({store})"] = https_s
                ratio = statistics.median(https_s) / statistics.median(http_s)
                notes.append(f"https / http p50 ({store}): {ratio:.3f}x"
                             + ("" if ratio <= 1.10 else "  over 1.10x"))  # fmt: skip
            if args.throughput:
                with flexai(store, tmp / f"throughput-{store}", agents=2, accels=4) as cluster:
                    notes.append(f"{args.count} jobs ({store}):")
                    profile = args.profile / store if args.profile else None
                    rates[f"flexai: {args.count} jobs ({store})"] = throughput(
                        cluster, repo, args.count, notes, profile
                    )
        if args.slurm:
            try:
                slurm = SlurmCluster(tmp / "slurm", cpus=8)
            except SlurmUnavailable as error:
                notes.append(f"Slurm not measured: {error}")
            else:
                try:
                    if args.jobs:
                        rows["slurm: sbatch --wrap true"] = slurm_latencies(slurm, args.jobs)
                    if args.throughput:
                        rates[f"slurm: {args.count} x sbatch --wrap true"] = slurm_throughput(
                            slurm, args.count
                        )
                finally:
                    slurm.close()
    report(rows, rates, notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=20, help="timed jobs per store (20; 0: none)")
    parser.add_argument("--slurm", action="store_true", help="measure Slurm in the same run")
    parser.add_argument("--throughput", action="store_true",
                        help="also 200 jobs through two agents of 4 accelerators")  # fmt: skip
    parser.add_argument("--count", type=int, default=200, help=argparse.SUPPRESS)
    parser.add_argument("--sandbox-cost", action="store_true",
                        help="also the same jobs through an agent with --no-sandbox")
    parser.add_argument("--https-cost", action="store_true",
                        help="the same jobs on an HTTP and an HTTPS cluster in turn")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="py-spy the server and agents during --throughput")  # fmt: skip
    run(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
