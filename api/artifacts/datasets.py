"""Datasets' archives in the artifact store: ``datasets/<sha256>.zip``, one object per content.

A push is received under a scratch key while its SHA-256 is computed, checked through the
store's reader (the archive limits against zip bombs; only plain files and directories, every
name inside the archive), then kept under its hash: pushing identical content again stores
nothing new. A refused push leaves nothing behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from api.artifacts.archives import ArchiveLimits, InvalidArchive, open_archive, unsafe_entry
from api.artifacts.store import ArtifactStore, dataset_key


@dataclass(frozen=True)
class StoredDataset:
    content_hash: str
    """The SHA-256 of the archive, as 64 lower-case hexadecimal digits."""
    size: int
    """The bytes of its files, unpacked."""
    files: int
    archive_size: int
    """The bytes of the archive."""


def keep_dataset(store: ArtifactStore, scratch: str, archive_size: int,
                 content_hash: str) -> StoredDataset:  # fmt: skip
    """Check a received archive and keep it under its hash (once); the scratch object goes."""
    try:
        with store.open(scratch) as handle:
            size, files = describe_dataset(handle, store.limits)
    except BaseException:
        store.delete(scratch)
        raise
    store.keep(scratch, dataset_key(content_hash))
    return StoredDataset(content_hash, size, files, archive_size)


def describe_dataset(handle: IO[bytes], limits: ArchiveLimits) -> tuple[int, int]:
    """The bytes and the number of files a dataset archive unpacks to; InvalidArchive when
    an entry is not a plain file or directory, or would land outside the dataset."""
    size = files = 0
    with open_archive(handle, limits) as archive:
        for info in archive.infolist():
            problem = unsafe_entry(info, "the dataset's directory")
            if problem is not None:
                raise InvalidArchive(
                    f"the archive's entry {info.filename[:100]!r} {problem}; push a directory "
                    "of plain files (`flexai dataset push NAME PATH` makes such an archive)"
                )
            if not info.is_dir():
                files += 1
                size += info.file_size
    return size, files
