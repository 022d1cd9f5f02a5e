"""Answers that hand over an artifact's bytes: a redirect to the store (a presigned URL, so
the bytes never pass through this server) or the file itself (the local store; ranges too).

Either way the answer says what the bytes must be, as the ledger recorded them:
``X-Flexai-Size`` and, when known, ``X-Flexai-Sha256``; clients check both before they keep
the file. The object is looked up first (a HEAD on S3), so a store that is away is a quick 503
``storage-unavailable``, not a redirect to nowhere.
"""

from __future__ import annotations

from typing import Any

from fastapi import Response
from fastapi.responses import FileResponse, RedirectResponse

from api.artifacts.store import ArtifactStore

SIZE_HEADER = "X-Flexai-Size"
SHA256_HEADER = "X-Flexai-Sha256"
ZIP = "application/zip"
SEND_CHUNK = 2**20
"""A file's bytes are read and sent a MiB at a time (each read is a hop to a worker thread)."""
ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"description": "the archive's bytes (ranges accepted)", "content": {ZIP: {}}},
    307: {"description": "the archive is in the store: follow `Location` (send no token)"},
}
"""How OpenAPI documents a download route's answers."""


def integrity_headers(size: int, sha256: str | None) -> dict[str, str]:
    headers = {SIZE_HEADER: str(size)}
    if sha256:
        headers[SHA256_HEADER] = sha256
    return headers


def artifact_answer(
    store: ArtifactStore, key: str, filename: str, *, size: int | None = None,
    sha256: str | None = None,
) -> Response:  # fmt: skip
    """Where the client gets object ``key`` (saved as ``filename``); ``size`` and ``sha256``:
    what the ledger recorded of it, if anything. FileNotFoundError when there is no object."""
    stored = store.size(key)
    if stored is None:
        raise FileNotFoundError(key)
    headers = integrity_headers(stored if size is None else size, sha256)
    place = store.download(key, filename)
    if place.url is not None:
        return RedirectResponse(place.url, status_code=307, headers=headers)
    if place.path is None:
        raise FileNotFoundError(key)
    answer = FileResponse(place.path, media_type=ZIP, filename=filename, headers=headers)
    answer.chunk_size = SEND_CHUNK
    return answer


def bytes_answer(data: bytes, filename: str, sha256: str) -> Response:
    """A small archive this server makes itself (an empty output)."""
    headers = {"Content-Disposition": f'attachment; filename="{filename}"',
               **integrity_headers(len(data), sha256)}  # fmt: skip
    return Response(data, media_type=ZIP, headers=headers)
