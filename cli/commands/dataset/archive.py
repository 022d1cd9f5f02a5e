"""A file or a directory as a zip archive, made chunk by chunk while it is sent.

The archive depends on the files' names and contents only (fixed dates and modes, names in
order), so pushing an unchanged directory again gives the same content hash. Only the standard
library here: ``--help`` stays instant.
"""

from __future__ import annotations

import hashlib
import os
import stat
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cli.errors import CliError

FIXED_TIME = (1980, 1, 1, 0, 0, 0)
CHUNK = 2**20


@dataclass(frozen=True)
class Entry:
    name: str
    """The name inside the archive (``/``-separated; a directory's ends with ``/``)."""
    path: Path | None
    """The file to read; None for a directory."""
    size: int = 0


@dataclass
class Scan:
    entries: list[Entry]
    files: int
    size: int
    left_out: list[str] = field(default_factory=list)
    """What is neither a file nor a directory (links to directories, sockets...)."""


def scan(source: Path) -> Scan:
    """What the archive of ``source`` will hold, checked before a byte is sent."""
    try:
        top = source.stat()
    except OSError as error:
        raise CliError(
            f"cannot read {source}: {error.strerror}; give a file or a directory"
        ) from None
    if stat.S_ISREG(top.st_mode):
        entries = [_file(source.name, source)]
        return Scan(entries, 1, entries[0].size)
    if not stat.S_ISDIR(top.st_mode):
        raise CliError(f"{source} is neither a file nor a directory")
    entries, left_out = [], []
    for folder, subfolders, files in os.walk(source, onerror=_raise):
        subfolders.sort()
        here = Path(folder)
        relative = here.relative_to(source).as_posix()
        for name in [name for name in subfolders if (here / name).is_symlink()]:
            subfolders.remove(name)  # a link to a directory is not followed: no loops
            left_out.append(f"{relative}/{name}".removeprefix("./"))
        if relative != "." and not files and not subfolders:
            entries.append(Entry(f"{relative}/", None))
        for name in sorted(files):
            inside = name if relative == "." else f"{relative}/{name}"
            if stat.S_ISREG(_stat(here / name).st_mode):
                entries.append(_file(inside, here / name))
            else:
                left_out.append(inside)
    files_only = [entry for entry in entries if entry.path is not None]
    if not files_only:
        raise CliError(f"{source} holds no file to push")
    return Scan(entries, len(files_only), sum(entry.size for entry in files_only), left_out)


def _raise(error: OSError) -> None:
    raise CliError(f"cannot read {error.filename}: {error.strerror}")


def _stat(path: Path) -> os.stat_result:
    try:
        return path.stat()  # a link to a file counts as that file
    except OSError as error:
        raise CliError(f"cannot read {path}: {error.strerror}") from None


def _file(name: str, path: Path) -> Entry:
    if not os.access(path, os.R_OK):
        raise CliError(f"cannot read {path}: permission denied")
    return Entry(name, path, _stat(path).st_size)


class _Sink:
    """Where zipfile writes: bytes wait here until the sender takes them."""

    def __init__(self) -> None:
        self.pending = bytearray()

    def write(self, data: bytes) -> int:
        self.pending += data
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def take(self) -> bytes:
        data = bytes(self.pending)
        self.pending.clear()
        return data


class ZipStream:
    """The archive of a scan as chunks; ``sha256`` and ``size`` are the archive's once sent."""

    def __init__(self, scanned: Scan) -> None:
        self.scanned = scanned
        self.digest = hashlib.sha256()
        self.size = 0

    @property
    def sha256(self) -> str:
        return self.digest.hexdigest()

    def __iter__(self) -> Iterator[bytes]:
        sink = _Sink()
        with zipfile.ZipFile(sink, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
            for entry in self.scanned.entries:
                info = zipfile.ZipInfo(entry.name, FIXED_TIME)
                if entry.path is None:
                    info.external_attr = (0o40755 << 16) | 0x10
                    archive.writestr(info, b"")
                    continue
                info.external_attr = 0o100644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                info.file_size = entry.size  # a large file gets zip64 headers
                with entry.path.open("rb") as source, archive.open(info, "w") as target:
                    while chunk := source.read(CHUNK):
                        target.write(chunk)
                        yield from self._sent(sink)
                yield from self._sent(sink)
        yield from self._sent(sink)

    def _sent(self, sink: _Sink) -> Iterator[bytes]:
        data = sink.take()
        if data:
            self.digest.update(data)
            self.size += len(data)
            yield data
