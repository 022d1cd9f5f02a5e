"""Checkpoints: each direct child of ``output-checkpoint/`` becomes one, uploaded as a zip.

While the job runs a child is uploaded once it has stopped changing (no file added, resized or
touched) for ``stable_for`` seconds; when the job ends :meth:`CheckpointWatcher.finish`
uploads whatever is left. Names starting with ``.`` or ``tmp-`` are work in progress (the
Hugging Face trainer writes ``tmp-checkpoint-N`` and renames it) and are never uploaded.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from node_agent.client import ApiError, ApiUnavailable, ControlPlaneClient

log = logging.getLogger("flexai.agent")

Signature = tuple[int, int, int]


def zip_tree(source: Path, archive: Path, *, trusted: Path, compress: bool = True) -> None:
    """Zip a directory's contents (paths relative to it), or one file under its own name.

    The job owns everything below ``trusted`` (the job's directory) and may have planted
    symbolic links there: every name from ``trusted`` down is opened without following one, so
    the agent never packs a file of its own (its token...) for the job's user to download.
    Links are left out, with a warning.
    """
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    top = _open_below(trusted, source.relative_to(trusted).parts)
    left_out: list[str] = []
    try:
        with zipfile.ZipFile(archive, "w", method, allowZip64=True) as bundle:
            if not stat.S_ISDIR(os.fstat(top).st_mode):
                _add_file(bundle, os.dup(top), source.name, method, left_out)
                return
            for folder, subfolders, files, folder_fd in os.fwalk(".", dir_fd=top):
                subfolders.sort()
                here = os.path.normpath(folder)
                if here != "." and not files and not subfolders:
                    bundle.mkdir(here)  # keep empty folders
                for name in sorted(files):
                    relative = os.path.normpath(os.path.join(here, name))
                    try:
                        fd = os.open(name, _READ_NO_LINK, dir_fd=folder_fd)
                    except OSError:  # a link (ELOOP), or gone meanwhile
                        left_out.append(relative)
                        continue
                    _add_file(bundle, fd, relative, method, left_out)
    finally:
        os.close(top)
    if left_out:
        log.warning("%s: left out what is not a plain file: %s", source, ", ".join(left_out))


_READ_NO_LINK = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _open_below(trusted: Path, parts: tuple[str, ...]) -> int:
    """Open ``trusted/parts...`` following no link after ``trusted``."""
    fd = os.open(trusted, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, part in enumerate(parts):
            flags = _READ_NO_LINK | (os.O_DIRECTORY if index < len(parts) - 1 else 0)
            inner = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _add_file(
    bundle: zipfile.ZipFile, fd: int, name: str, method: int, left_out: list[str]
) -> None:
    """Add the open file ``fd`` (closed here) under ``name``, if it is a plain file."""
    with os.fdopen(fd, "rb") as source:
        status = os.fstat(source.fileno())
        if not stat.S_ISREG(status.st_mode):  # a FIFO or a device would block or never end
            left_out.append(name)
            return
        moment = max(time.localtime(status.st_mtime)[:6], (1980, 1, 1, 0, 0, 0))
        info = zipfile.ZipInfo(name, date_time=moment)
        info.compress_type = method
        info.external_attr = (status.st_mode & 0xFFFF) << 16
        info.file_size = status.st_size  # lets zipfile choose ZIP64 for a large file
        with bundle.open(info, "w") as sink:
            shutil.copyfileobj(source, sink, 1024 * 1024)


def signature(path: Path) -> Signature:
    """What changes whenever something is written under ``path``: count, bytes, newest mtime."""
    if path.is_symlink() or not path.is_dir():  # a link is not walked: it will not be zipped
        status = path.lstat()
        return (1, status.st_size, status.st_mtime_ns)
    count, size, newest = 0, 0, path.lstat().st_mtime_ns
    for folder, _subfolders, files in os.walk(path):
        newest = max(newest, os.lstat(folder).st_mtime_ns)
        for name in files:
            try:
                status = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            count, size = count + 1, size + status.st_size
            newest = max(newest, status.st_mtime_ns)
    return (count, size, newest)


class CheckpointWatcher:
    """Watches one job's checkpoint directory and uploads each checkpoint once."""

    def __init__(
        self,
        client: ControlPlaneClient,
        job_id: str,
        node_id: str,
        directory: Path,
        scratch: Path,
        *,
        stable_for: float = 1.0,
        interval: float = 0.5,
        on_upload: Callable[[str], None] | None = None,
        node_index: int = 0,
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.node_id = node_id
        self.node_index = node_index
        self.directory = directory
        self.scratch = scratch
        self.stable_for = stable_for
        self.interval = interval
        self.on_upload = on_upload
        self.uploaded: list[str] = []
        self._settled: set[str] = set()  # uploaded, or refused for good
        self._seen: dict[str, tuple[Signature, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"ckpt-{job_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop_watching(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def finish(self) -> None:
        """Stop watching and upload every checkpoint not uploaded yet."""
        self.stop_watching()
        self.scan(final=True)

    def scan(self, final: bool = False) -> None:
        for child in self._candidates():
            if final or self._is_stable(child):
                self._upload(child, final)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.scan()
            except Exception:  # the watcher must outlive any one bad scan
                log.exception("job %s: checkpoint scan failed", self.job_id)

    def _candidates(self) -> list[Path]:
        try:
            children = [
                child
                for child in self.directory.iterdir()
                if child.name not in self._settled and not child.name.startswith((".", "tmp-"))
            ]
        except FileNotFoundError:
            return []
        return sorted(children, key=_mtime)

    def _is_stable(self, child: Path) -> bool:
        try:
            current = signature(child)
        except OSError:
            return False
        now = time.monotonic()
        previous = self._seen.get(child.name)
        if previous is None or previous[0] != current:
            self._seen[child.name] = (current, now)
            return False
        empty_folder = child.is_dir() and current[0] == 0
        return not empty_folder and now - previous[1] >= self.stable_for

    def _upload(self, child: Path, final: bool) -> None:
        name = child.name
        archive = self.scratch / f"checkpoint-upload-{os.getpid()}-{threading.get_ident()}.zip"
        try:
            # weights barely compress: speed wins
            zip_tree(child, archive, trusted=self.directory.parent, compress=False)
            self.client.upload_checkpoint(self.job_id, name, self.node_id, archive, self.node_index)
        except ApiUnavailable as error:
            log.warning("job %s: checkpoint %s not uploaded yet: %s", self.job_id, name, error)
            if final:
                self._settled.add(name)
            return
        except (ApiError, OSError) as error:
            log.error("job %s: checkpoint %s not uploaded: %s", self.job_id, name, error)
            self._settled.add(name)
            return
        finally:
            archive.unlink(missing_ok=True)
        self._settled.add(name)
        self.uploaded.append(name)
        log.info("job %s: checkpoint %s uploaded", self.job_id, name)
        if self.on_upload is not None:
            self.on_upload(name)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
