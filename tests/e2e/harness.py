"""The end-to-end harness: a `flexai server` process and a `flexai agent` process on SQLite
and on PostgreSQL, driven through the real `flexai` CLI and real git."""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.pg import fresh_database
from tests.support import make_repo

FLEXAI = [sys.executable, "-m", "cli.main"]
ROOT = Path(__file__).resolve().parents[2]
TERMINAL = {"rejected", "succeeded", "failed", "stopped", "stop failed"}
TLS = ssl.create_default_context()
"""Given to each one-off request (``verify``): httpx would otherwise build a context of its
own each time (about 25 ms of CPU), for every poll of ``wait_for``. A cluster speaks HTTP
unless it is given a certificate (then its ``verify`` trusts its CA)."""


@dataclass(frozen=True)
class ServerCertificate:
    """The server's certificate and key (``--tls-cert``, ``--tls-key``) and the CA that signed
    it, which the CLI (``FLEXAI_CA_FILE``) and the agent (``--ca-file``) are given."""

    cert: Path
    key: Path
    ca: Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Cluster:
    """One server and one agent; ``flexai`` runs the CLI against them."""

    root: Path
    api_url: str
    env: dict[str, str]
    token: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    commands: dict[str, list[str]] = field(default_factory=dict)
    """Each part's command line (``server``, ``agent``, ``agent-<name>``), to start it again."""
    parts: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    envs: dict[str, dict[str, str]] = field(default_factory=dict)
    verify: ssl.SSLContext = TLS
    """How the tests' own requests verify the server (over https: its CA)."""

    def flexai(self, *args: str, check: bool = True, timeout: float = 120,
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        result = subprocess.run(
            [*FLEXAI, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
            cwd=cwd or self.root,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise AssertionError(
                f"flexai {' '.join(args)} exited {result.returncode}\n"
                f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
            )
        return result

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.request(method, self.api_url + path, headers=headers, timeout=30,
                             verify=self.verify, **kwargs)  # fmt: skip

    def inspect(self, name: str) -> dict[str, Any]:
        response = self.api("GET", f"/v1/jobs/{name}")
        response.raise_for_status()
        document: dict[str, Any] = response.json()
        return document

    def wait_for(
        self, name: str, statuses: set[str], timeout: float = 120,
        inspect: Callable[[str], dict[str, Any]] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Until the job is in one of ``statuses`` (``inspect``: how to read it, by default
        as the admin)."""
        deadline = time.monotonic() + timeout
        while True:
            document = (inspect or self.inspect)(name)
            if document["status"] in statuses:
                return document
            if document["status"] in TERMINAL or time.monotonic() > deadline:
                raise AssertionError(
                    f"job {name} is {document['status']!r}, waited for {statuses}:\n"
                    + json.dumps(document, indent=2)[-4000:]
                    + "\nlogs:\n"
                    + self.flexai("training", "logs", name, check=False).stdout[-3000:]
                    + "\nagent log:\n" + self.log("agent")[-3000:]
                )  # fmt: skip
            time.sleep(0.1)

    def kill(self, part: str) -> None:
        """``kill -9`` of one part (``server``, ``agent`` or ``agent-<name>``)."""
        process = self.parts[part]
        process.kill()
        process.wait()
        self.processes.remove(process)

    def restart(self, part: str) -> None:
        """Start a killed part again with its command line (same port, data, work dir)."""
        _start(self, part, self.commands[part], self.envs[part])
        if part == "server":
            _wait(self._healthy, "server restart", self)

    def _healthy(self) -> bool:
        try:
            return httpx.get(self.api_url + "/health", verify=self.verify).status_code == 200
        except httpx.HTTPError:
            return False

    def node_token(self, name: str) -> str:
        """A new token for node ``name``'s agent, made with the admin's token."""
        response = self.api("POST", "/v1/admin/node-tokens", json={"node": name})
        response.raise_for_status()
        token: str = response.json()["token"]
        return token

    def node_token_file(self, name: str) -> Path:
        """A file (mode 0600) holding a new token of node ``name``, for ``--token-file``."""
        path = self.root / f"node-{name}.token"
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(self.node_token(name) + "\n")
        return path

    def start_agent(self, name: str, accels: int = 1, *flags: str) -> str:
        """Another agent on this machine, as node ``name``; returns its part's name."""
        part = f"agent-{name}"
        _start(self, part, ["agent", "--server", self.api_url, "--accels", str(accels),
                            "--name", name, "--work-dir", str(self.root / part),
                            "--token-file", str(self.node_token_file(name)),
                            "--job-user", pwd.getpwuid(os.geteuid()).pw_name,
                            "--address", "127.0.0.1", *flags], self.env)  # fmt: skip
        self.wait_for_node(name)
        return part

    def wait_for_node(self, name: str, alive: bool = True, timeout: float = 60) -> None:
        def seen() -> bool:
            nodes = self.api("GET", "/v1/nodes").json().get("nodes", [])
            return any(node["name"] == name and node["alive"] == alive for node in nodes)

        _wait(seen, f"node {name} {'alive' if alive else 'offline'}", self, timeout)

    def log(self, part: str) -> str:
        path = self.root / f"{part}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _start(cluster: Cluster, part: str, args: list[str], env: dict[str, str]) -> None:
    log = (cluster.root / f"{part}.log").open("ab")
    process = subprocess.Popen(
        [*FLEXAI, *args], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cluster.root
    )
    cluster.processes.append(process)
    cluster.commands[part] = args
    cluster.envs[part] = env
    cluster.parts[part] = process


def _wait(condition: Callable[[], bool], what: str, cluster: Cluster, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline or any(p.poll() is not None for p in cluster.processes):
            cluster.stop()  # no process outlives a failed start
            raise RuntimeError(
                f"{what} did not happen\nserver log:\n{cluster.log('server')[-4000:]}"
                f"\nagent log:\n{cluster.log('agent')[-4000:]}"
            )
        time.sleep(0.1)


def start_server(
    root: Path,
    database_url: str | None,
    *,
    scheduling_patience: float = 5,
    server_flags: tuple[str, ...] = (),
    server_env: dict[str, str] | None = None,
    tls: ServerCertificate | None = None,
) -> Cluster:
    """A server alone, ready, with the admin token of the client config it wrote
    (``server_env``: what the server's environment holds besides, e.g. AWS credentials;
    ``tls``: it serves HTTPS, and the CLI trusts the CA)."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {
        **os.environ,
        "FLEXAI_CONFIG": str(root / "config.json"),
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        # Tests never reach the internet: pip installs from local wheels only.
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(root / "wheels"),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env.pop("FLEXAI_API_URL", None)
    env.pop("FLEXAI_TOKEN", None)
    (root / "wheels").mkdir(exist_ok=True)
    cluster = Cluster(root=root, api_url=f"http://127.0.0.1:{port}", env=env, token="")
    server_args = ["server", "--data-dir", str(root / "data"), "--port", str(port),
                   "--scheduling-patience", f"{scheduling_patience:g}"]  # fmt: skip
    if database_url:
        server_args += ["--database-url", database_url]
    if tls is not None:
        server_args += ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key)]
        cluster.api_url = f"https://127.0.0.1:{port}"
        cluster.verify = ssl.create_default_context(cafile=str(tls.ca))
        env["FLEXAI_CA_FILE"] = str(tls.ca)
    server_args += server_flags
    _start(cluster, "server", server_args, {**env, **(server_env or {})})
    config = root / "config.json"

    def ready() -> bool:
        try:
            if not config.exists():
                return False
            return httpx.get(cluster.api_url + "/health", verify=cluster.verify).status_code == 200
        except httpx.HTTPError:
            return False

    _wait(ready, "server start", cluster)
    cluster.token = json.loads(config.read_text())["token"]
    return cluster


def start_cluster(
    root: Path,
    database_url: str | None,
    accels: int = 1,
    *,
    job_user: str | None = None,
    job_python: str | None = None,
    token_in_environment: bool = False,
    agent_flags: tuple[str, ...] = (),
    server_flags: tuple[str, ...] = (),
    server_env: dict[str, str] | None = None,
    tls: ServerCertificate | None = None,
) -> Cluster:
    """A server, then an agent whose jobs run as ``job_user`` (default: the tests' own user,
    as pytest's temporary directories are that user's alone; ``""``: each as an id of its own,
    as the README deploys it). The agent's node token (an admin made it) is in a file, or in
    ``FLEXAI_TOKEN`` with ``token_in_environment``. With ``tls``, the agent is given the CA
    with ``--ca-file`` alone (no environment variable, no client config)."""
    cluster = start_server(root, database_url, server_flags=server_flags, server_env=server_env,
                           tls=tls)  # fmt: skip
    env = cluster.env
    agent_args = ["agent", "--server", cluster.api_url, "--accels", str(accels),
                  "--name", "test-node", "--work-dir", str(root / "agent")]  # fmt: skip
    if job_user != "":
        agent_args += ["--job-user", job_user or pwd.getpwuid(os.geteuid()).pw_name]
    if job_python:
        agent_args += ["--job-python", job_python]
    agent_args += agent_flags
    agent_env = env
    if tls is not None:
        agent_args += ["--ca-file", str(tls.ca)]
        agent_env = {**env, "FLEXAI_CONFIG": str(root / "agent-has-no-config.json")}
        agent_env.pop("FLEXAI_CA_FILE")
    if token_in_environment:
        agent_env = {**env, "FLEXAI_TOKEN": cluster.node_token("test-node")}
    else:
        agent_args += ["--token-file", str(cluster.node_token_file("test-node"))]
    _start(cluster, "agent", agent_args, agent_env)

    def registered() -> bool:
        nodes = cluster.api("GET", "/v1/nodes").json().get("nodes", [])
        return any(node["name"] == "test-node" and node["alive"] for node in nodes)

    _wait(registered, "agent registration", cluster)
    return cluster


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:  # fmt: skip
    root = tmp_path_factory.mktemp(f"cluster-{request.param}")
    with ExitStack() as stack:
        database_url = None
        if request.param == "postgres":
            database_url = stack.enter_context(fresh_database("flexai_e2e"))
        cluster = start_cluster(root, database_url)
        stack.callback(cluster.stop)
        yield cluster


@pytest.fixture
def repo_factory(tmp_path: Path) -> Callable[[dict[str, str]], Path]:
    counter = iter(range(1000))

    def factory(files: dict[str, str]) -> Path:
        return make_repo(tmp_path / f"repo-{next(counter)}", files)

    return factory


@pytest.fixture
def job_name(request: pytest.FixtureRequest) -> str:
    """A name unique to the test, within the 63-character limit."""
    return f"t-{uuid.uuid4().hex[:8]}"
