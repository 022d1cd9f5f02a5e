"""The S3 store: artifacts in an S3-compatible bucket (``--artifact-store s3://BUCKET[/PREFIX]``)
behind :class:`api.artifacts.store.ArtifactStore`.

Checkpoints and outputs go from the node straight into the bucket: the server begins a
multipart upload on the final key and hands out presigned part URLs; S3 shows no object until
the upload is completed, so a partial one is never read. Downloads are presigned GET URLs,
given once a HEAD proved the object is there. Datasets' pushes still pass through the server,
streamed in parts to a scratch key while hashed, then copied under their hash. Logs: see
:mod:`api.artifacts.s3_logs`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import IO, Any, cast

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from api.artifacts.archives import ArchiveLimits
from api.artifacts.s3_bucket import S3Bucket, error_code
from api.artifacts.s3_location import S3Location
from api.artifacts.s3_logs import DatabaseLogs
from api.artifacts.s3_reader import RangedReader
from api.artifacts.store import (
    MAX_PARTS,
    Download,
    Part,
    PartTarget,
    StartedUpload,
    StorageUnavailable,
    UploadIncomplete,
    hashed_pieces,
    job_prefix,
    part_size_for,
)
from ledger.database import Database

log = logging.getLogger(__name__)

SCRATCH_PART = 8 * 2**20
"""A pushed body's parts (the memory one push holds); larger as parts pile up, so that the
10,000 parts S3 allows hold far more than any push."""
_READ = 2**20
_GONE = ("this upload is no longer open (completed, aborted, or replaced by a newer upload of "
         "the same artifact); begin a new one")  # fmt: skip


class S3ArtifactStore:
    kind = "s3"

    def __init__(
        self, location: S3Location, database: Database, limits: ArchiveLimits | None = None,
        *, logs: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        """``logs``: keyword arguments of :class:`DatabaseLogs` (its part size, its bounds)."""
        self.bucket = S3Bucket(location)
        self.limits = limits or ArchiveLimits()
        self.where = self.bucket.where
        self.logs = DatabaseLogs(database, self.bucket, **(logs or {}))
        self._sweeping = threading.Event()

    def check(self) -> None:
        """StorageUnavailable saying what is wrong unless the bucket answers."""
        self.bucket.check()

    # -- logs -----------------------------------------------------------------------------

    def log_size(self, job_id: str, node_index: int = 0) -> int:
        return self.logs.size(job_id, node_index)

    def append_log(self, job_id: str, offset: int, data: bytes, node_index: int = 0) -> int:
        return self.logs.append(job_id, offset, data, node_index)

    def read_log(
        self, job_id: str, offset: int, limit: int = 1 << 20, node_index: int = 0
    ) -> bytes:
        return self.logs.read(job_id, offset, limit, node_index)

    def settle_logs(self, job_ids: Iterable[str]) -> None:
        self.logs.settle(job_ids)

    def sweep_logs(self, every_s: float) -> threading.Thread:
        """Flush logs that waited long enough every ``every_s`` in a daemon thread, until
        :meth:`close`."""

        def sweep() -> None:
            while not self._sweeping.wait(every_s):
                try:
                    self.logs.flush_waiting()
                except Exception as error:  # the next round tries again
                    log.warning("held log bytes stay in the database for now: %s", error)

        thread = threading.Thread(target=sweep, name="log-sweeper", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self._sweeping.set()

    # -- multipart uploads ----------------------------------------------------------------

    def begin_upload(self, key: str, size_hint: int | None = None) -> StartedUpload:
        bucket, full = self.bucket, self.bucket.key(key)
        with bucket.reaching(key):
            pages = bucket.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=bucket.name, Prefix=full
            )
            for page in pages:
                for earlier in page.get("Uploads", ()):
                    if earlier["Key"] == full:
                        self._abort(full, earlier["UploadId"])
            answer = bucket.client.create_multipart_upload(Bucket=bucket.name, Key=full)
        return StartedUpload(answer["UploadId"], part_size_for(size_hint))

    def part_targets(
        self, key: str, upload: StartedUpload, numbers: Iterable[int], upload_id: str
    ) -> list[PartTarget]:
        params = {"Key": self.bucket.key(key), "UploadId": upload.store_upload_id}
        return [PartTarget(n, self.bucket.presign("upload_part", {**params, "PartNumber": n}))
                for n in numbers]  # fmt: skip

    async def receive_part(
        self, key: str, upload: StartedUpload, number: int, body: AsyncIterator[bytes]
    ) -> Part:
        raise NotImplementedError("parts go straight to the bucket (part_targets' URLs)")

    def complete_upload(self, key: str, upload: StartedUpload, parts: list[Part]) -> int:
        bucket, full = self.bucket, self.bucket.key(key)
        listed = {"Bucket": bucket.name, "Key": full, "UploadId": upload.store_upload_id}
        try:
            with bucket.reaching(key), _upload_gone_is_missing():
                received = self._received(listed)
                _check_parts(upload, parts, received)
                bucket.patient.complete_multipart_upload(**listed, MultipartUpload={"Parts": [
                    {"ETag": part.etag, "PartNumber": part.number}
                    for part in sorted(parts, key=lambda part: part.number)
                ]})  # fmt: skip
        except FileNotFoundError:
            if not self._made_by(key, parts):
                raise UploadIncomplete(_GONE) from None
            # completed already: this is a complete sent again
        size = bucket.size(key)
        if size is None:
            raise UploadIncomplete("the store made no object from the parts; send them again")
        return size

    def _received(self, listed: dict[str, str]) -> dict[int, tuple[int, str]]:
        """The parts the bucket holds: their sizes and ETags, by number."""
        received: dict[int, tuple[int, str]] = {}
        for page in self.bucket.client.get_paginator("list_parts").paginate(**listed):
            for part in page.get("Parts", ()):
                received[int(part["PartNumber"])] = (int(part["Size"]), part["ETag"])
        return received

    def _made_by(self, key: str, parts: list[Part]) -> bool:
        """Whether the object at ``key`` is the one these parts made (S3's multipart ETag:
        the MD5 of the parts' MD5s, and their count)."""
        head = self.bucket.head(key)
        try:
            digests = b"".join(bytes.fromhex(part.etag.strip('"')) for part in
                               sorted(parts, key=lambda part: part.number))  # fmt: skip
        except ValueError:
            return False
        expected = f'"{hashlib.md5(digests).hexdigest()}-{len(parts)}"'
        return head is not None and head.get("ETag") == expected

    def abort_upload(self, key: str, upload: StartedUpload) -> None:
        with self.bucket.reaching(key):
            self._abort(self.bucket.key(key), upload.store_upload_id)

    def _abort(self, full_key: str, upload_id: str) -> None:
        try:
            self.bucket.client.abort_multipart_upload(
                Bucket=self.bucket.name, Key=full_key, UploadId=upload_id
            )
        except ClientError as error:
            if error_code(error) not in ("NoSuchUpload", "404"):
                raise

    # -- through the server ---------------------------------------------------------------

    async def receive_hashed(self, body: AsyncIterator[bytes]) -> tuple[str, int, str]:
        scratch = f"uploads/{uuid.uuid4().hex}.scratch"
        sink = _PartSink(self.bucket, scratch)
        try:
            size, sha256 = await hashed_pieces(body, sink.part_size, sink.send, sink.finish)
        except BaseException:
            await asyncio.to_thread(sink.abort)
            raise
        return scratch, size, sha256

    def keep(self, scratch: str, key: str) -> None:
        bucket = self.bucket
        if bucket.size(key) is None:
            with bucket.reaching(key):
                bucket.patient.copy(
                    {"Bucket": bucket.name, "Key": bucket.key(scratch)}, bucket.name,
                    bucket.key(key), Config=TransferConfig(multipart_chunksize=64 * 2**20),
                )  # fmt: skip
        bucket.delete(scratch)

    # -- what is stored -------------------------------------------------------------------

    def size(self, key: str) -> int | None:
        return self.bucket.size(key)

    def open(self, key: str) -> AbstractContextManager[IO[bytes]]:
        return self._open(key)

    @contextmanager
    def _open(self, key: str) -> Iterator[IO[bytes]]:
        size = self.bucket.size(key)
        if size is None:
            raise FileNotFoundError(key)
        with RangedReader(lambda start, end: self.bucket.get_range(key, start, end),
                          size) as reader:  # fmt: skip
            yield cast(IO[bytes], reader)

    def sha256(self, key: str) -> str:
        digest = hashlib.sha256()
        with self.bucket.reaching(key):
            answer = self.bucket.patient.get_object(Bucket=self.bucket.name,
                                                    Key=self.bucket.key(key))  # fmt: skip
            for chunk in answer["Body"].iter_chunks(_READ):
                digest.update(chunk)
        return digest.hexdigest()

    def download(self, key: str, filename: str) -> Download:
        size = self.bucket.size(key)  # the bucket answers, and the object is there
        if size is None:
            raise FileNotFoundError(key)
        safe = "".join(c for c in filename if c.isalnum() or c in "._-") or "download"
        url = self.bucket.presign("get_object", {
            "Key": self.bucket.key(key),
            "ResponseContentDisposition": f'attachment; filename="{safe}"',
        })  # fmt: skip
        return Download(size=size, url=url)

    def delete(self, key: str) -> None:
        self.bucket.delete(key)

    def delete_job(self, job_id: str) -> int:
        """Its objects, its unfinished uploads (invisible, yet kept by S3) and its held log
        rows."""
        self.logs.forget(job_id)
        bucket = self.bucket
        with bucket.reaching(job_prefix(job_id)):
            pages = bucket.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=bucket.name, Prefix=bucket.key(job_prefix(job_id))
            )
            for page in pages:
                for unfinished in page.get("Uploads", ()):
                    self._abort(unfinished["Key"], unfinished["UploadId"])
        return bucket.delete_prefix(job_prefix(job_id))


@contextmanager
def _upload_gone_is_missing() -> Iterator[None]:
    try:
        yield
    except ClientError as error:
        if error_code(error) == "NoSuchUpload":
            raise FileNotFoundError("the upload") from error
        raise


def _check_parts(
    upload: StartedUpload, parts: list[Part], received: dict[int, tuple[int, str]]
) -> None:
    """UploadIncomplete unless ``parts`` are 1..N, each in the bucket as named, every one but
    the last a whole part (S3 itself would make an object of parts 1 and 3)."""
    numbers = sorted(part.number for part in parts)
    if not numbers or numbers != list(range(1, len(numbers) + 1)) or len(numbers) > MAX_PARTS:
        missing = sorted(set(range(1, (numbers or [0])[-1] + 1)) - set(numbers))
        raise UploadIncomplete(f"parts {missing[:10]} are missing (or a part is named twice): "
                               f"send parts 1 to {(numbers or [1])[-1]}")  # fmt: skip
    for part in parts:
        got = received.get(part.number)
        if got is None or got[1].strip('"') != part.etag.strip('"'):
            raise UploadIncomplete(
                f"part {part.number} has not arrived (or was replaced since): send it again"
            )
        if part.number != numbers[-1] and got[0] != upload.part_size:
            raise UploadIncomplete(f"part {part.number} holds {got[0]} bytes; every part but "
                                   f"the last holds {upload.part_size}")  # fmt: skip


class _PartSink:
    """A body written to the bucket in parts, one part in memory at a time (a body smaller than
    a part is one PUT)."""

    def __init__(self, bucket: S3Bucket, key: str) -> None:
        self.bucket = bucket
        self.key = bucket.key(key)
        self.name = key
        self.upload_id: str | None = None
        self.parts: list[dict[str, Any]] = []

    @property
    def part_size(self) -> int:
        return SCRATCH_PART * (1 + len(self.parts) // 1000)

    def send(self, data: bytes) -> None:
        client = self.bucket.patient
        with self.bucket.reaching(self.name):
            if self.upload_id is None:
                self.upload_id = client.create_multipart_upload(
                    Bucket=self.bucket.name, Key=self.key)["UploadId"]  # fmt: skip
            number = len(self.parts) + 1
            answer = client.upload_part(Bucket=self.bucket.name, Key=self.key, Body=data,
                                        UploadId=self.upload_id, PartNumber=number)  # fmt: skip
            self.parts.append({"ETag": answer["ETag"], "PartNumber": number})

    def finish(self, data: bytes) -> None:
        if self.upload_id is None:
            self.bucket.put(self.name, data)
            return
        if data:
            self.send(data)
        with self.bucket.reaching(self.name):
            self.bucket.patient.complete_multipart_upload(
                Bucket=self.bucket.name, Key=self.key, UploadId=self.upload_id,
                MultipartUpload={"Parts": self.parts},
            )  # fmt: skip

    def abort(self) -> None:
        try:
            with self.bucket.reaching(self.name):
                if self.upload_id is not None:
                    self.bucket.client.abort_multipart_upload(
                        Bucket=self.bucket.name, Key=self.key, UploadId=self.upload_id)  # fmt: skip
                else:
                    self.bucket.client.delete_object(Bucket=self.bucket.name, Key=self.key)
        except (FileNotFoundError, StorageUnavailable) as error:
            log.warning("a refused push's scratch object %s stays: %s", self.key, error)
