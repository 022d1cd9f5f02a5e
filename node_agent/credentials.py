"""Where the agent's API token comes from, kept out of reach of the host's other processes.

Never the command line: every process on the host reads it with ``ps``. The token comes from
``--token-file`` (its owner's alone, mode 0600), else ``FLEXAI_TOKEN``, else the client config.
The kernel keeps the environment a process started with readable in ``/proc/<pid>/environ``
for its whole life, whatever the process does to its own copy; so an agent given
``FLEXAI_TOKEN`` executes itself again at once without it, and the new image receives the
token through an inherited pipe whose number is all its environment holds.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import NoReturn

TOKEN_VARIABLE = "FLEXAI_TOKEN"
HANDOVER_VARIABLE = "_FLEXAI_AGENT_TOKEN_FD"
"""The number of the pipe the token comes through after the agent executed itself again."""
_MAX_TOKEN = 16 * 1024  # well within a pipe's buffer, so writing it never blocks


class CredentialError(Exception):
    """The token cannot be had safely; the message says what to do."""


def token_from_file(path: Path) -> str:
    """The token in ``path``, refused while other users can read or change the file."""
    try:
        with path.open("rb") as handle:
            mode = stat.S_IMODE(os.fstat(handle.fileno()).st_mode)
            data = handle.read(_MAX_TOKEN + 1)
    except OSError as error:
        raise CredentialError(f"cannot read the token file {path}: {error.strerror}") from None
    if mode & 0o077:
        raise CredentialError(
            f"other users can read or change the token file {path} (mode {mode:04o}); "
            f"chmod 600 {path}"
        )
    token = data.decode(errors="replace").strip()
    if not token or len(data) > _MAX_TOKEN or any(c.isspace() for c in token):
        raise CredentialError(f"the token file {path} does not hold one token; put it alone there")
    return token


def token_from_environment() -> str | None:
    """The token ``FLEXAI_TOKEN`` gave this agent, or None when it gave none.

    The first time (``FLEXAI_TOKEN`` set) this executes the agent's command line again without
    it in the environment, so it never returns; in the new image it returns the token.
    """
    handover = os.environ.pop(HANDOVER_VARIABLE, None)
    if handover is not None:
        return _receive(handover)
    token = os.environ.get(TOKEN_VARIABLE)
    if not token:
        return None
    _execute_again_without(token)


def _execute_again_without(token: str) -> NoReturn:
    data = token.encode()
    if len(data) > _MAX_TOKEN:
        raise CredentialError(f"{TOKEN_VARIABLE} is too long to be an API token")
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)
    finally:
        os.close(write_end)
    os.set_inheritable(read_end, True)
    env = {name: value for name, value in os.environ.items() if name != TOKEN_VARIABLE}
    env[HANDOVER_VARIABLE] = str(read_end)
    sys.stdout.flush()
    sys.stderr.flush()
    # The same interpreter, flags, script or module and arguments: the same agent, once more.
    argv = [sys.executable, *sys.orig_argv[1:]]
    try:
        os.execve(sys.executable, argv, env)
    except OSError as error:
        os.close(read_end)
        raise CredentialError(
            f"cannot restart the agent without {TOKEN_VARIABLE} in its environment "
            f"({error.strerror}); pass --token-file instead"
        ) from None


def _receive(handover: str) -> str:
    try:
        with os.fdopen(int(handover), "rb") as pipe:
            token = pipe.read(_MAX_TOKEN + 1).decode()
    except (OSError, ValueError) as error:
        raise CredentialError(
            f"the token handed over from {TOKEN_VARIABLE} is lost: {error}"
        ) from None
    if not token:
        raise CredentialError(f"the token handed over from {TOKEN_VARIABLE} is empty")
    return token
