"""Opens an SSH session into a running Training Job's environment.

Without a command: an interactive shell. With `-- COMMAND [ARGS...]`: runs it, prints its
output, and exits with its exit status. It runs on the job's node (--node-index K for another
node of a multi-node job), as the job's user, in the job's repository, with the job's
environment: its virtual environment first on PATH, its --env and --secret variables,
FLEXAI_OUTPUT_DIR and the other FLEXAI_* directories, CUDA_VISIBLE_DEVICES.

Forward a local port to one of the node's with -L (TensorBoard: `-L 6006:localhost:6006`, and
-N for no shell); only the node's loopback can be reached. Only the job's owner (or an admin)
may open a session, and only while the job is `in progress`; the session ends when the job
does. Each session is recorded in the job's history (DebugSessionOpened, DebugSessionClosed).

The node needs no open port: the session goes through the control plane. It runs your OpenSSH
client (`ssh`: install openssh-client), with a key made for this session alone and the host key
the node made for it; both are thrown away afterwards.

Examples:
  flexai training debug-ssh gpt2-ft
  flexai training debug-ssh gpt2-ft -- nvidia-smi
  flexai training debug-ssh gpt2-ft -N -L 6006:localhost:6006
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cli.commands import add_name
from cli.errors import CliError, UsageError

READY_PATIENCE_S = 45.0
HOST_ALIAS = "flexai-debug-session"


def configure(parser: argparse.ArgumentParser) -> None:
    add_name(parser)
    parser.add_argument(
        "--node-index", type=int, default=0, metavar="INDEX",
        help="which node of a multi-node job (default 0)",
    )  # fmt: skip
    parser.add_argument(
        "-L", "--local-forward", action="append", default=[], metavar="[BIND:]PORT:HOST:PORT",
        help="forward a local port to a port of the node's loopback (repeatable), as ssh -L",
    )  # fmt: skip
    parser.add_argument(
        "-N", "--no-command", action="store_true", help="no shell: only forward the ports"
    )
    parser.add_argument(
        "-t", "--tty", action="store_true", help="a terminal for the command, as ssh -t"
    )
    parser.add_argument("--proxy-session", help=argparse.SUPPRESS)  # ssh's ProxyCommand


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from common.client_config import load_client_config

    config = load_client_config()
    with ApiClient(config.api_url, config.token) as client:
        if args.proxy_session:
            from cli.sshproxy import run_proxy

            return run_proxy(*client.debug_stream_target(args.name, args.proxy_session),
                             client.ca_file)  # fmt: skip
        command: list[str] = list(getattr(args, "remote_command", None) or [])
        if command and args.no_command:
            raise UsageError("-N runs no command: give it, or a command after `--`, not both",
                             prog="flexai training debug-ssh")  # fmt: skip
        ssh = shutil.which("ssh")
        if ssh is None:
            raise CliError(
                "the OpenSSH client `ssh` is not installed: install it (Debian/Ubuntu: "
                "`apt-get install openssh-client`; macOS has it) and run this again"
            )
        private_key, public_key = _ephemeral_key()
        session = client.open_debug_session(args.name, public_key, args.node_index)
        try:
            ready = _wait_until_ready(client, args.name, session)
            if sys.stdin.isatty():
                sys.stderr.write(f"Debug session into job {args.name} on node "
                                 f"{ready['node']} (index {ready['node_index']}).\n")  # fmt: skip
            env = {**os.environ, "FLEXAI_API_URL": config.api_url, "FLEXAI_TOKEN": config.token}
            with _SessionFiles(private_key, str(ready["host_key"])) as files:
                argv = ssh_command(ssh, files, args, ready["id"], command)
                return run_ssh(argv, env)
        finally:
            with contextlib.suppress(CliError):  # else it ends by itself on the control plane
                client.close_debug_session(args.name, session["id"])


def ssh_command(
    ssh: str, files: _SessionFiles, args: argparse.Namespace, session_id: str,
    command: list[str],
) -> list[str]:  # fmt: skip
    """The ``ssh`` command line: this session's key and host key alone, no user config, the
    bytes through ``flexai training debug-ssh NAME --proxy-session ID``."""
    proxy = shlex.join([sys.executable, "-m", "cli.main", "training", "debug-ssh", args.name,
                        "--proxy-session", session_id]).replace("%", "%%")  # fmt: skip
    options = {
        "IdentitiesOnly": "yes", "IdentityAgent": "none", "BatchMode": "yes",
        "PreferredAuthentications": "publickey", "UserKnownHostsFile": str(files.known_hosts),
        "GlobalKnownHostsFile": "/dev/null", "StrictHostKeyChecking": "yes",
        "HostKeyAlias": HOST_ALIAS, "CheckHostIP": "no", "UpdateHostKeys": "no",
        "ServerAliveInterval": "30", "LogLevel": "ERROR", "ProxyCommand": proxy,
        "ExitOnForwardFailure": "yes",
    }  # fmt: skip
    argv = [ssh, "-F", "/dev/null", "-i", str(files.key)]
    for key, value in options.items():
        argv += ["-o", f"{key}={value}"]
    for forward in args.local_forward:
        argv += ["-L", forward]
    if args.no_command:
        argv.append("-N")
    if args.tty:
        argv.append("-t")
    argv += ["-l", "flexai", HOST_ALIAS]
    if command:
        argv += ["--", shlex.join(command)]
    return argv


def run_ssh(argv: list[str], env: dict[str, str]) -> int:
    """Run ``ssh`` to its end and return its exit status. A SIGTERM or SIGHUP for us is passed
    on to it; Ctrl-C reaches it anyway (it shares our terminal), and it decides."""
    child = subprocess.Popen(argv, env=env)

    def pass_on(signum: int, _: object) -> None:
        child.send_signal(signum)

    previous = {number: signal.signal(number, pass_on) for number in (signal.SIGTERM,
                                                                      signal.SIGHUP)}  # fmt: skip
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:
                continue
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _ephemeral_key() -> tuple[bytes, str]:
    """A fresh ed25519 key: its private half (OpenSSH format) and its public line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )  # fmt: skip
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private, public.decode() + " flexai-debug-ssh"


def _wait_until_ready(client: Any, name: str, session: dict[str, Any]) -> dict[str, Any]:
    """The session once the node took it (its host key known)."""
    deadline = time.monotonic() + READY_PATIENCE_S
    while session["state"] == "waiting":
        left = deadline - time.monotonic()
        if left <= 0:
            raise CliError(
                f"node {session['node']} did not take the debug session within "
                f"{READY_PATIENCE_S:g} s: is its agent running? Try again in a moment"
            )
        session = client.debug_session(name, session["id"], wait=min(left, 20.0))
    if session["state"] != "ready" or not session.get("host_key"):
        raise CliError(f"the debug session ended before it opened: {session.get('reason')}")
    return session


class _SessionFiles:
    """The session's private key (0600) and known_hosts, in a directory only we can read,
    removed afterwards."""

    def __init__(self, private_key: bytes, host_key: str) -> None:
        self.private_key, self.host_key = private_key, host_key

    def __enter__(self) -> _SessionFiles:
        import tempfile

        self.directory = Path(tempfile.mkdtemp(prefix="flexai-debug-ssh-"))  # mode 0700
        self.key = self.directory / "id_ed25519"
        descriptor = os.open(self.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as sink:
            sink.write(self.private_key)
        self.known_hosts = self.directory / "known_hosts"
        self.known_hosts.write_text(f"{HOST_ALIAS} {self.host_key}\n")
        return self

    def __exit__(self, *exc_info: object) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
