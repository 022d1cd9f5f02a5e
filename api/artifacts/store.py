"""The artifact store: what a job's logs, checkpoints and outputs and the datasets are kept in,
behind one interface with two implementations.

- :class:`api.artifacts.local.LocalArtifactStore`: files under ``<data-dir>/artifacts``, the
  embedded default (bytes pass through the server, which is the store).
- :class:`api.artifacts.s3.S3ArtifactStore`: an S3-compatible bucket
  (``--artifact-store s3://BUCKET[/PREFIX]``). Nodes and clients move checkpoints and outputs
  straight to and from the bucket through presigned URLs; the server sees none of their bytes.

Every artifact has a key, the same in both stores (:func:`checkpoint_key`, :func:`output_key`,
:func:`dataset_key`; the S3 store puts its prefix before it). A job's logs and outputs are kept
per attempt (:func:`common.attempts.attempt_key`: the first attempt's where they always were).
Checkpoints and outputs arrive in **multipart uploads** that the server begins, hands out part
targets for, and completes: an upload is invisible until completed, so a partial object is
never read, listed or recorded. The server then reads the archive's central directory through
:meth:`ArtifactStore.open` (ranged reads on S3) to check and describe it, and records it in the
ledger with its size and SHA-256. Downloads are :class:`Download` answers: a presigned URL to
redirect to, or a file this server sends itself.

Logs stay live for ``logs --follow``: the agent ships chunks to the server as before. The local
store appends them to a file; the S3 store keeps the newest bytes in the operational database
(shared by every replica) and writes them to the bucket in parts (see its docstring).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from api.artifacts.archives import ArchiveLimits
from common.attempts import attempt_key

MIN_PART = 5 * 2**20
"""S3's smallest part (all but the last)."""
DEFAULT_PART = 32 * 2**20
MAX_PARTS = 10_000
"""S3's most parts in one upload."""


class LogOffsetMismatch(Exception):
    def __init__(self, expected: int) -> None:
        self.expected = expected
        super().__init__(f"log bytes must continue at offset {expected}; resend from there")


class StorageUnavailable(Exception):
    """The store cannot be reached or refuses to write or read now: the API answers 503 with
    ``Retry-After`` and its clients retry."""

    def __init__(self, what: str, where: str, error: BaseException | str) -> None:
        self.what = what
        self.where = where
        reason = error if isinstance(error, str) else getattr(error, "strerror", None) or error
        super().__init__(f"cannot store or read {what} in {where}: {reason}")


class UploadIncomplete(Exception):
    """An upload's parts do not make the object it announced (missing parts, wrong size)."""


def checkpoint_key(job_id: str, checkpoint_id: str) -> str:
    return f"jobs/{job_id}/checkpoints/{checkpoint_id}.zip"


def output_key(job_id: str, node_index: int, attempt: int = 1) -> str:
    return f"jobs/{attempt_key(job_id, attempt)}/outputs/output_{node_index}.zip"


def dataset_key(content_hash: str) -> str:
    return f"datasets/{content_hash}.zip"


def job_prefix(job_id: str) -> str:
    """Every key of one job's artifacts starts with it (logs included)."""
    return f"jobs/{job_id}/"


async def hashed_pieces(
    body: AsyncIterator[bytes], piece_size: int, send: Callable[[bytes], object],
    last: Callable[[bytes], object],
) -> tuple[int, str]:  # fmt: skip
    """Hand ``body`` on in pieces of at least ``piece_size`` bytes (``send``, in a thread, so
    the event loop never waits on the store), the rest to ``last``; its size and SHA-256."""
    digest = hashlib.sha256()
    size = 0
    pending = bytearray()
    async for chunk in body:
        pending += chunk
        if len(pending) >= piece_size:
            digest.update(pending)
            size += len(pending)
            await asyncio.to_thread(send, bytes(pending))
            pending.clear()
    digest.update(pending)
    size += len(pending)
    await asyncio.to_thread(last, bytes(pending))
    return size, digest.hexdigest()


def part_size_for(size_hint: int | None) -> int:
    """A part size that keeps an upload of about ``size_hint`` bytes within S3's part count."""
    if not size_hint:
        return DEFAULT_PART
    needed = -(-size_hint // (MAX_PARTS - 100))  # headroom: the hint is the files' bytes
    return max(DEFAULT_PART, -(-needed // MIN_PART) * MIN_PART)


@dataclass(frozen=True)
class StartedUpload:
    store_upload_id: str
    """The store's name for the upload (S3's UploadId; the local store's partial file)."""
    part_size: int
    """Every part but the last has exactly this many bytes."""


@dataclass(frozen=True)
class PartTarget:
    number: int
    url: str
    """Absolute (``https://...``: the store itself, presigned; the sender adds no credential)
    or a path on this API (``/v1/...``: the sender adds its token)."""
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Part:
    number: int
    etag: str


@dataclass(frozen=True)
class Download:
    """Where a client gets an artifact's bytes: ``url`` (presigned, to redirect to) or
    ``path`` (a file this server sends itself, ranges included)."""

    size: int
    url: str | None = None
    path: Path | None = None


class ArtifactStore(Protocol):
    """What the routes, the scheduler and ``admin verify``/``purge`` need of a store. Every
    method raises :class:`StorageUnavailable` when the store cannot be reached."""

    kind: str
    """``local`` or ``s3``."""
    limits: ArchiveLimits
    where: str
    """Where it keeps things, for messages (a directory, or ``s3://bucket/prefix``)."""

    # -- logs (one stream per node of a job) ----------------------------------------------

    def log_size(self, job_id: str, node_index: int = 0) -> int: ...

    def append_log(self, job_id: str, offset: int, data: bytes, node_index: int = 0) -> int:
        """Append bytes that start at ``offset`` (bytes already held are not written twice);
        the log's size after. :class:`LogOffsetMismatch` when ``offset`` is past its end."""
        ...

    def read_log(
        self, job_id: str, offset: int, limit: int = 1 << 20, node_index: int = 0
    ) -> bytes: ...

    def settle_logs(self, job_ids: Iterable[str]) -> None:
        """Write what the store still holds aside of these (ended) jobs' logs, every attempt's,
        into the store for good; nothing to do for the local store."""
        ...

    # -- multipart uploads, straight from a node ------------------------------------------

    def begin_upload(self, key: str, size_hint: int | None = None) -> StartedUpload:
        """Begin an upload to ``key``; earlier unfinished uploads to it are aborted."""
        ...

    def part_targets(
        self, key: str, upload: StartedUpload, numbers: Iterable[int], upload_id: str
    ) -> list[PartTarget]:
        """Where each part goes: presigned URLs (S3), or this API's
        ``/v1/agent/uploads/{upload_id}/parts/{n}`` (local; ``upload_id`` is the route's)."""
        ...

    async def receive_part(
        self, key: str, upload: StartedUpload, number: int, body: AsyncIterator[bytes]
    ) -> Part:
        """Store one part sent to this server (the local store only)."""
        ...

    def complete_upload(self, key: str, upload: StartedUpload, parts: list[Part]) -> int:
        """Make the object from its parts, atomically; its size. :class:`UploadIncomplete`
        when the parts do not make a whole object."""
        ...

    def abort_upload(self, key: str, upload: StartedUpload) -> None: ...

    # -- through the server (datasets' pushes) --------------------------------------------

    async def receive_hashed(self, body: AsyncIterator[bytes]) -> tuple[str, int, str]:
        """Store a body under a scratch key; the key, the size and the SHA-256 (a dataset is
        then kept under its hash with :meth:`keep`)."""
        ...

    def keep(self, scratch: str, key: str) -> None:
        """Move a scratch object to ``key``, unless ``key`` holds it already; the scratch goes."""
        ...

    # -- what is stored -------------------------------------------------------------------

    def size(self, key: str) -> int | None:
        """The object's size, or None when there is none."""
        ...

    def open(self, key: str) -> AbstractContextManager[IO[bytes]]:
        """A seekable reader of the object (ranged reads on S3): for its central directory."""
        ...

    def sha256(self, key: str) -> str:
        """The object's SHA-256, read whole (``admin verify --artifacts deep``)."""
        ...

    def download(self, key: str, filename: str) -> Download:
        """Where a client reads the object, saved as ``filename``; FileNotFoundError when there
        is none."""
        ...

    def delete(self, key: str) -> None: ...

    def delete_job(self, job_id: str) -> int:
        """Remove every artifact of the job (logs included); how many objects went."""
        ...
