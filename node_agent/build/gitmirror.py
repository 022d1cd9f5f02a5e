"""Per-repository git mirrors on the node: a job's clone fetches only what is new.

``<work-dir>/git-mirrors/<hash of the URL>.git`` is a bare ``--mirror`` clone of the job's
repository, the agent's alone. Before each job the agent fetches into it (under a lock per
mirror, so two jobs of one repository fetch once at a time), then clones the job's repository
from it with ``--no-hardlinks``: the job's clone holds copies of the objects, so it neither
shares files with the mirror (which the job's user then owns) nor breaks when the mirror is
repacked, and the mirror stays unreadable to jobs (private repositories of other jobs).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from node_agent.build.filelock import FileLock

_last_look: dict[Path, float] = {}
"""When this agent last began to compare each mirror with its origin (under its lock)."""

GitRun = Callable[[Sequence[str], Path], tuple[int, list[str]]]
"""Run ``git args`` in a directory; return its exit code and its output lines."""


_FULL_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


class MirrorFailed(Exception):
    """The repository could not be mirrored or fetched; the message is git's."""


class GitMirrors:
    """The node's mirrors, one per repository URL."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, url: str) -> Path:
        return self.root / f"{hashlib.sha256(url.encode()).hexdigest()[:32]}.git"

    def clone(
        self,
        url: str,
        repo: Path,
        *,
        git: GitRun,
        cancel: threading.Event,
        asked: float | None = None,
    ) -> None:
        """Clone ``url`` into ``repo`` (no checkout) through its mirror, brought up to date
        with the origin first: by this call, or by another one that began to look at the
        origin after this one was asked (many jobs of one repository at once look once)."""
        mirror = self.refresh(url, git=git, cancel=cancel, asked=asked)
        _check(git(["clone", "--quiet", "--no-checkout", "--no-hardlinks", "--",
                    str(mirror), str(repo)], self.root))  # fmt: skip
        if not _set_origin(repo, mirror, url):
            _check(git(["remote", "set-url", "--", "origin", url], repo))

    def refresh(
        self, url: str, *, git: GitRun, cancel: threading.Event, asked: float | None = None
    ) -> Path:
        """``url``'s mirror, brought up to date with the origin first: by this call, or by
        another one that began to look at the origin after this one was ``asked`` (by default
        now; a job passes when the agent learned of it, which is after it was submitted). So
        the jobs of one repository that arrive together look at the origin once."""
        mirror = self.path(url)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        asked = time.monotonic() if asked is None else asked
        with FileLock(self.root / f"{mirror.name}.lock", cancel):
            looking = time.monotonic()
            if not (mirror / "HEAD").is_file():
                self._create(url, mirror, git=git)
                _last_look[mirror] = looking
            elif _last_look.get(mirror, -1.0) < asked:
                self._update(mirror, git=git)
                _last_look[mirror] = looking
        return mirror

    # -- checkouts kept per commit ---------------------------------------------------------

    def branch_commit(self, mirror: Path, revision: str | None) -> str | None:
        """The commit the mirror's default branch (``revision`` None) or branch
        ``revision`` points at, read from its files; None when that takes git."""
        refs = _local_refs(mirror)
        if revision is None:
            head = (mirror / "HEAD").read_text().strip()
            return refs.get(head.removeprefix("ref: ")) if head.startswith("ref: ") else None
        commit = refs.get(f"refs/heads/{revision}")
        if commit is None and _FULL_COMMIT.fullmatch(revision):
            return revision if self.kept(mirror, revision).is_dir() else None
        return commit

    def kept(self, mirror: Path, commit: str) -> Path:
        return self.root / "checkouts" / mirror.name.removesuffix(".git") / commit

    def copy_kept(self, mirror: Path, commit: str, repo: Path) -> bool:
        """Copy the checkout of ``commit`` kept by an earlier job into ``repo`` (a plain copy:
        no git process); False when none is kept."""
        kept = self.kept(mirror, commit)
        if not kept.is_dir():
            return False
        copy_tree(str(kept), str(repo))
        return True

    def keep(self, mirror: Path, commit: str, repo: Path, *, git: GitRun) -> None:
        """Keep a copy of a fresh checkout of ``commit`` for the next jobs of it, its ``.git``
        made compact (:func:`compact_git_dir`)."""
        kept = self.kept(mirror, commit)
        if kept.is_dir():
            return
        kept.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        staging = kept.with_name(f".{commit}.{os.getpid()}.{threading.get_ident()}")
        try:
            shutil.copytree(repo, staging, symlinks=True)
            compact_git_dir(staging, git=git)
            os.rename(staging, kept)
        except OSError:  # another job kept it first, or the disk is full: not needed
            pass
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone once renamed

    def _create(self, url: str, mirror: Path, *, git: GitRun) -> None:
        staging = mirror.with_name(f".{mirror.name}.new")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            _check(git(["clone", "--mirror", "--", url, str(staging)], self.root))
        except MirrorFailed:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        os.rename(staging, mirror)

    def _update(self, mirror: Path, *, git: GitRun) -> None:
        """Fetch only when the origin's refs differ from the mirror's (most often they do
        not: one ``ls-remote`` then costs less than a fetch); follow its default branch."""
        code, lines = git(["ls-remote", "--symref", "origin"], mirror)
        _check((code, lines))
        refs, head = _advertised(lines)
        if refs != _local_refs(mirror):
            _check(git(["fetch", "--prune", "--quiet", "origin"], mirror))
        current = (mirror / "HEAD").read_text().strip().removeprefix("ref: ")
        if head.startswith("refs/heads/") and head != current:
            git(["symbolic-ref", "HEAD", head], mirror)  # a fetch leaves HEAD alone


OPTIONAL_GIT_ENTRIES = ("hooks", "description", "info", "branches", "logs/refs",
                        "objects/info/packs")  # fmt: skip
"""What a clone's ``.git`` holds that git does not need: hook examples, the branches' reflogs,
the default exclude file, the list dumb HTTP transports read. HEAD's reflog stays (``git
status`` says "HEAD detached at" from it), and so does ``origin/HEAD``."""


def compact_git_dir(checkout: Path, *, git: GitRun) -> None:
    """Make the ``.git`` of ``checkout`` hold fewer files, so that each job copies fifteen
    instead of forty: the loose objects into one pack, the loose refs into ``packed-refs``,
    and :data:`OPTIONAL_GIT_ENTRIES` gone. Every job makes its copy's files
    and deletes them when it ends; on an ext4 without a journal each new file costs a look at
    every file deleted in the last half minute (``recently_deleted``), which made most of an
    agent's CPU at 16 jobs a second. Where git fails, the loose objects or refs stay: the
    checkout is as valid either way."""
    dot_git = checkout / ".git"
    if not dot_git.is_dir():
        return
    git(["repack", "-d", "-q"], checkout)  # loose objects only: cheap whatever the repo's size
    git(["pack-refs", "--all"], checkout)
    for name in OPTIONAL_GIT_ENTRIES:
        entry = dot_git / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
    for folder in ("objects", "refs"):
        for path, _, _ in os.walk(dot_git / folder, topdown=False):
            if Path(path) != dot_git / folder:
                with contextlib.suppress(OSError):  # not empty
                    os.rmdir(path)


def copy_tree(source: str, target: str) -> None:
    """Copy the directory ``source`` to ``target`` (which may exist): files with their mode,
    links as links. Unlike ``shutil.copytree`` no timestamps nor extended attributes are copied,
    which costs most of its time on a small checkout."""
    os.makedirs(target, mode=0o700, exist_ok=True)
    with os.scandir(source) as entries:
        for entry in entries:
            destination = os.path.join(target, entry.name)
            if entry.is_symlink():
                os.symlink(os.readlink(entry.path), destination)
            elif entry.is_dir():
                copy_tree(entry.path, destination)
            else:
                shutil.copyfile(entry.path, destination)
                os.chmod(destination, stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode))
    os.chmod(target, stat.S_IMODE(os.stat(source).st_mode))


def _advertised(lines: list[str]) -> tuple[dict[str, str], str]:
    """The refs ``ls-remote --symref`` lists (peeled tags left out), and what HEAD names."""
    refs, head = {}, ""
    for line in lines:
        value, _, name = line.strip().partition("\t")
        if value.startswith("ref: ") and name == "HEAD":
            head = value[5:]
        elif name.startswith("refs/") and not name.endswith("^{}"):
            refs[name] = value
    return refs, head


def _local_refs(mirror: Path) -> dict[str, str]:
    """The mirror's refs, read from its files (packed, then loose ones over them)."""
    refs = {}
    packed = mirror / "packed-refs"
    if packed.exists():
        for line in packed.read_text().splitlines():
            value, _, name = line.partition(" ")
            if name and not line.startswith(("#", "^")):
                refs[name] = value
    for folder, _, files in os.walk(mirror / "refs"):
        for name in files:
            path = Path(folder, name)
            refs[str(path.relative_to(mirror))] = path.read_text().strip()
    return refs


def _set_origin(repo: Path, mirror: Path, url: str) -> bool:
    """Point the clone's origin at ``url`` (not the mirror) by editing its config; False
    when the config is not as ``git clone`` writes it."""
    config = repo / ".git" / "config"
    text = config.read_text()
    line = f"\turl = {mirror}\n"
    if text.count(line) != 1 or "\n" in url:
        return False
    quoted = url.replace("\\", "\\\\").replace('"', '\\"')
    config.write_text(text.replace(line, f'\turl = "{quoted}"\n'))
    return True


def _check(result: tuple[int, list[str]]) -> None:
    code, lines = result
    if code != 0:
        said = [line.strip() for line in lines if line.strip()]
        failed = [line for line in said if line.startswith(("fatal:", "error:"))]
        raise MirrorFailed(" ".join((failed or said)[-5:]) or f"git exited with code {code}")
