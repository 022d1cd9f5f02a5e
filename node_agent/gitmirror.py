"""Per-repository git mirrors on the node: a job's clone fetches only what is new.

``<work-dir>/git-mirrors/<hash of the URL>.git`` is a bare ``--mirror`` clone of the job's
repository, the agent's alone. Before each job the agent fetches into it (under a lock per
mirror, so two jobs of one repository fetch once at a time), then clones the job's repository
from it with ``--no-hardlinks``: the job's clone holds copies of the objects, so it neither
shares files with the mirror (which the job's user then owns) nor breaks when the mirror is
repacked, and the mirror stays unreadable to jobs (private repositories of other jobs).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from node_agent.filelock import FileLock

GitRun = Callable[[Sequence[str], Path], tuple[int, list[str]]]
"""Run ``git args`` in a directory; return its exit code and its output lines."""


class MirrorFailed(Exception):
    """The repository could not be mirrored or fetched; the message is git's."""


class GitMirrors:
    """The node's mirrors, one per repository URL."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, url: str) -> Path:
        return self.root / f"{hashlib.sha256(url.encode()).hexdigest()[:32]}.git"

    def clone(
        self, url: str, repo: Path, *, git: GitRun, cancel: threading.Event, default_branch: bool
    ) -> None:
        """Clone ``url`` into ``repo`` (no checkout) through its mirror, fetched first; with
        ``default_branch``, the mirror's HEAD follows the origin's default branch too."""
        mirror = self.path(url)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        with FileLock(self.root / f"{mirror.name}.lock", cancel):
            if (mirror / "HEAD").is_file():
                self._update(url, mirror, git=git, default_branch=default_branch)
            else:
                self._create(url, mirror, git=git)
        _check(git(["clone", "--quiet", "--no-checkout", "--no-hardlinks", "--",
                    str(mirror), str(repo)], self.root))  # fmt: skip
        _check(git(["remote", "set-url", "origin", url], repo))

    def _create(self, url: str, mirror: Path, *, git: GitRun) -> None:
        staging = mirror.with_name(f".{mirror.name}.new")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            _check(git(["clone", "--mirror", "--", url, str(staging)], self.root))
        except MirrorFailed:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        os.rename(staging, mirror)

    def _update(self, url: str, mirror: Path, *, git: GitRun, default_branch: bool) -> None:
        _check(git(["fetch", "--prune", "--quiet", "origin"], mirror))
        if default_branch:  # a fetch leaves HEAD alone: follow the origin's default branch
            code, lines = git(["ls-remote", "--symref", "origin", "HEAD"], mirror)
            said = [line[5:].split("\t")[0] for line in lines if line.startswith("ref: ")]
            if code == 0 and said and said[0].startswith("refs/heads/"):
                git(["symbolic-ref", "HEAD", said[0]], mirror)


def _check(result: tuple[int, list[str]]) -> None:
    code, lines = result
    if code != 0:
        said = [line.strip() for line in lines if line.strip()]
        failed = [line for line in said if line.startswith(("fatal:", "error:"))]
        raise MirrorFailed(" ".join((failed or said)[-5:]) or f"git exited with code {code}")
