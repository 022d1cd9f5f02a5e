"""A one-node Slurm cluster on loopback, tuned for latency, as the baseline of ``bench/e2e.py``.

``slurm-wlm`` is installed with apt-get when ``slurmctld`` is missing (that needs root). The
cluster runs from a throwaway directory: munge (started if it does not run), then
``slurmctld`` and ``slurmd`` in the foreground of their own processes, with
``SchedulerParameters=batch_sched_delay=0``, ``proctrack/linuxproc``, ``cons_tres`` by CPU, no
accounting storage and no job completion plugin. The node offers as many CPUs as the agents
offer accelerators (``config_overrides``), so both sides run as many jobs at once.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SLURM_CONF = """\
ClusterName=flexaibench
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
MinJobAge=600
MaxJobCount=100000
InactiveLimit=0
KillWait=1
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=bench Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


class SlurmUnavailable(Exception):
    """Slurm cannot be installed or started here; the message says why."""


def ensure_installed() -> None:
    if shutil.which("slurmctld") and shutil.which("slurmd") and shutil.which("sbatch"):
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable("slurm-wlm is not installed and installing it needs root")
    print("installing slurm-wlm with apt-get (as root) ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"]):  # fmt: skip
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SlurmUnavailable(f"{' '.join(argv)} failed: {done.stderr.strip()[-500:]}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class SlurmCluster:
    """slurmctld and slurmd on this host; :meth:`close` stops them."""

    def __init__(self, root: Path, cpus: int) -> None:
        ensure_installed()
        self.root = root
        self.host = socket.gethostname().split(".")[0]
        (root / "state").mkdir(parents=True)
        (root / "spool").mkdir()
        self.conf = root / "slurm.conf"
        self.conf.write_text(SLURM_CONF.format(
            host=self.host, root=root, cpus=cpus, ctld_port=_free_port(), d_port=_free_port(),
        ))  # fmt: skip
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        try:
            self._start_munge()
            self._start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
            self._start("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
            self._wait_idle()
        except BaseException:
            self.close()
            raise

    def _start_munge(self) -> None:
        if subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
            return
        key = Path("/etc/munge/munge.key")
        if not key.exists() and shutil.which("mungekey"):
            subprocess.run(["mungekey", "--create"], capture_output=True)
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", "munged"], capture_output=True)
        deadline = time.monotonic() + 10
        while subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise SlurmUnavailable("munged does not start (see /var/log/munge/munged.log)")
            time.sleep(0.1)

    def _start(self, name: str, argv: list[str]) -> None:
        log = (self.root / f"{name}.out").open("wb")
        self.processes[name] = subprocess.Popen(argv, env=self.env, stdout=log,
                                                stderr=subprocess.STDOUT)  # fmt: skip

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            shown = self._run(["sinfo", "-h", "-o", "%T"], check=False).strip()
            if shown.startswith("idle"):
                return
            dead = [name for name, p in self.processes.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                tail = (self.root / "slurmctld.log").read_text(errors="replace")[-1500:] \
                    if (self.root / "slurmctld.log").exists() else ""
                raise SlurmUnavailable(
                    f"the Slurm node did not become idle (sinfo: {shown or 'no answer'}; "
                    f"stopped: {dead}); slurmctld log:\n{tail}"
                )  # fmt: skip
            time.sleep(0.2)

    def _run(self, argv: list[str], check: bool = True) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, cwd=self.root)
        if check and done.returncode != 0:
            raise SlurmUnavailable(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def submit(self) -> str:
        """``sbatch --wrap true``; the job id, once sbatch returned."""
        return self._run(["sbatch", "--parsable", "--output=/dev/null", "--wrap", "true"]).strip()

    def states(self, job_ids: list[str]) -> dict[str, str]:
        """The state of each job (``COMPLETED`` when done) as scontrol shows it."""
        argv = ["scontrol", "show", "job", "-o", *job_ids[:1]] if len(job_ids) == 1 else [
            "scontrol", "show", "job", "-o"]  # fmt: skip
        states = {}
        for line in self._run(argv, check=False).splitlines():
            fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
            if fields.get("JobId") in job_ids:
                states[fields["JobId"]] = fields.get("JobState", "")
        return states

    def close(self) -> None:
        stop_all(list(self.processes.values()))


def sbatch_rate(root: Path, count: int, clients: int) -> float:
    """``sbatch --wrap true`` submissions/s from ``clients`` threads, each running sbatch as a
    user would, to a one-node Slurm started for it (8 CPUs) and stopped after."""
    cluster = SlurmCluster(root, cpus=8)
    try:
        cluster.submit()  # warm-up
        started = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(lambda _: cluster.submit(), range(count)))
        return count / (time.perf_counter() - started)
    finally:
        cluster.close()


def stop_all(processes: list[subprocess.Popen[bytes]], timeout: float = 20) -> None:
    """SIGTERM each process (the last started first), SIGKILL those still there after
    ``timeout``."""
    for process in reversed(processes):
        if process.poll() is None:
            process.terminate()
    for process in reversed(processes):
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
