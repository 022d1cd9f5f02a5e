"""Downloads of artifacts that resume and verify: the CLI's ``fetch`` and the agent's input
checkpoints and datasets alike.

The control plane answers a download with the bytes, or with a redirect (307) to the store (a
presigned URL: followed without the control plane's token). Both answers say what the bytes
must be: ``X-Flexai-Size`` and, when the ledger knows it, ``X-Flexai-Sha256``. The bytes go to a
hidden partial file beside the destination (named after the expected hash, so a later try
resumes it); an interrupted download goes on from the byte reached with ``Range``. The file
takes its final name only once it is whole and its size and SHA-256 are the expected ones;
bytes that differ are refused (:class:`Altered`) and dropped.

The bytes come over one connection through :mod:`common.direct` (``http.client`` reading
straight into reused buffers), hashed and written by a thread of their own while the next ones
arrive (:mod:`common.landing`). Parallel ranged GETs (4 connections, 8 MiB ranges, appended in
order) were measured too: on this project's 2-core bench machine they cost twice the CPU and
lost to one connection, against the SeaweedFS store and the control plane alike.
"""

from __future__ import annotations

import email.utils
import hashlib
import os
import re
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx

from common.behind import Behind
from common.contract import SHA256_HEADER, SIZE_HEADER
from common.direct import READINTO, DownloadClients
from common.landing import Landing

CHUNK = 2**20
_REDIRECTS = {301, 302, 303, 307, 308}
_RETRYABLE = {408, 429, 500, 502, 503, 504}
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MAX_WAIT = 30.0


class TransferError(Exception):
    """A download that did not end with a whole, verified file."""


class Unavailable(TransferError):
    """The control plane or the store could not be reached, or kept answering 5xx, for the
    whole patience; ``retry_after``: what the last answer asked to wait, if it did."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Refused(TransferError):
    """An answer a retry would not change (4xx); ``problem``: its problem details."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        detail = problem.get("detail") or problem.get("title") or f"HTTP {status}"
        super().__init__(str(detail))

    @property
    def slug(self) -> str:
        return str(self.problem.get("type", "")).rsplit("/", 1)[-1]


class Altered(TransferError):
    """The bytes are not the ones the ledger recorded (another size or SHA-256)."""

    def __init__(self, what: str, expected: str, got: str) -> None:
        self.what, self.expected, self.got = what, expected, got
        super().__init__(
            f"{what} is not what was recorded: the ledger says {expected}, the bytes "
            f"downloaded are {got}; nothing was kept"
        )


@dataclass(frozen=True)
class Fetched:
    path: Path
    size: int
    sha256: str
    verified: bool
    """Whether the SHA-256 was checked against the ledger's (older artifacts have none)."""


def fetch(
    api: httpx.Client, path: str, destination: Path, *, what: str | None = None,
    patience: float = 10.0, stop: threading.Event | None = None,
    tls: ssl.SSLContext | None = None,
) -> Fetched:  # fmt: skip
    """Download ``path`` of the control plane (``api`` sends its token) into ``destination``.

    Failures that pass (no connection, 5xx, a cut) are retried for ``patience`` seconds
    without progress, from the byte reached; ``stop`` ends the waits at once. ``what`` names
    the artifact in errors (default: the destination's name). ``tls``: how the control plane
    and the store are verified over https (default: httpx's own).
    """
    download = _Download(destination, what or destination.name)
    deadline = time.monotonic() + patience
    delay, reached = 0.2, -1
    clients = DownloadClients(api, tls)
    try:
        while True:
            try:
                if not download.whole:
                    _attempt(api, clients, path, download)
                if download.whole:
                    return download.finish()
                raise _Again(f"the answer for {download.what} ended early", 0.0)
            except httpx.TransportError as error:
                failure = _Again(_broken(api, error), None)
            except _Again as again:
                failure = again
            if download.have > reached:  # progress: the patience starts again
                reached, deadline = download.have, time.monotonic() + patience
            wait = max(delay, failure.after or 0.0)
            if time.monotonic() + wait > deadline or _stopped(stop, wait):
                download.give_up()
                raise Unavailable(str(failure), failure.after)
            delay = min(delay * 2, 5.0)
    finally:
        clients.close()


def _stopped(stop: threading.Event | None, wait: float) -> bool:
    """Wait ``wait`` seconds; True when ``stop`` was set meanwhile (or before)."""
    if stop is None:
        time.sleep(wait)
        return False
    return stop.wait(wait)


class _Again(Exception):
    """This try failed in a way that passes; ``after``: the seconds the server asked for."""

    def __init__(self, message: str, after: float | None) -> None:
        super().__init__(message)
        self.after = after


def _attempt(api: httpx.Client, clients: DownloadClients, path: str,
             download: _Download) -> None:  # fmt: skip
    if download.location is None:
        with clients.control(path, download.range()) as response:
            if response.status_code in _REDIRECTS and "location" in response.headers:
                download.learn(response.headers)
                download.location = urljoin(str(response.url), response.headers["location"])
            else:
                _check(response, _whom(api, response.url))
                resumed = download.learn(response.headers) and response.status_code == 200
                if not resumed:
                    download.take(response)
                    return
        if download.location is None:  # a partial file of an earlier try: ask for the rest
            with clients.control(path, download.range()) as response:
                _check(response, _whom(api, response.url))
                download.take(response)
            return
    if download.whole:
        return
    assert download.location is not None
    store = clients.store(download.location)
    with store.stream("GET", download.location, headers=download.range()) as response:
        if response.status_code in (401, 403) and download.expired < 2:
            download.location, download.expired = None, download.expired + 1
            raise _Again("the store's link expired; asking the control plane again", 0.0)
        _check(response, _whom(api, response.url))
        download.expired = 0
        download.take(response)


class _Download:
    """The state of one download: what it must be, where its bytes are, how many."""

    def __init__(self, destination: Path, what: str) -> None:
        self.destination = destination
        self.what = what
        self.size: int | None = None
        self.sha256: str | None = None
        self.partial: Path | None = None
        self.have = 0
        self.digest = hashlib.sha256()
        self.location: str | None = None
        """The store's URL the control plane redirected to."""
        self.expired = 0

    @property
    def whole(self) -> bool:
        return self.size is not None and self.partial is not None and self.have >= self.size

    def range(self) -> dict[str, str]:
        return {"Range": f"bytes={self.have}-"} if self.have else {}

    def learn(self, headers: httpx.Headers) -> bool:
        """What the bytes must be, from the control plane's answer; True when a partial file
        of an earlier try was found (its bytes count as had)."""
        size = headers.get(SIZE_HEADER, "")
        if size.isdigit():
            self.size = int(size)
        sha = headers.get(SHA256_HEADER, "").lower()
        if _SHA256.fullmatch(sha):
            self.sha256 = sha
        if self.partial is not None:
            return False
        tag = f".{self.sha256[:16]}" if self.sha256 else ""
        self.partial = self.destination.with_name(f".{self.destination.name}{tag}.part")
        if not self.sha256:  # unknown bytes: never resumed from an earlier try
            self.partial.unlink(missing_ok=True)
            return False
        return self._resume_earlier()

    def _resume_earlier(self) -> bool:
        assert self.partial is not None
        try:
            with self.partial.open("rb") as earlier:
                while chunk := earlier.read(CHUNK):
                    self.digest.update(chunk)
                    self.have += len(chunk)
        except FileNotFoundError:
            return False
        if self.size is not None and self.have > self.size:
            self._restart()
        return self.have > 0

    def give_up(self) -> None:
        """Bytes of unknown content are not kept for a later try (they could not be checked)."""
        if self.partial is not None and self.sha256 is None:
            self._restart()

    def _restart(self) -> None:
        assert self.partial is not None
        self.partial.unlink(missing_ok=True)
        self.have, self.digest = 0, hashlib.sha256()

    def take(self, response: httpx.Response) -> None:
        """Append the answer's bytes (a 206 from the byte reached, or a 200 from the start)."""
        if self.size is None:
            length = response.headers.get("content-length", "")
            self.size = int(length) if response.status_code == 200 and length.isdigit() else None
        if response.status_code == 206:
            start = re.match(r"bytes (\d+)-", response.headers.get("content-range", ""))
            if start is None or int(start.group(1)) != self.have:
                self._restart()
                raise _Again(f"the answer for {self.what} did not start where asked", 0.0)
        elif self.have:
            self._restart()
        assert self.partial is not None
        with self.partial.open("ab") as sink:
            readinto = response.extensions.get(READINTO)
            if readinto is not None and not _encoded(response):
                self._land(readinto, sink.fileno())
            else:
                behind = Behind(self.digest, sink)  # hashed and written as the next bytes come
                try:
                    for chunk in response.iter_bytes():
                        behind.feed(chunk)
                        self.have += len(chunk)
                finally:
                    behind.close()
        if self.size is None:
            self.size = self.have

    def _land(self, readinto: Callable[[memoryview], int], fd: int) -> None:
        """Read into buffers, hashed and written by another thread while the next fill."""
        landing = Landing(self.digest, fd)
        try:
            while got := landing.fill(readinto):
                self.have += got
        finally:
            landing.close()

    def finish(self) -> Fetched:
        assert self.partial is not None and self.size is not None
        got = self.digest.hexdigest()
        if self.have != self.size:
            self._restart()
            raise Altered(self.what, f"{self.size} bytes", f"{self.have} bytes")
        if self.sha256 is not None and got != self.sha256:
            self._restart()
            raise Altered(self.what, f"SHA-256 {self.sha256}", f"SHA-256 {got}")
        self.partial.touch()  # an empty artifact has no bytes to write
        os.replace(self.partial, self.destination)
        return Fetched(self.destination, self.have, got, self.sha256 is not None)


def _encoded(response: httpx.Response) -> bool:
    return response.headers.get("content-encoding", "identity").lower() != "identity"


def _check(response: httpx.Response, whom: str) -> None:
    if response.status_code in (200, 206):
        return
    response.read()
    problem = problem_of(response)
    if response.status_code in _RETRYABLE:
        slug = str(problem.get("type", "")).rsplit("/", 1)[-1] or "error"
        detail = problem.get("detail") or problem.get("title") or ""
        said = f"{response.status_code} {slug}" + (f": {detail}" if detail else "")
        raise _Again(f"{whom} answered {said}", retry_after(response))
    raise Refused(response.status_code, problem)


def problem_of(response: httpx.Response) -> dict[str, Any]:
    """An answer's problem details, or what stands in for them when its body is none."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        return body
    return {"title": response.reason_phrase, "detail": response.text[:500]}


def retry_after(response: httpx.Response, most: float = _MAX_WAIT) -> float | None:
    """``Retry-After`` in seconds (a number or an HTTP date), at most ``most``."""
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), most)


def _whom(api: httpx.Client, url: httpx.URL) -> str:
    """The control plane, or the store a redirect led to."""
    base = str(api.base_url).rstrip("/")
    if str(url).startswith(base):
        return f"the control plane at {base}"
    return f"the artifact store at {url.scheme}://{url.netloc.decode()}"


def _broken(api: httpx.Client, error: httpx.TransportError) -> str:
    try:
        whom = _whom(api, error.request.url)
    except RuntimeError:  # an error raised before a request was made
        whom = "the server"
    if isinstance(error, httpx.ConnectError):
        return f"cannot reach {whom} (connection refused or host unknown)"
    if isinstance(error, httpx.TimeoutException):
        return f"{whom} did not answer in time"
    return f"the connection to {whom} broke ({str(error) or type(error).__name__})"
