"""What this host lets the agent do to keep jobs apart, found once at start and said there:
the level it reports with its node (``flexai admin node list`` shows it, and a server run
with ``--require-isolation`` places jobs only on ``sandbox`` nodes).

- ``sandbox``: the agent runs as root and bubblewrap works: each job runs as an id of its own,
  in namespaces of its own (:mod:`node_agent.sandbox.bwrap`), with a cgroup where the host has
  them (``limits``);
- ``user``: the agent runs as root without bubblewrap: jobs run as ``--job-user`` (``nobody``),
  all of them as that one user, and see each other;
- ``none``: the agent is not root: jobs run as the agent's own user.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from node_agent.sandbox import cgroups
from node_agent.sandbox.bwrap import bwrap_binary
from node_agent.sandbox.cgroups import Cgroups

SANDBOX, USER, NONE = "sandbox", "user", "none"
SHARED_WITHOUT_SANDBOX = (
    "every job runs as the same user and sees the others: it can read their environment "
    "(secrets included) in /proc, signal their processes, read their files through "
    "/proc/<pid>/cwd and what they leave in /tmp; the platform's paths (/output, /input, ...) "
    "do not exist: FLEXAI_*_DIR name folders under the work directory"
)


@dataclass(frozen=True)
class Isolation:
    level: str
    detail: str
    """What jobs share on this node, or what keeps them apart: one line for the operator."""
    bwrap: str | None = None
    cgroups: Cgroups | None = None

    def to_json(self) -> dict[str, object]:
        return {"level": self.level, "detail": self.detail, "limits": self.cgroups is not None}


def detect(shared_user: str | None, want_cgroups: bool = True) -> Isolation:
    """This host's isolation for jobs; ``shared_user``: the one user ``--job-user`` named."""
    if os.geteuid() != 0:
        return Isolation(NONE, f"the agent is not root, so {SHARED_WITHOUT_SANDBOX}; run the "
                               "agent as root with bubblewrap (bwrap) installed")  # fmt: skip
    bwrap = bwrap_binary()
    problem = _probe(bwrap) if bwrap else "bubblewrap (bwrap) is not installed"
    if problem:
        return Isolation(USER, f"{problem}, so {SHARED_WITHOUT_SANDBOX}; install bubblewrap "
                               "(apt-get install bubblewrap)")  # fmt: skip
    found = cgroups.detect() if want_cgroups else "limits turned off (--job-memory none)"
    limits = found if isinstance(found, Cgroups) else None
    parts = ["each job runs in a sandbox of its own (own processes, files, /tmp and "
             "accelerators)"]  # fmt: skip
    parts.append("with its own user id" if shared_user is None else
                 f"all as user {shared_user} (--job-user): a job's files and its processes' "
                 f"per-user limits are those of every other job's")  # fmt: skip
    parts.append(f"and memory and process limits ({limits.describe()})" if limits else
                 f"and no memory or process limits: {found}")  # fmt: skip
    return Isolation(SANDBOX, ", ".join(parts), bwrap, limits)


def _probe(bwrap: str) -> str | None:
    """Why bubblewrap cannot make a sandbox here (None: it can)."""
    try:
        done = subprocess.run(
            [bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-pid",
             "--unshare-ipc", "--unshare-uts", "--", "setpriv", "--reuid=65534", "--regid=65534",
             "--clear-groups", "--no-new-privs", "--", "true"],
            capture_output=True, text=True, timeout=30, cwd=Path("/"),
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bubblewrap does not run ({error})"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return f"bubblewrap cannot make a sandbox here ({said[:200]})"
    return None
