"""Debug sessions into this node's running jobs (`flexai training debug-ssh`), with no inbound
port: the agent long-polls the sessions it is asked to take, opens a WebSocket to the control
plane for each, and runs an SSH server (asyncssh) on the relayed bytes.

Each session has a host key of its own, made here and sent to the CLI through the control
plane, and lets in one key only: the ephemeral one the user's CLI made for it. Shells and
commands run in the job's environment (:mod:`node_agent.debug.shell`); ports may be forwarded
to the node's loopback only (``ssh -L 6006:localhost:6006``). Once the job's entry point ended,
or the job is no longer ``in progress``, the session refuses new channels and is closed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncssh
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import WebSocketException

from node_agent.client import ControlPlaneClient
from node_agent.debug.shell import JobShell, run_process
from node_agent.models import IN_PROGRESS
from node_agent.run.jobrun import shim_pid_of
from node_agent.run.jobuser import JobUser
from node_agent.run.processes import is_alive
from node_agent.supervisor import JobSupervisor

log = logging.getLogger("flexai.agent")

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost"})
LOGIN_TIMEOUT_S = 60.0
JOB_CHECK_S = 1.0
READ_BYTES = 64 * 1024
ShellFinder = Callable[[str, int], JobShell | None]


@dataclass(frozen=True)
class Offer:
    """A session this node is asked to take (``GET .../debug-sessions``)."""

    id: str
    job_id: str
    node_index: int
    public_key: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Offer:
        return cls(str(data["id"]), str(data["job_id"]), int(data.get("node_index") or 0),
                   str(data["public_key"]))  # fmt: skip


STARTING_PATIENCE_S = 10.0
"""How long a session waits for a job's entry point that this node is still starting."""


def job_shell(
    supervisor: JobSupervisor | None, node_index: int, job_user: JobUser | None
) -> JobShell | None:
    """How to run commands in the job this supervisor runs; None when it runs nothing here."""
    if supervisor is None or supervisor.assignment.node_index != node_index:
        return None
    dirs = supervisor.dirs

    def running() -> bool:
        if not supervisor.is_alive() or supervisor.assignment.status != IN_PROGRESS:
            return False
        shim_pid = shim_pid_of(dirs)
        return shim_pid is not None and is_alive(shim_pid, dirs.marker)

    shim_pid = shim_pid_of(dirs)
    env = supervisor.job_env
    if env is None:  # a job this agent found running after a restart: its shim's environment
        env = environ_of(shim_pid) if shim_pid is not None else None
    if env is None or shim_pid is None or not running():
        return None
    user = supervisor.confinement.user or job_user
    sandbox = user.sandbox if user is not None else None
    if sandbox is not None:  # into the job's own namespaces and cgroup, as its own id
        return JobShell(env=sandbox.env(env), cwd=dirs.repo, running=running,
                        enter=lambda argv: sandbox.enter(shim_pid, argv, cwd=dirs.repo))
    options = user.popen_options() if user is not None else {}
    return JobShell(env=env, cwd=dirs.repo, running=running, popen_options=options)


def environ_of(pid: int) -> dict[str, str] | None:
    """A process's environment, from ``/proc`` (None when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as source:
            raw = source.read()
    except OSError:
        return None
    pairs = (entry.partition(b"=") for entry in raw.split(b"\0") if b"=" in entry)
    return {key.decode(errors="replace"): value.decode(errors="replace")
            for key, _, value in pairs}  # fmt: skip


class JobSSHServer(asyncssh.SSHServer):
    """One session's SSH server: one client key, the job's loopback only."""

    def __init__(self, client_key: asyncssh.SSHKey, shell: JobShell) -> None:
        self.client_key = client_key
        self.shell = shell

    def begin_auth(self, username: str) -> bool:
        return True  # always: a key is needed

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return bool(key.public_data == self.client_key.public_data)

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> bool:
        if not self.shell.running():
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, "the job is no longer running"
            )
        if dest_host.lower() not in LOOPBACK_HOSTS:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                "only the node's loopback can be reached (-L PORT:localhost:PORT)",
            )
        return True

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False


async def serve_session(
    offer: Offer, shell: JobShell | None, url: str, headers: dict[str, str],
    tls: ssl.SSLContext | None = None,
) -> None:  # fmt: skip
    """Take one session: the WebSocket (``wss://`` verified with ``tls``), the host key, then
    SSH until one side ends it."""
    async with connect(url, additional_headers=headers, max_size=None, compression=None,
                       open_timeout=15, ssl=tls if url.startswith("wss:") else None,
                       ) as websocket:  # fmt: skip
        if shell is None:
            await websocket.send(json.dumps({"refused": "the job is not running on this node"}))
            return
        host_key = asyncssh.generate_private_key("ssh-ed25519")
        public = host_key.export_public_key().decode().strip()
        await websocket.send(json.dumps({"host_key": public}))
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        bridge = asyncio.ensure_future(_bridge(websocket, ours))
        try:
            await _run_ssh(offer, shell, host_key, theirs)
        finally:
            bridge.cancel()
            ours.close()
            theirs.close()


async def _run_ssh(
    offer: Offer, shell: JobShell, host_key: asyncssh.SSHKey, sock: socket.socket
) -> None:
    client_key = asyncssh.import_public_key(offer.public_key)
    try:
        connection = await asyncssh.run_server(
            sock, server_factory=functools.partial(JobSSHServer, client_key, shell),
            server_host_keys=[host_key], process_factory=functools.partial(run_process, shell),
            encoding=None, agent_forwarding=False, x11_forwarding=False, allow_scp=False,
            login_timeout=LOGIN_TIMEOUT_S, keepalive_interval=30,
        )  # fmt: skip
    except (asyncssh.Error, OSError, TimeoutError) as error:
        log.warning("debug session %s: no SSH session (%s)", offer.id, error or "closed")
        return
    log.info("debug session %s into job %s: open", offer.id, offer.job_id)
    watching = asyncio.ensure_future(_close_when_job_ends(connection, shell))
    try:
        await connection.wait_closed()
    finally:
        watching.cancel()
        log.info("debug session %s into job %s: closed", offer.id, offer.job_id)


async def _close_when_job_ends(connection: asyncssh.SSHServerConnection, shell: JobShell) -> None:
    while shell.running():
        await asyncio.sleep(JOB_CHECK_S)
    connection.disconnect(asyncssh.DISC_BY_APPLICATION, "the job is no longer running")


async def _bridge(websocket: ClientConnection, sock: socket.socket) -> None:
    """Bytes between the WebSocket and the SSH server's socket, until one of them ends."""
    loop = asyncio.get_running_loop()

    async def inbound() -> None:
        with contextlib.suppress(WebSocketException):
            async for message in websocket:
                data = message if isinstance(message, bytes) else message.encode()
                await loop.sock_sendall(sock, data)

    async def outbound() -> None:
        with contextlib.suppress(OSError, WebSocketException):
            while data := await loop.sock_recv(sock, READ_BYTES):
                await websocket.send(data)

    tasks = [asyncio.ensure_future(inbound()), asyncio.ensure_future(outbound())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        await websocket.close()


class DebugSessions:
    """The agent's debug sessions: a long poll for new ones, and an event loop (in a thread
    of its own) that serves each; each failure is one session's alone."""

    def __init__(
        self, client: ControlPlaneClient, node_id: Callable[[], str], shell_for: ShellFinder,
        long_poll: float = 20.0, retry_pause: float = 1.0,
    ) -> None:  # fmt: skip
        self.client = client
        self.node_id = node_id
        self.shell_for = shell_for
        self.long_poll = long_poll
        self.retry_pause = retry_pause
        self._taken: collections.deque[str] = collections.deque(maxlen=1000)
        self._stopping = threading.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._run, name="debug-sessions", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        failing = ""
        while not self._stopping.is_set():
            asked = loop.time()
            try:
                offers = await self._poll()
            except Exception as error:  # the poll outlives its errors, as the agent's do
                if self._stopping.is_set():
                    break  # a poll the shutdown cut short is no failure to report
                message = str(error) or type(error).__name__
                if message != failing:
                    log.warning("debug sessions poll failed: %s", message)
                failing = message
                await asyncio.sleep(self.retry_pause)
                continue
            failing = ""
            fresh = [offer for offer in offers if offer.id not in self._taken]
            for offer in fresh:
                self._taken.append(offer.id)
                task = asyncio.create_task(self._serve(offer))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            if offers and not fresh:  # taken, not yet connected: the server lists them still
                await asyncio.sleep(0.2)
            elif not offers and loop.time() - asked < self.long_poll / 2:
                await asyncio.sleep(self.retry_pause)  # a server that stops answers at once
        for task in list(self._tasks):
            task.cancel()

    async def _poll(self) -> list[Offer]:
        """One long poll, in a daemon thread: the agent's exit never waits for its answer."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[list[dict[str, Any]]] = loop.create_future()

        def ask() -> None:
            try:
                found = self.client.debug_session_offers(self.node_id(), wait=self.long_poll)
            except Exception as error:  # handed to the loop
                loop.call_soon_threadsafe(_settle, answer, None, error)
            else:
                loop.call_soon_threadsafe(_settle, answer, found, None)

        threading.Thread(target=ask, name="debug-sessions-poll", daemon=True).start()
        return [Offer.from_json(item) for item in await answer]

    async def _serve(self, offer: Offer) -> None:
        path = f"/v1/agent/debug-sessions/{offer.id}"
        url, headers = self.client.websocket_target(path)
        try:
            await serve_session(offer, await self._shell(offer), url, headers, self.client.tls)
        except Exception as error:  # one session's failure is its own
            log.warning("debug session %s: %s", offer.id, error or type(error).__name__)


    async def _shell(self, offer: Offer) -> JobShell | None:
        """Where the session's commands run; a job the control plane has started but whose
        entry point this node is still starting (its sandbox being set up) is waited for."""
        deadline = asyncio.get_running_loop().time() + STARTING_PATIENCE_S
        while (shell := self.shell_for(offer.job_id, offer.node_index)) is None:
            if asyncio.get_running_loop().time() >= deadline:
                return None
            await asyncio.sleep(0.1)
        return shell


def _settle(
    future: asyncio.Future[Any], result: Any, error: BaseException | None
) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
