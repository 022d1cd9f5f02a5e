"""Datasets' archives in the artifact store: ``datasets/<sha256>.zip``, one file per content.

A push is received into a file while its SHA-256 is computed, checked (the archive limits
against zip bombs; only plain files and directories, every name inside the archive), then
renamed into place under its hash: pushing identical content again stores nothing new.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from api.artifacts.store import (
    ArchiveLimits,
    InvalidArchive,
    LocalArtifactStore,
    StorageUnavailable,
    open_archive,
    unsafe_entry,
)


@dataclass(frozen=True)
class StoredDataset:
    content_hash: str
    """The SHA-256 of the archive, as 64 lower-case hexadecimal digits."""
    size: int
    """The bytes of its files, unpacked."""
    files: int


class DatasetArchives:
    def __init__(self, store: LocalArtifactStore) -> None:
        self.store = store
        self.root = store.root / "datasets"

    def path(self, content_hash: str) -> Path:
        """Where a version's archive is kept (``content_hash`` checked by the caller)."""
        return self.root / f"{content_hash}.zip"

    async def receive(self, body: AsyncIterator[bytes]) -> tuple[Path, str]:
        """Write a pushed archive into a new file; return it and its SHA-256."""
        digest = hashlib.sha256()

        async def hashed() -> AsyncIterator[bytes]:
            async for chunk in body:
                digest.update(chunk)
                yield chunk

        upload = await self.store.receive_into(self.root / "uploads", hashed())
        return upload, digest.hexdigest()

    def keep(self, upload: Path, content_hash: str) -> StoredDataset:
        """Check the received archive and keep it under its hash (once); drop the upload."""
        try:
            size, files = describe_dataset(upload, self.store.limits)
            target = self.path(content_hash)
            try:
                if not target.exists():
                    upload.replace(target)
            except OSError as error:
                raise StorageUnavailable("datasets", self.root, error) from error
        finally:
            upload.unlink(missing_ok=True)
        return StoredDataset(content_hash, size, files)


def describe_dataset(path: Path, limits: ArchiveLimits) -> tuple[int, int]:
    """The bytes and the number of files a dataset archive unpacks to; InvalidArchive when
    an entry is not a plain file or directory, or would land outside the dataset."""
    size = files = 0
    with open_archive(path, limits) as archive:
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
