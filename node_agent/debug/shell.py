"""A debug session's commands, run inside a running job's environment (`debug-ssh`).

Each shell or command runs as the job's user, in the job's repository, with the very
environment the entry point was given (its venv first on PATH, its ``--env`` variables, its
``FLEXAI_*`` directories, its marker: so the job's end ends it too). With a terminal asked for,
it runs on a pseudo-terminal of its own, as its session's controlling terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import signal
import struct
import termios
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh

READ_BYTES = 64 * 1024
_SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "HUP": signal.SIGHUP,
            "KILL": signal.SIGKILL, "QUIT": signal.SIGQUIT}  # fmt: skip


@dataclass(frozen=True)
class JobShell:
    """Where and how a debug session's commands run."""

    env: Mapping[str, str]
    cwd: Path
    running: Callable[[], bool]
    """Whether the job still runs here: once not, the session lets nothing new in."""
    popen_options: Mapping[str, Any] = field(default_factory=dict)
    """``subprocess`` arguments that run as the job's user."""
    enter: Callable[[list[str]], list[str]] | None = None
    """How a command gets into the job's sandbox (its namespaces, as its id), where it has
    one."""

    def argv(self, command: str | None) -> list[str]:
        shell = shutil.which("bash") or "/bin/sh"
        argv = [shell, "-c", command] if command else [shell]
        return self.enter(argv) if self.enter is not None else argv


async def run_process(shell: JobShell, process: asyncssh.SSHServerProcess[bytes]) -> None:
    """Serve one SSH session channel: a shell, or the client's command; exit with its code."""
    if not shell.running():
        process.stderr.write(b"flexai: the job is no longer running; the session is closed\n")
        process.exit(255)
        return
    env = dict(shell.env)
    term = process.get_terminal_type()
    if term:
        env["TERM"] = term
    try:
        if term:
            code = await _on_terminal(shell, process, env)
        else:
            code = await _on_pipes(shell, process, env)
    except OSError as error:
        process.stderr.write(f"flexai: cannot start the command: {error}\n".encode())
        code = 127
    process.exit(code if code >= 0 else 128 - code)


async def _on_pipes(
    shell: JobShell, process: asyncssh.SSHServerProcess[bytes], env: dict[str, str]
) -> int:
    child = await asyncio.create_subprocess_exec(
        *shell.argv(process.command), cwd=shell.cwd, env=env, start_new_session=True,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, **shell.popen_options,
    )  # fmt: skip
    assert child.stdin and child.stdout and child.stderr

    def write_input(data: bytes) -> None:
        assert child.stdin
        child.stdin.write(data)

    feeding = asyncio.ensure_future(
        _feed(process, write_input, child.pid, on_eof=child.stdin.close)
    )
    try:
        await asyncio.gather(_copy(child.stdout, process.stdout),
                             _copy(child.stderr, process.stderr))  # fmt: skip
        return await child.wait()
    finally:
        feeding.cancel()
        _hang_up(child)


async def _on_terminal(
    shell: JobShell, process: asyncssh.SSHServerProcess[bytes], env: dict[str, str]
) -> int:
    master, slave = os.openpty()
    _resize(master, process.get_terminal_size())
    try:
        child = await asyncio.create_subprocess_exec(
            *shell.argv(process.command), cwd=shell.cwd, env=env, start_new_session=True,
            stdin=slave, stdout=slave, stderr=slave, preexec_fn=_take_terminal,
            **shell.popen_options,
        )  # fmt: skip
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    os.set_blocking(master, False)
    output_done = asyncio.get_running_loop().create_future()
    _forward_terminal(master, process.stdout, output_done)
    feeding = asyncio.ensure_future(
        _feed(process, lambda data: _write_all(master, data), child.pid, master=master)
    )
    try:
        code = await child.wait()
        with contextlib.suppress(TimeoutError):  # what it printed last, before it went
            await asyncio.wait_for(asyncio.shield(output_done), 2.0)
        return code
    finally:
        feeding.cancel()
        _hang_up(child)
        asyncio.get_running_loop().remove_reader(master)
        os.close(master)


def _hang_up(child: asyncio.subprocess.Process) -> None:
    """The session went before its command ended: the command goes too (as with sshd)."""
    if child.returncode is None:
        with contextlib.suppress(OSError):
            os.killpg(child.pid, signal.SIGHUP)


def _take_terminal() -> None:
    """In the child (a session leader): make its terminal the controlling one."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _forward_terminal(master: int, out: Any, done: asyncio.Future[None]) -> None:
    loop = asyncio.get_running_loop()

    def readable() -> None:
        try:
            data = os.read(master, READ_BYTES)
        except BlockingIOError:
            return
        except OSError:  # EIO: every process holding the terminal is gone
            data = b""
        if data:
            out.write(data)
            return
        loop.remove_reader(master)
        if not done.done():
            done.set_result(None)

    loop.add_reader(master, readable)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            written = os.write(fd, data)
        except BlockingIOError:
            continue
        data = data[written:]


def _resize(master: int, size: tuple[int, int, int, int]) -> None:
    width, height, pixel_width, pixel_height = size
    if width and height:
        packed = struct.pack("HHHH", height, width, pixel_width, pixel_height)
        fcntl.ioctl(master, termios.TIOCSWINSZ, packed)


async def _feed(
    process: asyncssh.SSHServerProcess[bytes], write: Callable[[bytes], None], pid: int,
    master: int | None = None, on_eof: Callable[[], None] | None = None,
) -> None:  # fmt: skip
    """The client's input to the command; its window changes and signals too."""
    while True:
        try:
            data = await process.stdin.read(READ_BYTES)
        except asyncssh.TerminalSizeChanged as change:
            if master is not None:
                _resize(master, (change.width, change.height, change.pixwidth,
                                 change.pixheight))  # fmt: skip
            continue
        except asyncssh.SignalReceived as received:
            with contextlib.suppress(OSError):
                os.killpg(pid, _SIGNALS.get(received.signal, signal.SIGTERM))
            continue
        except asyncssh.BreakReceived:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGINT)
            continue
        if not data:
            if on_eof is not None:
                on_eof()
            return
        with contextlib.suppress(OSError):
            write(data)


async def _copy(source: asyncio.StreamReader, sink: Any) -> None:
    while data := await source.read(READ_BYTES):
        sink.write(data)
        await sink.drain()
