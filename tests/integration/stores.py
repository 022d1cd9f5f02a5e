"""The artifact stores under test, built as the server builds them, and what a node or a client
does with them (parts sent to their targets, bodies streamed)."""

from __future__ import annotations

import asyncio
import io
import json
import zipfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from api.artifacts.local import LocalArtifactStore
from api.artifacts.s3 import S3ArtifactStore
from api.artifacts.s3_location import S3Location
from api.artifacts.store import ArtifactStore, Part, StartedUpload
from ledger.database import open_database
from tests.pg import fresh_database
from tests.s3 import REGION, SeaweedFS

LOG_PART = 64 * 2**10
"""The S3 store's log part size in these tests: a few appends make a part."""
MAX_HELD = 4 * LOG_PART

StoreMaker = Callable[..., ArtifactStore]
"""Another instance of the store under test, on the same bucket (or root) and database, as a
second replica would open it; keyword arguments go to the S3 store's logs."""


@contextmanager
def local_stores(tmp_path: Path) -> Iterator[StoreMaker]:
    yield lambda **_: LocalArtifactStore(tmp_path / "artifacts")


@contextmanager
def s3_stores(server: SeaweedFS, bucket: str, database_url: str) -> Iterator[StoreMaker]:
    opened: list[Any] = []

    def make(**logs: Any) -> ArtifactStore:
        database = open_database(database_url)
        opened.append(database)
        location = S3Location(bucket, "fleet-a/", server.endpoint_url, REGION)
        return S3ArtifactStore(location, database,
                               logs={"part_bytes": LOG_PART, "max_held_bytes": MAX_HELD, **logs})

    try:
        yield make
    finally:
        for database in opened:
            database.close()


@contextmanager
def database_urls(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'flexai.sqlite3'}"
    else:
        with fresh_database() as url:
            yield url


async def _chunks(data: bytes, size: int = 256 * 2**10) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def body(data: bytes) -> AsyncIterator[bytes]:
    """A request body as the server reads it, in network-sized chunks."""
    return _chunks(data)


def send_part(store: ArtifactStore, key: str, upload: StartedUpload, number: int,
              data: bytes) -> Part:  # fmt: skip
    """Send one part where the store says, as the agent does: a presigned URL of the bucket,
    or this server's part route (the local store, which receives it itself)."""
    (target,) = store.part_targets(key, upload, [number], upload_id="route-id")
    if target.url.startswith("http"):
        answer = httpx.put(target.url, content=data, headers=dict(target.headers), timeout=30)
        answer.raise_for_status()
        return Part(number, answer.headers["ETag"])
    assert target.url == f"/v1/agent/uploads/route-id/parts/{number}"
    return asyncio.run(store.receive_part(key, upload, number, body(data)))


def upload_whole(store: ArtifactStore, key: str, data: bytes) -> int:
    """An object uploaded in parts, begun and completed; its size."""
    upload = store.begin_upload(key, len(data))
    size = upload.part_size
    parts = [send_part(store, key, upload, index // size + 1, data[index : index + size])
             for index in range(0, len(data), size)]  # fmt: skip
    return store.complete_upload(key, upload, parts)


def zip_of(files: dict[str, bytes | str | dict[str, Any]], *,
           stored: bool = False) -> bytes:  # fmt: skip
    buffer = io.BytesIO()
    method = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, content in files.items():
            archive.writestr(name, json.dumps(content) if isinstance(content, dict) else content)
    return buffer.getvalue()
