"""A directory (or one file) zipped as a stream, never a file on disk: the archive's bytes go to
any writer as they are made (an upload's parts), so a job's outputs and checkpoints need no
scratch space and start leaving the node at once.

Each file is stored as it is (``ZIP_STORED``) when its first 256 KiB do not shrink by a tenth
at zlib's fastest level (weights, already compressed data), else deflated: incompressible
bytes are copied, not churned.

The job owns everything below ``trusted`` (the job's directory) and may have planted symbolic
links there: every name from ``trusted`` down is opened without following one, so the agent
never packs a file of its own (its token...) for the job's user to download. Links, FIFOs and
devices are left out, with a warning.
"""

from __future__ import annotations

import logging
import os
import stat
import time
import zipfile
import zlib
from pathlib import Path
from typing import Protocol

log = logging.getLogger("flexai.agent")

SAMPLE_BYTES = 256 * 1024
"""How much of a file decides whether it is deflated."""
WORTH_DEFLATING = 0.9
"""A sample deflated to at most this fraction of its size is worth deflating."""
DEFLATE_LEVEL = 1
_COPY = 1024 * 1024
_READ_NO_LINK = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Writer(Protocol):
    """Where an archive's bytes go, in order (an open file, an upload's parts)."""

    def write(self, data: bytes, /) -> int: ...

    def flush(self) -> None: ...


def write_zip(source: Path, sink: Writer, *, trusted: Path, top_files: bool = False) -> None:
    """Zip a directory's contents (paths relative to it), or one file under its own name, into
    ``sink``: any writer, seekable or not (a stream's entries carry data descriptors).
    ``top_files``: only the files directly in the directory (the root checkpoint's)."""
    top = _open_below(trusted, source.relative_to(trusted).parts)
    left_out: list[str] = []
    try:
        with zipfile.ZipFile(_Unseekable(sink), "w", zipfile.ZIP_STORED, True) as bundle:
            if not stat.S_ISDIR(os.fstat(top).st_mode):
                _add_file(bundle, os.dup(top), source.name, left_out)
                return
            for folder, subfolders, files, folder_fd in os.fwalk(".", dir_fd=top):
                if top_files:
                    subfolders.clear()
                    files = [name for name in files if not name.startswith((".", "tmp-"))]
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
                    _add_file(bundle, fd, relative, left_out)
    finally:
        os.close(top)
    if left_out:
        log.warning("%s: left out what is not a plain file: %s", source, ", ".join(left_out))


def files_bytes(source: Path, top_files: bool = False) -> int:
    """The bytes of the plain files under ``source`` (about what its archive will hold)."""
    if source.is_symlink() or not source.is_dir():
        return source.lstat().st_size if source.is_file() and not source.is_symlink() else 0
    total = 0
    for folder, subfolders, files in os.walk(source):
        if top_files:
            subfolders.clear()
        for name in files:
            try:
                status = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if stat.S_ISREG(status.st_mode):
                total += status.st_size
    return total


def worth_deflating(sample: bytes) -> bool:
    """Whether a file that starts with ``sample`` shrinks enough to be deflated."""
    if not sample:
        return False
    return len(zlib.compress(sample, DEFLATE_LEVEL)) <= WORTH_DEFLATING * len(sample)


class _Unseekable:
    """A writer zipfile cannot seek back into, whatever it wraps (an open file included), so
    the archive is one forward stream, the same bytes wherever it goes."""

    def __init__(self, sink: Writer) -> None:
        self._sink = sink

    def write(self, data: bytes) -> int:
        self._sink.write(data)
        return len(data)

    def flush(self) -> None:
        self._sink.flush()

    def close(self) -> None:
        """The sink is its owner's to close."""


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


def _add_file(bundle: zipfile.ZipFile, fd: int, name: str, left_out: list[str]) -> None:
    """Add the open file ``fd`` (closed here) under ``name``, if it is a plain file."""
    with os.fdopen(fd, "rb") as source:
        status = os.fstat(source.fileno())
        if not stat.S_ISREG(status.st_mode):  # a FIFO or a device would block or never end
            left_out.append(name)
            return
        sample = source.read(SAMPLE_BYTES)
        moment = max(time.localtime(status.st_mtime)[:6], (1980, 1, 1, 0, 0, 0))
        info = zipfile.ZipInfo(name, date_time=moment)
        info.compress_type = zipfile.ZIP_DEFLATED if worth_deflating(sample) else zipfile.ZIP_STORED
        # An entry given as a ZipInfo keeps its own level (public only from Python 3.13).
        info._compresslevel = DEFLATE_LEVEL  # type: ignore[attr-defined]
        info.external_attr = (status.st_mode & 0xFFFF) << 16
        info.file_size = status.st_size  # lets zipfile choose ZIP64 for a large file
        with bundle.open(info, "w") as sink:
            sink.write(sample)
            while chunk := source.read(_COPY):
                sink.write(chunk)
