"""The parts a soak kills (``bench/soak.py``): a local fleet it starts itself, or an operator's
own deployment, whose parts it kills with the commands the operator gives.

Locally: PostgreSQL is the machine's (a throwaway database on the server of ``tests/pg.py``),
reached by every replica through a TCP proxy in this process; SeaweedFS (``weed server -s3``)
holds the artifacts; R ``flexai server`` replicas share both, and A ``flexai agent`` processes
each talk to one replica (agent i to replica i mod R). The faults:

- ``replica``: ``kill -9`` of one replica (in turn), started again after ``down`` seconds;
- ``agent``: ``kill -9`` of one agent (in turn; its jobs' processes live on), started again
  after each of ``agent_down`` seconds in turn: by default 2 s (it finds its jobs again) and
  10 s (past the soak's node timeout of 6 s: the server loses the node, its running jobs are
  retried elsewhere, and the agent, back, ends what it no longer holds);
- ``postgres``: a restart as its clients see it: every connection dropped and new ones refused
  for ``down`` seconds (the proxy), or a real ``pg_ctlcluster ... restart -m immediate`` given
  with ``--postgres-restart`` (it restarts the whole server: run nothing else beside it);
- ``s3``: SeaweedFS killed (``SIGKILL``) for ``s3_down`` seconds, then started again.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx

from tests.pg import fresh_database
from tests.s3 import REGION, free_ports, running_seaweedfs
from tests.tcp_proxy import TcpProxy

ROOT = Path(__file__).resolve().parents[1]

FAULT_KINDS = ("replica", "agent", "postgres", "s3")
SERVER_ARGS = ["--node-timeout", "6"]
"""A node is lost 6 s after its last heartbeat (every 2 s): an agent down longer is lost (a
later ``--server-arg --node-timeout N`` overrides it)."""
START_TIMEOUT_S = 90.0


@dataclass
class Process:
    """One part of the fleet as a process this soak started, and can kill and start again."""

    name: str
    command: list[str]
    env: dict[str, str]
    log: Path
    ready: Callable[[], bool] = lambda: True
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.popen = subprocess.Popen(self.command, env=self.env, stdout=log,
                                          stderr=subprocess.STDOUT, cwd=self.log.parent,
                                          stdin=subprocess.DEVNULL)  # fmt: skip
        self.starts += 1
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.ready():
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start; see {self.log}")
            time.sleep(0.1)

    def kill(self) -> None:
        """``kill -9``: no goodbye, no last report."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait()

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Fleet:
    """What the soak talks to (``urls``: the replicas; ``token``: an admin's) and the faults
    it can inject, each a callable that takes a part away, waits, and brings it back."""

    urls: list[str]
    token: str
    config: Path
    """A client config (``FLEXAI_CONFIG``) naming the first replica, for `flexai admin verify`."""
    faults: dict[str, Callable[[int], str]] = field(default_factory=dict)
    """Per kind: inject the n-th fault of that kind; a line saying what was done."""
    logs: list[Path] = field(default_factory=list)
    repository: str = ""
    """The job's repository as the nodes reach it."""


def _healthy(url: str) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    return ready


def _python_env(root: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
           "FLEXAI_CONFIG": str(root / "config.json"), "PIP_NO_INDEX": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # fmt: skip
    env.pop("FLEXAI_API_URL", None)
    env.pop("FLEXAI_TOKEN", None)
    return env


def _kill_and_restart(part: Process, down: float) -> str:
    part.kill()
    time.sleep(down)
    started = time.monotonic()
    part.start()
    return f"kill -9 {part.name}; started again after {down:g} s (up in " \
        f"{time.monotonic() - started:.1f} s)"  # fmt: skip


@contextmanager
def local_fleet(root: Path, *, replicas: int, agents: int, accels: int, down: float,
                agent_down: list[float], s3_down: float, postgres_restart: str | None,
                server_args: list[str], repository: str) -> Iterator[Fleet]:  # fmt: skip
    """Start PostgreSQL's database, SeaweedFS, the replicas and the agents; stop them after."""
    root.mkdir(parents=True, exist_ok=True)
    env = _python_env(root)
    flexai = [sys.executable, "-m", "cli.main"]
    with ExitStack() as stack:
        database_url = stack.enter_context(fresh_database("flexai_soak"))
        address = urlparse(database_url)
        proxy = TcpProxy(address.hostname or "127.0.0.1", address.port or 5432)
        stack.callback(proxy.close)
        store = stack.enter_context(running_seaweedfs(root / "s3"))
        bucket = stack.enter_context(store.bucket())
        parts: list[Process] = []

        def stop_parts() -> None:
            for part in reversed(parts):
                part.stop()

        stack.callback(stop_parts)
        servers: list[Process] = []
        for index, port in enumerate(free_ports(replicas)):
            url = f"http://127.0.0.1:{port}"
            command = [*flexai, "server", "--data-dir", str(root / f"replica-{index}"), "--port",
                       str(port), "--database-url", proxy.proxied(database_url),
                       "--artifact-store", f"s3://{bucket}/soak", "--s3-endpoint-url",
                       store.endpoint_url, "--s3-region", REGION, *SERVER_ARGS, *server_args,
                       *(["--no-client-config"] if index else [])]  # fmt: skip
            servers.append(Process(f"replica-{index}", command, {**env, **store.env()},
                                   root / f"replica-{index}.log", _healthy(url)))  # fmt: skip
            parts.append(servers[-1])
            servers[-1].start()
        urls = [f"http://127.0.0.1:{p.command[p.command.index('--port') + 1]}" for p in servers]
        token = json.loads((root / "config.json").read_text())["token"]
        workers: list[Process] = []
        me = pwd.getpwuid(os.geteuid()).pw_name
        for index in range(agents):
            name = f"soak-node-{index}"
            token_file = root / f"{name}.token"
            made = httpx.post(f"{urls[0]}/v1/admin/node-tokens", json={"node": name},
                              headers={"Authorization": f"Bearer {token}"}, timeout=30)
            made.raise_for_status()
            token_file.write_text(made.json()["token"] + "\n")
            token_file.chmod(0o600)
            command = [*flexai, "agent", "--server", urls[index % len(urls)], "--accels",
                       str(accels), "--name", name, "--work-dir", str(root / name),
                       "--job-user", me, "--token-file", str(token_file)]  # fmt: skip
            workers.append(Process(name, command, env, root / f"{name}.log"))
            parts.append(workers[-1])
            workers[-1].start()

        def restart_postgres(count: int) -> str:
            if postgres_restart:
                subprocess.run(shlex.split(postgres_restart), check=True, capture_output=True)
                return f"PostgreSQL restarted: {postgres_restart}"
            proxy.cut("refuse")
            time.sleep(down)
            proxy.restore()
            return f"PostgreSQL away for {down:g} s: every connection dropped, new ones refused"

        def kill_s3(count: int) -> str:
            store.stop()
            time.sleep(s3_down)
            store.start()
            return f"SeaweedFS killed (SIGKILL) for {s3_down:g} s, then started again"

        yield Fleet(
            urls=urls, token=token, config=root / "config.json",
            faults={
                "replica": lambda n: _kill_and_restart(servers[n % len(servers)], down),
                "agent": lambda n: _kill_and_restart(
                    workers[n % len(workers)], agent_down[n // len(workers) % len(agent_down)]),
                "postgres": restart_postgres,
                "s3": kill_s3,
            },
            logs=[part.log for part in parts], repository=repository,
        )  # fmt: skip


def remote_fleet(urls: list[str], token: str, config: Path, commands: dict[str, str],
                 repository: str) -> Fleet:  # fmt: skip
    """An operator's deployment: the faults are the shell commands given per kind (each kills
    a part and, once it returns, the part is back or on its way back)."""

    def run(command: str) -> Callable[[int], str]:
        def inject(count: int) -> str:
            done = subprocess.run(command, shell=True, capture_output=True, text=True)
            return f"`{command}` exited {done.returncode}"

        return inject

    config.write_text(json.dumps({"api_url": urls[0], "token": token}))
    config.chmod(0o600)
    return Fleet(urls=urls, token=token, config=config,
                 faults={kind: run(command) for kind, command in commands.items()},
                 repository=repository)  # fmt: skip
