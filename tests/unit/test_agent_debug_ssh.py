"""The agent's SSH server of a debug session, over a socket pair (no control plane)."""

from __future__ import annotations

import asyncio
import functools
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from node_agent.debug.sessions import DebugSessions, JobSSHServer, environ_of
from node_agent.debug.shell import JobShell, run_process


def job_shell(tmp_path: Path, running: Callable[[], bool] = lambda: True) -> JobShell:
    env = {"PATH": "/usr/bin:/bin", "SOME_ENV": "from-the-job", "HOME": str(tmp_path)}
    return JobShell(env=env, cwd=tmp_path, running=running)


@asynccontextmanager
async def session(
    shell: JobShell, client_key: asyncssh.SSHKey | None = None
) -> AsyncIterator[asyncssh.SSHClientConnection]:
    """A client connected to a session server that lets in ``allowed`` (its key) only."""
    allowed = asyncssh.generate_private_key("ssh-ed25519")
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    ours, theirs = tcp_pair()  # asyncssh's client wants a peer address
    server = asyncssh.run_server(
        theirs, server_factory=functools.partial(JobSSHServer, allowed, shell),
        server_host_keys=[host_key], process_factory=functools.partial(run_process, shell),
        encoding=None, agent_forwarding=False, x11_forwarding=False,
    )  # fmt: skip
    trusted = asyncssh.import_known_hosts(
        f"* {host_key.export_public_key().decode()}"
    )
    client = asyncssh.run_client(
        ours, known_hosts=trusted, client_keys=[client_key or allowed], username="anyone",
        agent_path=None,
    )  # fmt: skip
    results = await asyncio.gather(server, client, return_exceptions=True)
    for result in reversed(results):  # the client's error first: it is what a user reads
        if isinstance(result, BaseException):
            raise result
    connection = results[1]
    assert isinstance(connection, asyncssh.SSHClientConnection)
    try:
        yield connection
    finally:
        connection.close()
        for end in (ours, theirs):
            end.close()


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        ours = socket.create_connection(listener.getsockname())
        theirs, _ = listener.accept()
    return ours, theirs


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def test_a_command_runs_in_the_jobs_directory_with_its_environment_and_exit_status(
    tmp_path: Path,
) -> None:
    async def scenario() -> asyncssh.SSHCompletedProcess:
        async with session(job_shell(tmp_path)) as client:
            return await client.run('echo "$SOME_ENV"; pwd; exit 7', encoding="utf-8")

    result = run(scenario())
    assert result.stdout.splitlines() == ["from-the-job", str(tmp_path)]
    assert result.exit_status == 7


def test_input_reaches_the_command_and_its_errors_come_back_apart(tmp_path: Path) -> None:
    async def scenario() -> asyncssh.SSHCompletedProcess:
        async with session(job_shell(tmp_path)) as client:
            return await client.run("cat; echo oops >&2", input="line\n", encoding="utf-8")

    result = run(scenario())
    assert (result.stdout, result.stderr, result.exit_status) == ("line\n", "oops\n", 0)


def test_a_terminal_session_gets_a_terminal_and_the_clients_term(tmp_path: Path) -> None:
    async def scenario() -> asyncssh.SSHCompletedProcess:
        async with session(job_shell(tmp_path)) as client:
            return await client.run("test -t 0 && echo tty:$TERM", term_type="xterm-256color",
                                    encoding="utf-8")  # fmt: skip

    result = run(scenario())
    assert "tty:xterm-256color" in result.stdout
    assert result.exit_status == 0


def test_a_key_other_than_the_sessions_is_refused(tmp_path: Path) -> None:
    stranger = asyncssh.generate_private_key("ssh-ed25519")

    async def scenario() -> None:
        async with session(job_shell(tmp_path), client_key=stranger):
            pass

    with pytest.raises(asyncssh.PermissionDenied):
        run(scenario())


def test_a_port_of_the_nodes_loopback_is_forwarded_and_no_other_host(tmp_path: Path) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello from the job\n")
        await writer.drain()
        writer.close()

    async def scenario() -> bytes:
        listener = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        async with listener, session(job_shell(tmp_path)) as client:
            reader, writer = await client.open_connection("localhost", port)
            greeting = await reader.read()
            writer.close()
            with pytest.raises(asyncssh.ChannelOpenError, match="loopback"):
                await client.open_connection("192.0.2.1", port)
            return bytes(greeting)

    assert run(scenario()) == b"hello from the job\n"


def test_once_the_job_ended_a_new_command_and_forward_are_refused(tmp_path: Path) -> None:
    running = [True]

    async def scenario() -> asyncssh.SSHCompletedProcess:
        async with session(job_shell(tmp_path, lambda: running[0])) as client:
            running[0] = False
            with pytest.raises(asyncssh.ChannelOpenError, match="no longer running"):
                await client.open_connection("localhost", 9)
            return await client.run("echo should-not-run", encoding="utf-8")

    result = run(scenario())
    assert "should-not-run" not in result.stdout
    assert "no longer running" in result.stderr
    assert result.exit_status == 255


def test_the_environment_of_a_job_found_running_is_read_from_its_process() -> None:
    import subprocess

    child = subprocess.Popen(["sleep", "10"], env={"SOME_ENV": "a=b", "PATH": "/usr/bin:/bin"})
    try:  # until the child has exec'd, /proc shows the environment it forked with
        wanted = {"SOME_ENV": "a=b", "PATH": "/usr/bin:/bin"}
        deadline = time.monotonic() + 10
        while environ_of(child.pid) != wanted and time.monotonic() < deadline:
            time.sleep(0.01)
        assert environ_of(child.pid) == wanted
    finally:
        child.kill()
        child.wait()
    assert environ_of(child.pid) is None


class StoppingServer:
    """A control plane that stops: it answers every offers poll at once, with nothing."""

    def __init__(self) -> None:
        self.polls = 0

    def debug_session_offers(self, node_id: str, wait: float = 0.0) -> list[dict[str, Any]]:
        self.polls += 1
        return []


def test_an_offers_poll_answered_at_once_with_nothing_is_asked_again_after_a_pause() -> None:
    server = StoppingServer()
    sessions = DebugSessions(
        server,  # type: ignore[arg-type]
        lambda: "node-1", lambda job_id, index: None, long_poll=20, retry_pause=0.2,
    )  # fmt: skip
    sessions.start()
    time.sleep(0.5)
    sessions.stop()
    assert 1 <= server.polls <= 4  # not a poll every few microseconds


def test_the_agents_ssh_server_starts_without_cryptographys_dsa_warnings() -> None:
    """cryptography 51 warns on each look at its DSA classes, and asyncssh looks five times on
    import: an agent's stderr (and every error it prints) began with ten lines about DSA."""
    code = (
        "import node_agent.debug.sessions\n"
        "from cryptography.hazmat.primitives.asymmetric import dsa\n"
        "dsa.DSAPrivateKey  # not asyncssh's: still shown where cryptography warns\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", code],
        cwd=Path(__file__).parents[2], capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "asyncssh" not in done.stderr
    assert done.stderr.count("DSA is deprecated") <= 1
