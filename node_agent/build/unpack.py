"""Zip archives from the control plane unpacked safely: a dataset version, an input checkpoint.

Only plain files and directories are unpacked, each strictly inside the destination: an entry
that is a link or a special file, or whose name is absolute, holds ``..``, ``.``, an empty part,
a backslash or a NUL, refuses the whole archive (zip-slip). No more entries and bytes than the
limits, nor than the archive declares (a zip bomb), nor than the disk has free. Files are
created with ``O_EXCL | O_NOFOLLOW``: nothing already there is overwritten or followed.
"""

from __future__ import annotations

import os
import shutil
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

_CHUNK = 2**20


class ArchiveRefused(Exception):
    """The archive cannot be unpacked safely; the message says why."""


class NoSpace(ArchiveRefused):
    """The disk has less room than the archive unpacks to."""


@dataclass(frozen=True)
class UnpackLimits:
    """What one archive may unpack to on this node (the control plane has its own limits)."""

    max_entries: int = 10_000_000
    max_bytes: int = 2**40


def unpack(archive: Path, destination: Path, limits: UnpackLimits, what: str) -> None:
    """Unpack into ``destination`` (created if missing; ``what`` names the archive in errors,
    e.g. "the dataset"): plain files and directories only, each inside it, within limits."""
    destination.mkdir(mode=0o700, exist_ok=True)
    try:
        bundle = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as error:
        raise ArchiveRefused(f"{what}'s archive cannot be read: {error}") from None
    with bundle:
        infos = bundle.infolist()
        declared = sum(info.file_size for info in infos)
        if len(infos) > limits.max_entries or declared > limits.max_bytes:
            raise ArchiveRefused(
                f"{what} holds {len(infos)} entries and {declared} bytes; this node takes "
                f"at most {limits.max_entries} entries and {limits.max_bytes} bytes"
            )
        free = shutil.disk_usage(destination).free
        if declared > free:
            raise NoSpace(f"{what} needs {declared} bytes and this node has {free} free")
        places = [destination.joinpath(*safe_parts(info, what)) for info in infos]
        budget = _Budget(declared, what)
        for info, path in zip(infos, places, strict=True):
            try:
                if info.is_dir():
                    path.mkdir(parents=True, exist_ok=True)
                else:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    _extract(bundle, info, path, budget)
            except (OSError, zipfile.BadZipFile, EOFError) as error:
                raise ArchiveRefused(
                    f"{what}'s entry {info.filename[:100]!r} cannot be unpacked: {error}"
                ) from None


def safe_parts(info: zipfile.ZipInfo, what: str) -> tuple[str, ...]:
    """The entry's name as parts that stay inside the destination; ArchiveRefused otherwise."""
    name = info.filename
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise ArchiveRefused(f"{what}'s entry {name[:100]!r} is a link or a special file")
    parts = PurePosixPath(name).parts
    if (name.startswith("/") or "\\" in name or "\x00" in name or "//" in name or not parts
            or any(part in (".", "..") for part in parts)):  # fmt: skip
        raise ArchiveRefused(f"{what}'s entry {name[:100]!r} would land outside of it")
    return parts


class _Budget:
    """The bytes an archive may still write: what it declared, not a byte more."""

    def __init__(self, declared: int, what: str) -> None:
        self.left = declared
        self.what = what

    def spend(self, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise ArchiveRefused(f"{self.what}'s archive unpacks to more bytes than it declares")


def _extract(bundle: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path, budget: _Budget) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with bundle.open(info) as source, os.fdopen(os.open(path, flags, 0o600), "wb") as sink:
        while chunk := source.read(_CHUNK):
            budget.spend(len(chunk))
            sink.write(chunk)
