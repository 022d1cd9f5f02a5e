"""The node's cache of unpacked images, shared by its jobs, one folder per manifest digest.

``<cache>/<hex>/rootfs`` is an image's root filesystem, written by nobody once there: no file of
it is writable by a group or others (a job runs as a user of its own). A folder is unpacked
beside its place (``.staging-<hex>-*``) and renamed there when whole, so a folder of that name
is always complete; a staging folder an agent that crashed left is removed by the next to pull
that image. One lock per digest: of two jobs that need an image, one pulls it, the other waits
and finds it there. ``index.json`` holds each image's size and last use; past the cache's size
the least recently used images are removed, but for one a job holds (:meth:`ImageCache.hold`)
or pulls.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from node_agent.build.filelock import FileLock

STAGING = ".staging-"
_NEVER = threading.Event()
"""For the index's lock: held only for as long as reading and writing a small file takes."""


@dataclass(frozen=True)
class Entry:
    size: int
    """Bytes on disk."""
    last_used: float
    reference: str


class ImageCache:
    """``max_bytes``: the size the cache is brought back under after each image it adds."""

    def __init__(self, root: Path, max_bytes: int, clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.clock = clock

    def folder(self, digest: str) -> Path:
        return self.root / _hex(digest)

    def ensure(
        self,
        digest: str,
        reference: str,
        fill: Callable[[Path], bool],
        cancel: threading.Event,
    ) -> Path | None:
        """The root filesystem of image ``digest``; ``fill(staging)`` puts it at
        ``staging/rootfs`` when this node has it not (False: cancelled, and so None here).
        Raises :class:`~node_agent.build.filelock.LockCancelled` when cancelled while another
        job pulls it."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.folder(digest)
        with FileLock(self._lock(digest), cancel):
            if not final.is_dir():
                size = self._unpack(digest, fill)
                if size is None:
                    return None
                self._record(digest, Entry(size, self.clock(), reference))
                self.evict(keep=digest)
            else:
                self._record(digest, None)
        return final / "rootfs"

    def _unpack(self, digest: str, fill: Callable[[Path], bool]) -> int | None:
        for stale in self.root.glob(f"{STAGING}{_hex(digest)}-*"):
            remove(stale)  # this digest's lock is ours: its agent is gone
        staging = Path(tempfile.mkdtemp(prefix=f"{STAGING}{_hex(digest)}-", dir=self.root))
        try:
            if not fill(staging):
                return None
            make_read_only(staging)
            size = disk_usage(staging)
            staging.chmod(0o755)
            os.rename(staging, self.folder(digest))
            return size
        finally:
            if staging.exists():
                remove(staging)

    @contextmanager
    def hold(self, digest: str) -> Iterator[None]:
        """Image ``digest`` is not evicted while the block runs (a job runs in it)."""
        fd = os.open(self._lock(digest, "use"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def entries(self) -> dict[str, Entry]:
        """The index, by digest, with what a crash left out of it (or in it) set right."""
        path = self.root / "index.json"
        if not self.root.is_dir():
            return {}
        try:
            raw = json.loads(path.read_text())
            entries = {digest: Entry(**fields) for digest, fields in raw.items()}
        except (OSError, ValueError, TypeError):
            entries = {}
        present = {f"sha256:{p.name}" for p in self.root.iterdir()
                   if p.is_dir() and not p.name.startswith(".")}  # fmt: skip
        entries = {digest: entry for digest, entry in entries.items() if digest in present}
        for digest in present - set(entries):
            folder = self.folder(digest)
            entries[digest] = Entry(disk_usage(folder), folder.stat().st_mtime, "?")
        return entries

    def held(self) -> list[tuple[str, str]]:
        """Each whole image here as ``(reference, digest)``, sorted, read from the index without
        its lock (it is replaced whole, never written in place), so a pull is never held up:
        what the heartbeat tells the control plane. An image the index lost the reference of
        is left out."""
        try:
            raw = json.loads((self.root / "index.json").read_text())
            present = {p.name for p in self.root.iterdir() if not p.name.startswith(".")}
        except (OSError, ValueError):
            return []
        if not isinstance(raw, dict):
            return []
        return sorted(
            (str(fields["reference"]), digest) for digest, fields in raw.items()
            if isinstance(fields, dict) and fields.get("reference", "?") != "?"
            and _hex(digest) in present
        )  # fmt: skip

    def evict(self, keep: str | None = None) -> list[str]:
        """Remove the least recently used images until the cache fits; returns their digests.
        An image being pulled or held by a job stays, as does ``keep``."""
        removed: list[str] = []
        with FileLock(self._lock("index"), _NEVER):
            entries = self.entries()
            total = sum(entry.size for entry in entries.values())
            for digest, entry in sorted(entries.items(), key=lambda item: item[1].last_used):
                if total <= self.max_bytes:
                    break
                if digest != keep and self._remove_unused(digest):
                    total -= entry.size
                    del entries[digest]
                    removed.append(digest)
            self._write(entries)
        return removed

    def _remove_unused(self, digest: str) -> bool:
        fds = [os.open(self._lock(digest, kind), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
               for kind in ("lock", "use")]  # fmt: skip
        try:
            for fd in fds:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        else:
            remove(self.folder(digest))
            return True
        finally:
            for fd in fds:
                os.close(fd)

    def _record(self, digest: str, added: Entry | None) -> None:
        """``added`` to the index; None: image ``digest`` was used now."""
        with FileLock(self._lock("index"), _NEVER):
            entries = self.entries()
            if added is not None:
                entries[digest] = added
            elif digest in entries:
                old = entries[digest]
                entries[digest] = Entry(old.size, self.clock(), old.reference)
            self._write(entries)

    def _write(self, entries: dict[str, Entry]) -> None:
        path = self.root / "index.json"
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps({d: asdict(e) for d, e in entries.items()}, indent=1))
        os.replace(partial, path)

    def _lock(self, name: str, kind: str = "lock") -> Path:
        locks = self.root / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        return locks / f"{_hex(name)}.{kind}"


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def make_read_only(folder: Path) -> None:
    """No file or folder under ``folder`` is writable but by its owner (links are left)."""
    for path in [folder, *folder.rglob("*")]:
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode) and mode & 0o022:
            path.chmod(stat.S_IMODE(mode) & ~0o022)


def disk_usage(folder: Path) -> int:
    """Bytes ``folder`` holds on disk (a file with several links counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for path in [folder, *folder.rglob("*")]:
        status = path.lstat()
        if (status.st_dev, status.st_ino) not in seen:
            seen.add((status.st_dev, status.st_ino))
            total += status.st_blocks * 512
    return total


def remove(folder: Path) -> None:
    """``folder`` and all it holds, even the folders an image has with no write bit."""
    for path in [folder, *folder.rglob("*")]:
        mode = path.lstat().st_mode
        if stat.S_ISDIR(mode) and not mode & stat.S_IWUSR:
            path.chmod(stat.S_IMODE(mode) | stat.S_IRWXU)
    shutil.rmtree(folder, ignore_errors=True)
