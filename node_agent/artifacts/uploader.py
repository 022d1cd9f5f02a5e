"""One upload of a checkpoint or an output directory: zipped as a stream, cut into parts, the
parts sent in parallel to where the control plane says (the store itself, presigned, or the
control plane), then completed: the control plane checks the archive and records it in the
ledger with its size and SHA-256.

Nothing of it is dropped while the store or the control plane is away: every step waits with
backoff and tries again, for as long as it takes, saying in the agent's log what it waits
for; only the agent's shutdown ends the wait (:class:`ApiUnavailable`), and the restarted agent
begins the upload again (the control plane aborts the one left unfinished). Memory stays
bounded: at most ``concurrency`` parts in flight and one being filled.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from common.attempts import attempt_query
from node_agent.artifacts.parts import PartCutter
from node_agent.artifacts.zipping import files_bytes, write_zip
from node_agent.client import ApiError, ApiUnavailable, ControlPlaneClient

log = logging.getLogger("flexai.agent")
T = TypeVar("T")

CONCURRENCY = 4
BLIP_S = 10.0
"""How long one call retries by itself before the upload says it waits."""
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
SAY_EVERY_S = 60.0
"""While it waits, the upload says so in the agent's log this often."""
RESTARTS = 5
"""Times an upload begins again after its session was lost (replaced, aborted)."""
TARGETS_AHEAD = 100
MAX_EXPIRED = 3
"""Times a part's presigned URL is asked for again after the store refused it."""
_GONE = {"upload-not-found", "upload-incomplete", "upload-completed"}


@dataclass(frozen=True)
class Artifact:
    """What one upload sends: a checkpoint (``name``) or a node's output directory."""

    job_id: str
    kind: str
    """``checkpoint`` or ``output``."""
    name: str | None
    node_id: str
    node_index: int
    source: Path
    trusted: Path
    """The job's directory: no link is followed below it."""
    attempt: int = 1
    """The job's attempt an output directory is of."""
    top_files: bool = False
    """Only the files directly in ``source`` (the root checkpoint: its subfolders are
    checkpoints of their own)."""

    @property
    def label(self) -> str:
        if self.kind == "checkpoint":
            return f"checkpoint {self.name}"
        return f"output_{self.node_index}.zip"


class UploadGone(Exception):
    """The upload session is no more (replaced, aborted, its parts lost): begin again."""


class ArtifactUploader:
    """Uploads artifacts through ``client``; safe to share between threads."""

    def __init__(self, client: ControlPlaneClient, *, concurrency: int = CONCURRENCY,
                 give_up: threading.Event | None = None) -> None:  # fmt: skip
        self.client = client
        self.concurrency = concurrency
        self.give_up = give_up or threading.Event()
        """Set when the job is no longer this node's: waits end as at the agent's shutdown."""

    def upload(self, artifact: Artifact) -> dict[str, Any]:
        """Send the artifact; what the ledger holds of it (CheckpointPublic, OutputPublic).
        ApiError: refused for good (the job ended, the archive refused); ApiUnavailable: the
        agent shuts down; OSError: the files could not be read."""
        size_hint = files_bytes(artifact.source, artifact.top_files)
        body = {"kind": artifact.kind, "name": artifact.name, "node_id": artifact.node_id,
                "node_index": artifact.node_index, "size_hint": size_hint}
        for attempt in range(RESTARTS + 1):
            waiting = _Waiting(self.client, artifact, self.give_up)
            session = waiting.on(lambda: self._begin(artifact, body))
            if session.get("recorded"):
                log.info("job %s: %s is recorded already", artifact.job_id, artifact.label)
                return dict(session["recorded"])
            try:
                parts = _Parts(self, str(session["id"]), int(session["part_size"]), waiting,
                               size_hint)  # fmt: skip
                return self._send(artifact, parts)
            except UploadGone as gone:
                if attempt == RESTARTS:
                    raise ApiError(409, {"detail": f"{artifact.label}: {gone}"}) from None
                log.warning("job %s: %s begins again: %s", artifact.job_id, artifact.label, gone)
        raise AssertionError("unreachable")

    def _begin(self, artifact: Artifact, body: dict[str, Any]) -> dict[str, Any]:
        """An upload session; an output of a later attempt of the job says which."""
        named = attempt_query(artifact.attempt) if artifact.kind == "output" else {}
        return self.client.begin_upload(artifact.job_id, body, retry_for=BLIP_S, **named)

    def _send(self, artifact: Artifact, parts: _Parts) -> dict[str, Any]:
        upload_id = parts.upload_id
        cutter = PartCutter(parts.part_size, parts.send)
        try:
            write_zip(artifact.source, cutter, trusted=artifact.trusted,
                      top_files=artifact.top_files)  # fmt: skip
            cutter.close()
            etags = parts.wait()
        except BaseException:
            cutter.abandon()
            parts.cancel()
            if not parts.waiting.ended_by_agent:  # its new upload, once restarted, aborts it
                self._abort(upload_id)
            raise
        answer = parts.waiting.on(lambda: self._complete(upload_id, etags, cutter))
        log.info("job %s: %s uploaded (%d bytes, SHA-256 %s)", artifact.job_id, artifact.label,
                 cutter.size, cutter.sha256)  # fmt: skip
        return answer

    def _complete(self, upload_id: str, etags: list[tuple[int, str]],
                  cutter: PartCutter) -> dict[str, Any]:  # fmt: skip
        try:
            return self.client.complete_upload(upload_id, etags, cutter.size, cutter.sha256,
                                               retry_for=BLIP_S)  # fmt: skip
        except ApiError as error:
            if error.slug in _GONE:
                raise UploadGone(str(error)) from None
            raise

    def _abort(self, upload_id: str) -> None:
        try:
            self.client.abort_upload(upload_id, retry_for=2.0)
        except (ApiError, ApiUnavailable) as error:
            log.debug("upload %s not aborted: %s", upload_id, error)


class _Waiting:
    """Runs one call until it goes through, waiting with backoff while the store or the
    control plane is away and saying so; gives up only when the agent shuts down (or the
    upload is cancelled)."""

    def __init__(self, client: ControlPlaneClient, artifact: Artifact,
                 give_up: threading.Event) -> None:  # fmt: skip
        self.client = client
        self.artifact = artifact
        self.give_up = give_up
        self.cancelled = threading.Event()
        self._said_at: float | None = None
        self._lock = threading.Lock()

    def on(self, call: Callable[[], T]) -> T:
        delay = FIRST_BACKOFF_S
        while True:
            try:
                return call()
            except ApiUnavailable as error:
                if self._ended():
                    raise
                wait = max(delay, error.retry_after or 0.0)
                self._say(error, wait)
                if self._sleep(wait):
                    raise
                delay = min(delay * 2, MAX_BACKOFF_S)

    def _say(self, error: ApiUnavailable, wait: float) -> None:
        with self._lock:
            now = time.monotonic()
            if self._said_at is not None and now - self._said_at < SAY_EVERY_S:
                return
            self._said_at = now
        said = str(error)
        store = "storage-unavailable" in said or "artifact store" in said
        log.warning("job %s: %s waits for %s (%s); trying again in %.0f s, for as long as it "
                    "takes", self.artifact.job_id, self.artifact.label,
                    "the artifact store" if store else "the control plane", said, wait)  # fmt: skip

    @property
    def ended_by_agent(self) -> bool:
        """The agent shuts down or gave the job up: it cannot (or need not) abort now."""
        return self.client.closing or self.give_up.is_set()

    def _ended(self) -> bool:
        return self.client.closing or self.cancelled.is_set() or self.give_up.is_set()

    def _sleep(self, seconds: float) -> bool:
        """True when the agent shuts down or the upload is given up meanwhile."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self._ended() or self.client.pause(min(left, 0.5)):
                return True
        return self._ended()


class _Parts:
    """The parts of one upload in flight: each sent by a worker to its target (asked for in
    batches, asked again when one expired), retried until it goes through."""

    def __init__(self, uploader: ArtifactUploader, upload_id: str, part_size: int,
                 waiting: _Waiting, size_hint: int) -> None:  # fmt: skip
        self.client = uploader.client
        self.upload_id = upload_id
        self.part_size = part_size
        self.waiting = waiting
        self.expected = size_hint // part_size + 1
        """About how many parts there will be (the archive is about its files' bytes)."""
        self.etags: dict[int, str] = {}
        self.targets: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(uploader.concurrency)
        self._pool = ThreadPoolExecutor(uploader.concurrency, thread_name_prefix="upload")
        self._futures: list[Future[None]] = []
        self._failure: BaseException | None = None

    def send(self, number: int, data: list[bytes]) -> None:
        """Hand a part to a worker once one is free (the zipping waits meanwhile)."""
        self._slots.acquire()
        if self._failure is not None:
            self._slots.release()
            raise self._failure
        self._futures.append(self._pool.submit(self._put, number, data))

    def wait(self) -> list[tuple[int, str]]:
        self._pool.shutdown(wait=True)
        if self._failure is not None:
            raise self._failure
        return sorted(self.etags.items())

    def cancel(self) -> None:
        self.waiting.cancelled.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _put(self, number: int, data: list[bytes]) -> None:
        try:
            for expired in range(MAX_EXPIRED + 1):
                target = self._target(number)
                try:
                    etag = self.waiting.on(partial(self.client.put_part, target, data,
                                                   retry_for=BLIP_S))  # fmt: skip
                    break
                except ApiError as error:
                    self._refused(number, target, error, last=expired == MAX_EXPIRED)
            with self._lock:
                self.etags[number] = etag
        except BaseException as error:
            with self._lock:
                self._failure = self._failure or error
            self.waiting.cancelled.set()
        finally:
            self._slots.release()

    def _refused(self, number: int, target: dict[str, Any], error: ApiError, last: bool) -> None:
        """A presigned URL that expired is asked for again; a lost session begins again."""
        absolute = not str(target["url"]).startswith("/")
        if absolute and error.status in (400, 403) and not last:  # S3: "Request has expired"
            with self._lock:
                self.targets.pop(number, None)
            return
        if error.slug in _GONE or (absolute and error.status == 404):  # NoSuchUpload
            raise UploadGone(str(error))
        raise error

    def _target(self, number: int) -> dict[str, Any]:
        with self._lock:
            if number not in self.targets:
                count = min(TARGETS_AHEAD, max(self.expected - number + 1, 1))
                numbers = list(range(number, min(number + count, 10_001)))

                def ask() -> list[dict[str, Any]]:
                    try:
                        return self.client.part_targets(self.upload_id, numbers,
                                                        retry_for=BLIP_S)  # fmt: skip
                    except ApiError as error:
                        if error.slug in _GONE:
                            raise UploadGone(str(error)) from None
                        raise

                for target in self.waiting.on(ask):
                    self.targets[int(target["number"])] = target
            return self.targets[number]
