"""The agent's work directory: one agent at a time, its lasting identity, who may enter it.

``<work-dir>`` holds ``agent.lock`` and ``agent-id`` (the agent's alone, mode 0600),
``jobs/<job_id>/`` (each handed to the job's user) and ``scratch/<job_id>/`` (the agent's).
When jobs run as another user, that user may pass through ``<work-dir>`` and ``jobs/`` to reach
its own job's directory (mode 0711) but cannot list them nor open anything else there.
``jobs/`` and ``scratch/`` are marked as tops of hierarchies (``chattr +T``) where the
filesystem allows: see :func:`mark_top_of_hierarchy`.
"""

from __future__ import annotations

import fcntl
import os
import sys
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
        for directory in (work_dir / "jobs", work_dir / "scratch"):
            mark_top_of_hierarchy(directory)
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


FS_IOC_GETFLAGS, FS_IOC_SETFLAGS = 0x80086601, 0x40086602
FS_TOPDIR_FL = 0x00020000
"""Linux's inode flag (``chattr +T``) for the top of a hierarchy of directories."""


def mark_top_of_hierarchy(directory: Path) -> bool:
    """Tell ext2/3/4's Orlov allocator that ``directory`` is the top of a hierarchy (``chattr
    +T``, as ``/home`` may be): each directory made in it then goes to a block group of its
    own, not its parent's. Every job makes some fifty files in ``jobs/<job_id>/`` and deletes
    them when it ends. In one block group, on an ext4 without a journal, the allocator looks
    at each inode deleted there in the last 30 seconds before it hands out a new one
    (``recently_deleted``): at 20 jobs a second that was half of an agent's CPU. Another
    filesystem refuses the flag, or ignores it; False where it was not set."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        flags = bytearray(4)
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags)
        value = int.from_bytes(flags, sys.byteorder)
        if not value & FS_TOPDIR_FL:
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, (value | FS_TOPDIR_FL).to_bytes(4, sys.byteorder))
            fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags)
        return bool(int.from_bytes(flags, sys.byteorder) & FS_TOPDIR_FL)
    except OSError:
        return False
    finally:
        os.close(fd)


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
