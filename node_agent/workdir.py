"""The agent's work directory: one agent at a time, its lasting identity, who may enter it.

``<work-dir>`` holds ``agent.lock`` and ``agent-id`` (the agent's alone, mode 0600),
``jobs/<job_id>/`` (each handed to the job's user) and ``scratch/<job_id>/`` (the agent's).
When jobs run as another user, that user may pass through ``<work-dir>`` and ``jobs/`` to reach
its own job's directory (mode 0711) but cannot list them nor open anything else there.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from node_agent.client import new_agent_id


class WorkDirError(Exception):
    """The work directory cannot be used; the message says what to do."""


@contextmanager
def exclusive(work_dir: Path, jobs_run_as_another_user: bool) -> Iterator[None]:
    """Hold the work directory's lock: two agents in one directory would trample each other."""
    passable = 0o711 if jobs_run_as_another_user else 0o700
    try:
        for directory, mode in (
            (work_dir, passable),
            (work_dir / "jobs", passable),
            (work_dir / "scratch", 0o700),
        ):
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(mode)
        fd = os.open(work_dir / "agent.lock", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as error:
        raise WorkDirError(f"cannot use the work directory {work_dir}: {error}") from None
    with os.fdopen(fd, "w") as handle:
        os.fchmod(fd, 0o600)  # a lock file made by an older agent may be readable by all
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WorkDirError(
                f"another agent is running with the work directory {work_dir}; "
                "give each agent its own --work-dir"
            ) from None
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield


def agent_id(work_dir: Path) -> str:
    """This agent's lasting identity, kept in its work directory: a restart keeps its node,
    while another agent that claims the same node name is refused as long as this one lives."""
    path = work_dir / "agent-id"
    try:
        known = path.read_text().strip()
        path.chmod(0o600)
    except FileNotFoundError:
        known = ""
    except OSError as error:
        raise WorkDirError(f"cannot read {path}: {error}") from None
    if len(known) >= 16 and known.isalnum():
        return known
    identity = new_agent_id()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(identity + "\n")
    except OSError as error:
        raise WorkDirError(f"cannot write {path}: {error}") from None
    return identity
