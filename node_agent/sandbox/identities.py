"""The user ids jobs run as: one per live job on this node, from a range no user of the host
has (``--job-uids``, 70000-70999 by default: above the 16-bit ids distributions hand out,
below the ranges of ``/etc/subuid`` (100000 on) and beside none that systemd allocates).

A job keeps its id for its whole life here, across agent restarts: the id is written in the
job's scratch folder (the agent's own), and read again from there by an agent that restarted.
An id is free again once no scratch folder names it and no process runs as it (a process
stuck in the kernel keeps its id from the next job).
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import threading
from collections.abc import Iterable
from pathlib import Path

DEFAULT_RANGE = range(70000, 71000)
_RANGE = re.compile(r"(\d+)-(\d+)")
ID_FILE = "uid"
"""In a job's scratch folder: the id it runs as."""


class IdentityError(Exception):
    """The range cannot be used, or is spent; the message says what to do."""


def parse_range(text: str) -> range:
    """``FIRST-LAST`` (both included), e.g. ``70000-70999``."""
    found = _RANGE.fullmatch(text.strip())
    if not found:
        raise IdentityError(f"--job-uids takes FIRST-LAST, e.g. 70000-70999, not {text!r:.40}")
    first, last = int(found[1]), int(found[2])
    if not 1000 <= first <= last < 2**31 - 1:
        raise IdentityError(f"--job-uids {text}: give 1000 <= FIRST <= LAST < 2147483647")
    return range(first, last + 1)


def check_range(ids: range) -> None:
    """Refuse a range that holds a user or a group of the host (their files, their processes
    would be the jobs')."""
    users = [(entry.pw_name, entry.pw_uid) for entry in pwd.getpwall() if entry.pw_uid in ids]
    groups = [(entry.gr_name, entry.gr_gid) for entry in grp.getgrall() if entry.gr_gid in ids]
    taken = [f"user {name} ({uid})" for name, uid in users] + [
        f"group {name} ({gid})" for name, gid in groups]  # fmt: skip
    if taken:
        raise IdentityError(
            f"--job-uids {ids.start}-{ids.stop - 1} holds {', '.join(taken[:3])}: jobs would "
            "run as them; give a range that no user or group of this host has"
        )


class JobIdentities:
    """Hands out the ids of ``ids`` to the jobs whose scratch folders are under ``scratch``."""

    def __init__(self, ids: range, scratch: Path) -> None:
        self.ids = ids
        self.scratch = scratch
        self._lock = threading.Lock()

    def take(self, job_scratch: Path) -> int:
        """The id of the job whose scratch folder is ``job_scratch``: the one it has, else the
        lowest free one, written there."""
        with self._lock:
            held = read_id(job_scratch, self.ids)
            if held is not None:
                return held
            taken = self._named() | running_ids(self.ids)
            free = next((uid for uid in self.ids if uid not in taken), None)
            if free is None:
                raise IdentityError(
                    f"every id of --job-uids {self.ids.start}-{self.ids.stop - 1} is taken by a "
                    "live job: give the agent a larger range"
                )
            job_scratch.mkdir(parents=True, exist_ok=True)
            partial = job_scratch / f"{ID_FILE}.partial"
            partial.write_text(f"{free}\n")
            os.replace(partial, job_scratch / ID_FILE)
            return free

    def _named(self) -> set[int]:
        """The ids the scratch folders name (the live jobs' and those not yet cleaned up)."""
        if not self.scratch.is_dir():
            return set()
        found = (read_id(folder, self.ids) for folder in self.scratch.iterdir())
        return {uid for uid in found if uid is not None}


def read_id(job_scratch: Path, ids: range) -> int | None:
    try:
        value = int((job_scratch / ID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value in ids else None


def running_ids(ids: range) -> set[int]:
    """The ids of ``ids`` some process runs as (the owner of its ``/proc`` entry)."""
    found: set[int] = set()
    for name in _pids():
        try:
            uid = os.stat(f"/proc/{name}").st_uid
        except OSError:
            continue
        if uid in ids:
            found.add(uid)
    return found


def _pids() -> Iterable[str]:
    try:
        return [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
