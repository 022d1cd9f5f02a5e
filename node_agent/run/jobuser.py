"""The user jobs run as, apart from the agent: it cannot read the agent's token or files.

An agent running as root runs each job's own code (the virtual environment's creation, pip and
the entry point) as an unprivileged user, ``nobody`` unless ``--job-user`` names another; git
runs as the agent, before the job's directory is handed to that user. An agent that is not root
can only run jobs as itself, and says at start what that means.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node_agent.jobdirs import JobDirs
from node_agent.run.launch import without_agent_settings

if TYPE_CHECKING:
    from node_agent.sandbox.bwrap import JobSandbox

DEFAULT_WHEN_ROOT = "nobody"
# Run as the job user with the jobs' directory as argument: can that user reach it (exit 4),
# and does the interpreter have venv and pip 22.3+ (`pip --python` installs into a venv)?
# The check is the job user's own: a subprocess enters its cwd before it drops root's rights.
_BUILD_PROBE = """
import os, sys
try:
    os.chdir(sys.argv[1])
except OSError as error:
    sys.exit(print(error.strerror, file=sys.stderr) or 4)
import pip, venv
sys.exit(tuple(int(part) for part in pip.__version__.split(".")[:2]) < (22, 3))
"""


class JobUserError(Exception):
    """The job user cannot be used; the message says what to do."""


@dataclass(frozen=True)
class JobUser:
    name: str
    uid: int
    gid: int
    sandbox: JobSandbox | None = None
    """One job's sandbox (:mod:`node_agent.sandbox`): its commands run in it, as ``uid``."""

    @property
    def is_agent(self) -> bool:
        """Jobs run as the agent's own user: nothing to switch, nothing to hand over."""
        return self.uid == os.geteuid()

    def popen_options(self) -> dict[str, Any]:
        """``subprocess.Popen`` arguments that run a command as this user (and no group of
        the agent's); none in a sandbox, whose command drops to the user itself."""
        if self.is_agent or self.sandbox is not None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def command(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], *,
                entry: bool = False, writable: Sequence[Path] = ()
                ) -> tuple[list[str], dict[str, str]]:  # fmt: skip
        """``argv`` and ``env`` as this user runs them: in the job's sandbox when it has one
        (``entry``, ``writable``: see :meth:`JobSandbox.command`)."""
        if self.sandbox is None:
            return list(argv), dict(env)
        return (self.sandbox.command(argv, cwd=cwd, entry=entry, writable=writable),
                self.sandbox.env(env))  # fmt: skip

    def in_sandbox(self, sandbox: JobSandbox, uid: int | None = None) -> JobUser:
        """This user (or the job's own ``uid``) for one job's sandbox."""
        if uid is None:
            return replace(self, sandbox=sandbox)
        return JobUser(f"job-{uid}", uid, uid, sandbox)


def job_user(name: str | None) -> JobUser:
    """The user ``--job-user`` names, else ``nobody`` for a root agent, else the agent's own."""
    agent = pwd.getpwuid(os.geteuid())
    if name is None:
        name = DEFAULT_WHEN_ROOT if agent.pw_uid == 0 else agent.pw_name
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise JobUserError(
            f"there is no user {name} on this host to run jobs as (--job-user); create it "
            f"(useradd --system {name}) or name another"
        ) from None
    user = JobUser(entry.pw_name, entry.pw_uid, entry.pw_gid)
    if agent.pw_uid != 0 and not user.is_agent:
        raise JobUserError(
            f"only an agent running as root can run jobs as {name} (this one runs as "
            f"{agent.pw_name}); run it as root, or leave --job-user out to run jobs as "
            f"{agent.pw_name}"
        )
    return user


def shared_user_warning(user: JobUser) -> str | None:
    """What a job running as the agent's own user can do, when it does; None otherwise."""
    if not user.is_agent:
        return None
    if user.uid == 0:
        return (
            "jobs run as root, like this agent: they can read every file on this host, its "
            "token included; pass --job-user with an unprivileged user (nobody by default)"
        )
    return (
        f"jobs run as this agent's own user {user.name}: they can read every file it can, "
        "its token file and client config included; run the agent as root with --job-user "
        "USER (nobody by default) to keep them apart"
    )


def check_can_build(user: JobUser, python: str, jobs_dir: Path) -> None:
    """Fail at start, not at every job, when the job user cannot enter the jobs' directory or
    run ``python`` (with venv and pip) to make their virtual environments."""
    problem = _build_problem(user, python, jobs_dir)
    if problem is None:
        return
    if problem.startswith("cannot enter"):
        raise JobUserError(
            f"the job user {user.name} {problem}: every directory above it must be searchable "
            "by that user (chmod o+x), or pass another --work-dir"
        )
    usable = python_for(user)
    hint = f"e.g. --job-python {usable}" if usable else "none of the usual ones can"
    raise JobUserError(
        f"the job user {user.name} {problem}, and jobs' virtual environments are made from "
        f"it: pass --job-python with an interpreter that user can run ({hint})"
    )


def python_for(user: JobUser) -> str | None:
    """The first interpreter of the agent's own base and the system's ``python3`` that ``user``
    can make virtual environments with, if any."""
    candidates = (getattr(sys, "_base_executable", sys.executable), *_SYSTEM_PYTHONS)
    for candidate in dict.fromkeys(candidates):
        if _build_problem(user, candidate, Path("/")) is None:
            return candidate
    return None


_SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


def _build_problem(user: JobUser, python: str, jobs_dir: Path) -> str | None:
    try:
        result = subprocess.run(
            [python, "-c", _BUILD_PROBE, str(jobs_dir)],
            cwd="/",
            env=without_agent_settings(os.environ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            **user.popen_options(),
        )
    except OSError as error:
        return f"cannot run {python} ({error.strerror})"
    except subprocess.TimeoutExpired:
        return f"cannot run {python} (no answer within 60 s)"
    said = (result.stderr.strip().splitlines() or ["pip is older than 22.3"])[-1]
    if result.returncode == 4:
        return f"cannot enter {jobs_dir} ({said})"
    if result.returncode != 0:
        return f"cannot use {python}: it lacks venv or pip 22.3+ ({said})"
    return None


def hand_over(dirs: JobDirs, user: JobUser) -> None:
    """Give the job its directory, before any of its code runs. From then on the agent only
    reads there, never following a link the job could have planted. Its logs (``job.log``,
    an earlier attempt's) stay the agent's: the job may read its own log, not rewrite it."""
    if user.is_agent:
        return
    for folder, subfolders, files in os.walk(dirs.root):  # links are changed, not followed
        for name in (*subfolders, *files):
            path = os.path.join(folder, name)
            if not dirs.is_log(Path(path)):
                os.chown(path, user.uid, user.gid, follow_symlinks=False)
    os.chown(dirs.root, user.uid, user.gid)


def hand_over_folders(folders: tuple[Path, ...], user: JobUser) -> None:
    """Give the job folders the agent made for it after the hand-over (a later attempt's),
    each with what the agent put in it (its input checkpoint)."""
    if user.is_agent:
        return
    for top in folders:
        for folder, subfolders, files in os.walk(top):
            for name in (*subfolders, *files):
                os.chown(os.path.join(folder, name), user.uid, user.gid, follow_symlinks=False)
        os.chown(top, user.uid, user.gid, follow_symlinks=False)
