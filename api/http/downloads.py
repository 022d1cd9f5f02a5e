"""Answers that hand over an artifact's bytes: a redirect to the store (a presigned URL, so
the bytes never pass through this server) or the file itself (the local store; ranges too).

Either way the answer says what the bytes must be, as the ledger recorded them:
``X-Flexai-Size`` and, when known, ``X-Flexai-Sha256``; clients check both before they keep
the file. The object is looked up first (a HEAD on S3), so a store that is away is a quick 503
``storage-unavailable``, not a redirect to nowhere.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

from fastapi import Path, Response
from fastapi.responses import FileResponse, RedirectResponse

from api.artifacts.store import ArtifactStore, output_key
from api.http.attempts import chosen_attempt, chosen_node
from api.http.problems import Problem
from api.services import Services
from common.attempts import current_attempt, output_attempt, outputs_attempt
from common.contract import SHA256_HEADER, SIZE_HEADER
from domain.statuses import TERMINAL
from domain.values import MAX_NODES

ZIP = "application/zip"
SEND_CHUNK = 2**20
"""A file's bytes are read and sent a MiB at a time (each read is a hop to a worker thread)."""
ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"description": "the archive's bytes (ranges accepted)", "content": {ZIP: {}}},
    307: {"description": "the archive is in the store: follow `Location` (send no token)"},
}
"""How OpenAPI documents a download route's answers."""
OutputIndex = Annotated[
    int, Path(ge=0, lt=MAX_NODES, description="the node's index in the job (0 for one node)")
]
EMPTY_ZIP = b"PK\x05\x06" + bytes(18)
"""A zip archive with no entry (its end-of-central-directory record alone)."""
EMPTY_ZIP_SHA256 = hashlib.sha256(EMPTY_ZIP).hexdigest()


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


def output_answer(
    services: Services, document: dict[str, Any], node_index: int, attempt: int | None = None
) -> Response:
    """Node ``node_index``'s output archive of a job's ``attempt`` (default: the last that
    recorded outputs) as the views show the job, deleted or not: from the store, with what the
    ledger recorded of it; 410 once its artifacts were purged."""
    name = document["name"]
    purged = document.get("artifacts_purged")
    if purged:
        raise Problem(
            410, "artifacts-purged", "Artifacts purged",
            f"the artifacts of job '{name}' ({document['id']}) were purged on {purged['at']} "
            "(`flexai admin purge`): its outputs are gone for good; its history stays "
            f"(`flexai training history {name} --all`)", purged_at=purged["at"],
        )  # fmt: skip
    chosen = chosen_attempt(document, attempt, default=outputs_attempt(document))
    chosen_node(document, node_index)
    recorded = next((output for output in document.get("outputs") or []
                     if output["node_index"] == node_index
                     and output_attempt(document, output) == chosen), None)  # fmt: skip
    filename = f"output_{node_index}.zip"
    current = chosen == current_attempt(document)
    if recorded is not None or document["status"] in TERMINAL or not current:
        try:  # unrecorded: one from before outputs were recorded, or a later one's replaced it
            return artifact_answer(
                services.artifacts, output_key(document["id"], node_index, chosen), filename,
                size=recorded and recorded["size"], sha256=recorded and recorded["sha256"],
            )  # fmt: skip
        except FileNotFoundError:
            if recorded is not None:
                raise Problem(
                    404, "not-found", "Output gone",
                    f"the output of job '{name}' node {node_index} is recorded but gone from "
                    "the artifact store",
                ) from None  # fmt: skip
    if current and _ran_to_its_end(document, node_index):
        # An agent uploads no empty output directory: the archive of nothing.
        return bytes_answer(EMPTY_ZIP, filename, EMPTY_ZIP_SHA256)
    if not current:
        raise Problem(
            404, "not-found", "No output of that attempt",
            f"attempt {chosen} of job '{name}' left no output for node {node_index}; "
            f"attempt {current_attempt(document)} is the job's current one",
            attempt=chosen,
        )  # fmt: skip
    if document["status"] in TERMINAL:  # it ended before its entry point ran
        raise Problem(
            404, "not-found", "No output",
            f"job '{name}' ({document['status']}) ended before its entry point ran, so it has "
            f"no output: `flexai training inspect {name}` says why",
        )  # fmt: skip
    raise Problem(
        404, "not-found", "No output yet",
        f"job '{name}' ({document['status']}) has no output for node {node_index} yet; "
        "outputs are uploaded when the entry point ends",
    )  # fmt: skip


def _ran_to_its_end(document: dict[str, Any], node_index: int) -> bool:
    ended = document["status"] in TERMINAL and bool(document.get("started_at"))
    return ended and 0 <= node_index < int(document.get("nodes") or 1)
