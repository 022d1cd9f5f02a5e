"""The local artifact store: files under the data directory (``<data-dir>/artifacts``), the
embedded default behind :class:`api.artifacts.store.ArtifactStore`.

Each key is a file under the root (``jobs/<id>/logs.txt``, ``jobs/<id>/checkpoints/<cid>.zip``,
``jobs/<id>/outputs/output_<k>.zip``, ``datasets/<sha>.zip``); a key never names a file outside
it. A multipart upload is one partial file, ``uploads/<store_upload_id>.partial`` (under the
job's directory for a job's artifacts, so that it goes with the job), that each part is written
into at its place, plus a receipt per part beside it; completing it checks every part arrived
and renames the file into place, so a partial object is never read. A disk that refuses a write
(permissions, full, read-only) raises :class:`StorageUnavailable`, which the API answers with
503 so that agents retry.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import threading
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path, PurePosixPath
from typing import IO

from api.artifacts.archives import ArchiveLimits
from api.artifacts.store import (
    Download,
    LogOffsetMismatch,
    Part,
    PartTarget,
    StartedUpload,
    StorageUnavailable,
    UploadIncomplete,
    hashed_pieces,
    job_prefix,
    part_size_for,
)

_WRITE_BUFFER = 2**20
"""Bytes gathered from a request body before one write: one thread hop per MiB, not per network
read, written as the pieces that came (``pwritev``: never joined, never copied here)."""
_IOV_MAX = 1024
_UPLOADS = "uploads"
NOT_OPEN = ("this upload is no longer open (completed, aborted, or replaced by a newer upload of "
            "the same artifact); begin a new one")


def safe_parts(key: str) -> tuple[str, ...]:
    """The path parts of a key; ValueError when it could name a file outside the store."""
    parts = PurePosixPath(key).parts
    if (not key or key.startswith("/") or "\\" in key or "\x00" in key or "//" in key
            or any(part in (".", "..") for part in parts)):  # fmt: skip
        raise ValueError(f"not an artifact key: {key[:200]!r}")
    return parts


class LocalArtifactStore:
    kind = "local"

    def __init__(self, root: Path, limits: ArchiveLimits | None = None) -> None:
        self.root = root
        self.limits = limits or ArchiveLimits()
        self.where = str(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._log_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)

    def path(self, key: str) -> Path:
        """The file of a key, always under the root."""
        return self.root.joinpath(*safe_parts(key))

    @contextmanager
    def _storing(self, what: str) -> Iterator[None]:
        try:
            yield
        except FileNotFoundError:
            raise
        except OSError as error:
            raise StorageUnavailable(what, self.where, error) from error

    # -- logs -----------------------------------------------------------------------------

    def _log_path(self, job_id: str, node_index: int = 0) -> Path:
        """Each node of a job has its own log (node 0's keeps the single-node name)."""
        name = "logs.txt" if node_index == 0 else f"logs-{node_index}.txt"
        return self.path(job_prefix(job_id) + name)

    def log_size(self, job_id: str, node_index: int = 0) -> int:
        try:
            return self._log_path(job_id, node_index).stat().st_size
        except FileNotFoundError:
            return 0

    def append_log(self, job_id: str, offset: int, data: bytes, node_index: int = 0) -> int:
        """Append bytes that start at ``offset``; bytes already held are not written twice."""
        with self._log_locks[f"{job_id}/{node_index}"], self._storing("log bytes"):
            size = self.log_size(job_id, node_index)
            if offset > size:
                raise LogOffsetMismatch(size)
            fresh = data[size - offset :]
            if fresh:
                path = self._log_path(job_id, node_index)
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("ab") as handle:
                    handle.write(fresh)
                    handle.flush()
                    os.fsync(handle.fileno())
            return size + len(fresh)

    def read_log(
        self, job_id: str, offset: int, limit: int = 1 << 20, node_index: int = 0
    ) -> bytes:
        try:
            handle = self._log_path(job_id, node_index).open("rb")
        except FileNotFoundError:
            return b""
        with handle, self._storing("log bytes"):
            if offset >= os.fstat(handle.fileno()).st_size:
                return b""  # never seek past the end: a file system refuses far offsets
            handle.seek(offset)
            return handle.read(limit)

    def settle_logs(self, job_ids: Iterable[str]) -> None:
        """Every log byte is in its file already."""

    # -- multipart uploads ----------------------------------------------------------------

    def _uploads(self, key: str) -> Path:
        """Where a key's uploads are received: beside a job's artifacts (they go with the
        job), else at the root; on the file system of their final place, for the rename."""
        parts = safe_parts(key)
        if parts[0] == "jobs" and len(parts) > 2:
            return self.root / "jobs" / parts[1] / _UPLOADS
        return self.root / _UPLOADS

    def _partial(self, key: str, upload: StartedUpload) -> Path:
        return self._uploads(key) / f"{upload.store_upload_id}.partial"

    def _receipts(self, key: str, upload: StartedUpload) -> Path:
        return self._uploads(key) / f"{upload.store_upload_id}.parts"

    @staticmethod
    def _key_tag(key: str) -> str:
        """What the uploads of one key have in common (their ids start with it)."""
        return hashlib.sha256(key.encode()).hexdigest()[:24]

    def begin_upload(self, key: str, size_hint: int | None = None) -> StartedUpload:
        tag = self._key_tag(key)
        with self._storing("uploads"):
            directory = self._uploads(key)
            directory.mkdir(parents=True, exist_ok=True)
            for earlier in directory.glob(f"{tag}-*.partial"):
                self.abort_upload(key, StartedUpload(earlier.stem, 0))
            upload = StartedUpload(f"{tag}-{uuid.uuid4().hex}", part_size_for(size_hint))
            self._partial(key, upload).touch(exist_ok=False)
            self._receipts(key, upload).mkdir()
        return upload

    def part_targets(
        self, key: str, upload: StartedUpload, numbers: Iterable[int], upload_id: str
    ) -> list[PartTarget]:
        return [PartTarget(n, f"/v1/agent/uploads/{upload_id}/parts/{n}") for n in numbers]

    async def receive_part(
        self, key: str, upload: StartedUpload, number: int, body: AsyncIterator[bytes]
    ) -> Part:
        """Write the part into the upload's file at ``(number - 1) * part_size``, a MiB at a
        time (memory stays flat), then note its receipt."""
        if not 1 <= number <= 10_000:
            raise UploadIncomplete(f"part number {number} is not between 1 and 10000")
        receipt = self._receipts(key, upload) / str(number)
        try:
            fd = os.open(self._partial(key, upload), os.O_WRONLY)
            receipt.unlink(missing_ok=True)  # its bytes change now: an earlier receipt is void
        except FileNotFoundError:
            raise UploadIncomplete(NOT_OPEN) from None
        except OSError as error:
            raise StorageUnavailable("uploads", self.where, error) from error
        try:
            size = await self._write_part(fd, (number - 1) * upload.part_size, upload, body)
        finally:
            os.close(fd)
        etag = uuid.uuid4().hex
        with self._storing("uploads"):
            scratch = receipt.with_name(f"{number}.{etag}")
            scratch.write_text(f"{size} {etag}")
            scratch.replace(receipt)
        return Part(number, etag)

    async def _write_part(
        self, fd: int, start: int, upload: StartedUpload, body: AsyncIterator[bytes]
    ) -> int:
        at = start
        pending: list[bytes] = []
        held = 0
        with self._storing("uploads"):
            async for chunk in body:
                pending.append(chunk)
                held += len(chunk)
                if at + held - start > upload.part_size:
                    raise UploadIncomplete(f"a part holds at most {upload.part_size} bytes (the "
                                           "upload's part size)")  # fmt: skip
                if held >= _WRITE_BUFFER:
                    await asyncio.to_thread(pwrite_all, fd, pending, at)
                    at, pending, held = at + held, [], 0
            await asyncio.to_thread(pwrite_all, fd, pending, at)
        return at + held - start

    def _received(self, key: str, upload: StartedUpload) -> dict[int, tuple[int, str]]:
        found: dict[int, tuple[int, str]] = {}
        for receipt in self._receipts(key, upload).iterdir():
            if receipt.name.isdigit():
                size, _, etag = receipt.read_text().partition(" ")
                found[int(receipt.name)] = (int(size), etag)
        return found

    def complete_upload(self, key: str, upload: StartedUpload, parts: list[Part]) -> int:
        target = self.path(key)
        partial = self._partial(key, upload)
        with self._storing("uploads"):
            try:
                received = self._received(key, upload)
                partial.stat()
            except FileNotFoundError:
                raise UploadIncomplete(NOT_OPEN) from None
            size = _whole_size(upload, parts, received)
            os.truncate(partial, size)  # a longer last part sent earlier leaves no tail
            target.parent.mkdir(parents=True, exist_ok=True)
            partial.replace(target)
            shutil.rmtree(self._receipts(key, upload), ignore_errors=True)
        return size

    def abort_upload(self, key: str, upload: StartedUpload) -> None:
        with self._storing("uploads"):
            self._partial(key, upload).unlink(missing_ok=True)
            shutil.rmtree(self._receipts(key, upload), ignore_errors=True)

    # -- through the server ---------------------------------------------------------------

    async def receive_hashed(self, body: AsyncIterator[bytes]) -> tuple[str, int, str]:
        scratch = f"{_UPLOADS}/{uuid.uuid4().hex}.scratch"
        path = self.path(scratch)
        with self._storing("uploads"):
            path.parent.mkdir(parents=True, exist_ok=True)
            sink = path.open("wb")
        try:
            with sink, self._storing("uploads"):
                size, sha256 = await hashed_pieces(body, _WRITE_BUFFER, sink.write, sink.write)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return scratch, size, sha256

    def keep(self, scratch: str, key: str) -> None:
        source, target = self.path(scratch), self.path(key)
        with self._storing("uploads"):
            if target.exists():
                source.unlink(missing_ok=True)
                return
            target.parent.mkdir(parents=True, exist_ok=True)
            source.replace(target)

    # -- what is stored -------------------------------------------------------------------

    def size(self, key: str) -> int | None:
        try:
            with self._storing("artifacts"):
                return self.path(key).stat().st_size
        except FileNotFoundError:
            return None

    def open(self, key: str) -> AbstractContextManager[IO[bytes]]:
        with self._storing("artifacts"):
            return self.path(key).open("rb")

    def sha256(self, key: str) -> str:
        digest = hashlib.sha256()
        with self._storing("artifacts"), self.path(key).open("rb") as handle:
            while chunk := handle.read(_WRITE_BUFFER):
                digest.update(chunk)
        return digest.hexdigest()

    def download(self, key: str, filename: str) -> Download:
        path = self.path(key)
        with self._storing("artifacts"):
            return Download(size=path.stat().st_size, path=path)

    def delete(self, key: str) -> None:
        with self._storing("artifacts"):
            self.path(key).unlink(missing_ok=True)

    def delete_job(self, job_id: str) -> int:
        directory = self.path(job_prefix(job_id).rstrip("/"))
        with self._storing("artifacts"):
            if not directory.exists():
                return 0
            count = sum(1 for found in directory.rglob("*") if not found.is_dir())
            shutil.rmtree(directory)
        return count


def pwrite_all(fd: int, pieces: list[bytes], at: int) -> None:
    """Write ``pieces`` in order from offset ``at``, whole, with as few calls as it takes."""
    views = [memoryview(piece) for piece in pieces if piece]
    index = 0
    while index < len(views):
        written = os.pwritev(fd, views[index : index + _IOV_MAX], at)
        at += written
        while written and written >= len(views[index]):
            written -= len(views[index])
            index += 1
        if written:
            views[index] = views[index][written:]


def _whole_size(
    upload: StartedUpload, parts: list[Part], received: dict[int, tuple[int, str]]
) -> int:
    """The object's size when ``parts`` are 1..N, each received as sent and full but the last;
    UploadIncomplete naming what is missing otherwise."""
    numbers = sorted(part.number for part in parts)
    if not numbers:
        raise UploadIncomplete("an upload needs at least one part")
    if numbers != list(range(1, len(numbers) + 1)):
        missing = sorted(set(range(1, numbers[-1] + 1)) - set(numbers))
        raise UploadIncomplete(
            f"parts {missing[:10]} are missing or named twice: send parts 1 to {numbers[-1]}"
            if missing else "a part is named twice"
        )
    for part in parts:
        got = received.get(part.number)
        if got is None or got[1] != part.etag:
            raise UploadIncomplete(
                f"part {part.number} has not arrived (or was replaced since): send it again"
            )
    last = numbers[-1]
    for number in numbers[:-1]:
        if received[number][0] != upload.part_size:
            raise UploadIncomplete(
                f"part {number} holds {received[number][0]} bytes; every part but the last "
                f"holds {upload.part_size}"
            )
    return (last - 1) * upload.part_size + received[last][0]
