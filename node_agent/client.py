"""The agent's one HTTP client for the control plane's ``/v1/agent`` routes.

Every agent call is idempotent by design (a report already recorded answers 200 again, log bytes
carry their offset, an upload's parts replace, its completion answers the same again), so
every call is retried with
backoff on connection errors, timeouts and 5xx answers until its retry budget is spent; a
``Retry-After`` the server sends with a 503 is waited out before the next try.

One answer ends every call: ``node-taken``, another live agent holds this node. From then on
no request leaves this client, so an agent that lost its node can never report on a job.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from common import transfer
from common.attempts import attempt_query
from common.contract import AGENT_ID_HEADER, IMAGE_TRANSPORT
from common.tls import ca_file as tls_ca_file
from common.tls import check_url, client_context, describe_failure
from node_agent.api_errors import ApiError, ApiUnavailable, ArtifactAltered, NodeTaken, slug
from node_agent.models import Assignment

DEFAULT_RETRY_FOR = 60.0
COMPLETE_TIMEOUT = 600.0
"""Completing an upload may make a large object of its parts (the local store copies them)."""
"""Which agent process speaks: the control plane lets one live agent hold a node name."""
_RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}
MAX_RETRY_AFTER_S = 300.0


@dataclass(frozen=True)
class Listing:
    """A node's assignments and their etag ("" from a control plane without long polls)."""

    assignments: list[Assignment]
    etag: str


class ControlPlaneClient:
    """``/v1/agent/...`` over HTTP with a bearer token; safe to share between threads."""

    def __init__(
        self,
        api_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        retry_for: float = DEFAULT_RETRY_FOR,
        transport: httpx.BaseTransport | None = None,
        agent_id: str | None = None,
        ca_file: str | None = None,
        allow_http: bool | None = None,
        client_certificate: tuple[str, str | None] | None = None,
    ) -> None:
        """``ca_file``: a private CA to verify the control plane (and the store) with, besides
        the system's CAs; ``allow_http``: plain http to another host than this one (else
        :class:`common.tls.PlainHttpRefused`, before any connection); a ``ca_file`` that is
        no CA's certificate is a :class:`common.tls.TlsConfigError` too.
        ``client_certificate``: (certificate file, key file or None) presented to a control
        plane that requires agents' client certificates (``--agent-client-ca``)."""
        check_url(api_url, allow_http, who="flexai agent")
        self.api_url = api_url.rstrip("/")
        self.ca_file = ca_file
        self.tls = client_context(tls_ca_file(ca_file), *(client_certificate or ()))
        """How https is verified: the control plane's, the store's presigned URLs, WebSockets."""
        self.agent_id = agent_id or new_agent_id()
        self.retry_for = retry_for
        self.timeout = timeout
        self._closed = threading.Event()
        self._taken: NodeTaken | None = None
        self._on_node_taken: list[Callable[[NodeTaken], None]] = []
        self._http = httpx.Client(
            base_url=self.api_url,
            headers={
                "Authorization": f"Bearer {token}",
                "User-Agent": "flexai-agent",
                AGENT_ID_HEADER: self.agent_id,
            },
            timeout=timeout,
            transport=transport,
            verify=self.tls,
        )
        self._store = httpx.Client(headers={"User-Agent": "flexai-agent"}, timeout=timeout,
                                   verify=self.tls)  # fmt: skip
        """For the store's presigned URLs: no token of ours goes there."""

    def stop_retrying(self) -> None:
        """Make every call in flight or to come give up instead of waiting (for shutdown)."""
        self._closed.set()

    @property
    def closing(self) -> bool:
        """The agent shuts down: calls give up instead of waiting."""
        return self._closed.is_set()

    def pause(self, seconds: float) -> bool:
        """Wait ``seconds``; True (at once) when the agent shuts down meanwhile."""
        return self._closed.wait(seconds)

    def when_node_taken(self, callback: Callable[[NodeTaken], None]) -> None:
        """Call ``callback`` once, from the calling thread, when a call answers ``node-taken``."""
        self._on_node_taken.append(callback)

    def close(self) -> None:
        """Release the connections; the client is unusable afterwards."""
        self._closed.set()
        self._http.close()
        self._store.close()

    # -- nodes ---------------------------------------------------------------------------

    def register(
        self,
        name: str,
        accels: int,
        accel_type: str,
        *,
        address: str = "127.0.0.1",
        gpus: Sequence[Mapping[str, Any]] = (),
        retry_for: float | None = None,
        isolation: Mapping[str, Any] | None = None,
    ) -> str:
        """Register (or re-register) this node; return its node id. ``address``: how the
        node's peers reach it (a multi-node job's rendezvous); ``gpus``: what NVML says;
        ``isolation``: how this agent keeps jobs apart."""
        body = {
            "name": name, "accels": accels, "accel_type": accel_type, "agent_id": self.agent_id,
            "address": address, "gpus": [dict(gpu) for gpu in gpus],
            **({"isolation": dict(isolation)} if isolation is not None else {}),
        }  # fmt: skip
        answer = self._json("POST", "/v1/agent/nodes", json=body, retry_for=retry_for)
        return str(answer["node_id"])

    def heartbeat(self, node_id: str, images: list[tuple[str, str]] | None = None) -> None:
        """``images``: the ``(reference, digest)`` of each image the node holds, or None when
        they are as last told."""
        body = {} if images is None else {"images": [
            {"reference": IMAGE_TRANSPORT + ref, "digest": digest} for ref, digest in images
        ]}  # fmt: skip
        self._json("POST", f"/v1/agent/nodes/{_seg(node_id)}/heartbeat", json=body,
                   retry_for=1.0)  # fmt: skip

    def leave(self, node_id: str) -> int:
        """Tell the control plane this node's agent stops, its jobs' processes ended: their
        jobs move on now, and the node takes none until registered again. How many it had."""
        answer = self._json("POST", f"/v1/agent/nodes/{_seg(node_id)}/leave", json={},
                            retry_for=1.0)  # fmt: skip
        return int(answer.get("jobs") or 0)

    def assignments(self, node_id: str) -> list[Assignment]:
        return self.poll_assignments(node_id).assignments

    def poll_assignments(
        self, node_id: str, since: str | None = None, wait: float = 0.0
    ) -> Listing:
        """The node's assignments; with ``wait``, once they differ from the etag ``since``
        (the control plane holds the request until then, or ``wait`` seconds)."""
        waiting: dict[str, Any] = {}
        if since and wait:
            waiting = {"params": {"wait": wait, "since": since}, "timeout": self.timeout + wait}
        path = f"/v1/agent/nodes/{_seg(node_id)}/assignments"
        answer = self._json("GET", path, retry_for=2.0, **waiting)
        listed = [Assignment.from_json(item) for item in answer.get("assignments", [])]
        return Listing(listed, str(answer.get("etag") or ""))

    def debug_session_offers(self, node_id: str, wait: float = 0.0) -> list[dict[str, Any]]:
        """The debug sessions this node is asked to take (``wait``: held until there is one)."""
        path = f"/v1/agent/nodes/{_seg(node_id)}/debug-sessions"
        answer = self._json("GET", path, params={"wait": wait}, timeout=self.timeout + wait,
                            retry_for=2.0)  # fmt: skip
        return [item for item in answer.get("sessions") or [] if isinstance(item, dict)]

    def websocket_target(self, path: str) -> tuple[str, dict[str, str]]:
        """The ``ws://`` (``wss://``) URL of ``path`` and the headers that say who calls."""
        url = "ws" + self.api_url.removeprefix("http") + path
        headers = {key: self._http.headers[key] for key in ("Authorization", AGENT_ID_HEADER)}
        return url, headers

    # -- jobs ----------------------------------------------------------------------------

    def report(
        self, job_id: str, report: Mapping[str, Any], *, retry_for: float | None = None
    ) -> dict[str, Any]:
        """Send one report; return the control plane's answer (``{"status", ...}``)."""
        return self._json(
            "POST",
            f"/v1/agent/jobs/{_seg(job_id)}/reports",
            json=dict(report),
            retry_for=retry_for,
        )

    def append_logs(
        self, job_id: str, offset: int, data: bytes, node_index: int = 0, attempt: int = 1
    ) -> int:
        """Append ``data`` at ``offset`` of node ``node_index``'s log stream of the job's
        ``attempt`` (each attempt's stream starts at 0); return the size the control plane
        acknowledges."""
        answer = self._json(
            "POST",
            f"/v1/agent/jobs/{_seg(job_id)}/logs",
            params={"offset": offset, "node_index": node_index, **attempt_query(attempt)},
            content=data,
            headers={"Content-Type": "application/octet-stream"},
            # a blip only: the log shipper has its own, longer retry loop
            retry_for=min(1.0, self.retry_for),
        )
        return int(answer.get("size", offset + len(data)))

    # -- artifacts: upload sessions (see node_agent.artifacts.uploader) -------------------

    def begin_upload(
        self, job_id: str, body: Mapping[str, Any], *, retry_for: float | None = None,
        attempt: int = 1,
    ) -> dict[str, Any]:  # fmt: skip
        """Open an upload session: ``{"id", "part_size"}``, or ``{"recorded": ...}`` when the
        ledger holds the artifact already; ``attempt``: the job's attempt an output is of."""
        return self._json("POST", f"/v1/agent/jobs/{_seg(job_id)}/uploads", json=dict(body),
                          params=attempt_query(attempt), retry_for=retry_for)  # fmt: skip

    def part_targets(
        self, upload_id: str, numbers: Sequence[int], *, retry_for: float | None = None
    ) -> list[dict[str, Any]]:
        """Where each part goes: ``[{"number", "url", "headers"}]``."""
        answer = self._json("POST", f"/v1/agent/uploads/{_seg(upload_id)}/parts",
                            json={"numbers": list(numbers)}, retry_for=retry_for)  # fmt: skip
        return [part for part in answer.get("parts") or [] if isinstance(part, dict)]

    def put_part(
        self, target: Mapping[str, Any], data: Sequence[bytes], *, retry_for: float | None = None
    ) -> str:
        """Send one part (its bytes in pieces, sent as they are) to its target; its ETag. An
        absolute URL is the store's (presigned: no token goes there); a path is this API's."""
        url = str(target["url"])
        headers = {str(key): str(value) for key, value in (target.get("headers") or {}).items()}
        headers["Content-Length"] = str(sum(len(piece) for piece in data))
        if url.startswith("/"):
            http, headers = self._http, {"Content-Type": "application/octet-stream", **headers}
        else:
            http = self._store

        response = self._with_retries(lambda: http.put(url, content=list(data), headers=headers),
                                      retry_for)  # fmt: skip
        etag = response.headers.get("ETag")
        if not etag:
            try:
                etag = str(response.json().get("etag") or "")
            except (ValueError, AttributeError):
                etag = ""
        if not etag:
            raise ApiError(response.status_code, {"detail": f"{url[:80]} gave no ETag"})
        return etag

    def complete_upload(
        self, upload_id: str, parts: Sequence[tuple[int, str]], size: int, sha256: str,
        *, retry_for: float | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Make the archive from its parts and have it recorded; what the ledger holds."""
        body = {"parts": [{"number": number, "etag": etag} for number, etag in parts],
                "size": size, "sha256": sha256}  # fmt: skip
        return self._json("POST", f"/v1/agent/uploads/{_seg(upload_id)}/complete", json=body,
                          timeout=max(self.timeout, COMPLETE_TIMEOUT),
                          retry_for=retry_for)  # fmt: skip

    def abort_upload(self, upload_id: str, *, retry_for: float | None = None) -> None:
        self._json("DELETE", f"/v1/agent/uploads/{_seg(upload_id)}", retry_for=retry_for)

    # -- artifacts: downloads ------------------------------------------------------------

    def download_checkpoint(self, checkpoint_id: str, destination: Path) -> None:
        """Save the checkpoint's zip at ``destination``, whole and verified."""
        self._download(f"/v1/agent/checkpoints/{_seg(checkpoint_id)}", destination,
                       f"checkpoint {checkpoint_id}")  # fmt: skip

    def download_dataset(self, job_id: str, content_hash: str, destination: Path) -> None:
        """Save the zip of a dataset version the job was given at ``destination``, whole and
        verified against its hash."""
        path = f"/v1/agent/jobs/{_seg(job_id)}/datasets/{_seg(content_hash)}"
        self._download(path, destination, f"dataset version {content_hash[:12]}")

    def job_secrets(self, job_id: str, node_index: int = 0) -> dict[str, str]:
        """The values of the job's ``--secret`` variables (held in memory only, never logged:
        not even this answer's size)."""
        answer = self._json("GET", f"/v1/agent/jobs/{_seg(job_id)}/secrets",
                            params={"node_index": node_index})  # fmt: skip
        given = answer.get("secrets") or {}
        return {str(variable): str(value) for variable, value in given.items()}

    def registry_credentials(self, job_id: str, node_index: int = 0) -> tuple[str, str]:
        """The user name and password of the registry secret of the job's runtime (held in
        memory only, while the job builds)."""
        answer = self._json("GET", f"/v1/agent/jobs/{_seg(job_id)}/registry-credentials",
                            params={"node_index": node_index})  # fmt: skip
        return str(answer.get("username") or ""), str(answer.get("password") or "")

    def _download(self, path: str, destination: Path, what: str) -> None:
        """``transfer.fetch``: the redirect to the store followed without the token, resumed
        with ``Range``, kept only whole and verified."""
        if self._taken is not None:
            raise self._taken
        try:
            transfer.fetch(self._http, path, destination, what=what, patience=self.retry_for,
                           stop=self._closed, tls=self.tls)  # fmt: skip
        except transfer.Refused as refused:
            raise ApiError(refused.status, refused.problem) from None
        except transfer.Unavailable as error:
            raise ApiUnavailable(str(error), error.retry_after) from None
        except transfer.Altered as altered:
            raise ArtifactAltered(422, {"detail": str(altered)}) from None

    def _json(
        self, method: str, path: str, *, retry_for: float | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        response = self._with_retries(lambda: self._http.request(method, path, **kwargs), retry_for)
        try:
            answer = response.json()
        except ValueError:
            return {}
        return answer if isinstance(answer, dict) else {}

    def _with_retries(
        self, attempt: Callable[[], httpx.Response], retry_for: float | None
    ) -> httpx.Response:
        budget = self.retry_for if retry_for is None else retry_for
        deadline = time.monotonic() + budget
        delay = 0.1
        while True:
            if self._taken is not None:
                raise self._taken
            retry_after = None
            try:
                response = attempt()
            except (httpx.HTTPError, RuntimeError) as error:
                if self._closed.is_set():
                    raise ApiUnavailable(f"{self.api_url}: the agent is shutting down") from error
                if not isinstance(error, httpx.HTTPError):
                    raise
                untrusted = describe_failure(error, self.api_url, tls_ca_file(self.ca_file))
                failure = untrusted or f"cannot reach {self._whom(error)} ({_describe(error)})"
            else:
                if response.status_code < 400:
                    return response
                if response.status_code not in _RETRYABLE_STATUS:
                    raise self._refusal(response)
                failure = _unavailable(self._whom(response), response)
                retry_after = transfer.retry_after(response, MAX_RETRY_AFTER_S)
            wait = max(delay, retry_after or 0.0)
            if time.monotonic() + wait > deadline or self._closed.is_set():
                raise ApiUnavailable(failure, retry_after)
            self._closed.wait(wait)
            delay = min(delay * 2, 5.0)

    def _whom(self, sent: httpx.Response | httpx.HTTPError) -> str:
        """Who failed: the control plane, or the store a presigned URL points at."""
        try:
            url = sent.request.url
        except RuntimeError:
            url = None
        if url is None or str(url).startswith(self.api_url):
            return f"the control plane at {self.api_url}"
        return f"the artifact store at {url.scheme}://{url.netloc.decode()}"

    def _refusal(self, response: httpx.Response) -> ApiError:
        problem = transfer.problem_of(response)
        if response.status_code != 409 or slug(problem) != "node-taken":
            return ApiError(response.status_code, problem)
        taken = NodeTaken(response.status_code, problem)
        if self._taken is None:
            self._taken = taken
            self._closed.set()  # calls waiting to retry give up at once
            for callback in self._on_node_taken:
                callback(taken)
        return taken


def new_agent_id() -> str:
    return secrets.token_hex(16)


def _seg(value: str) -> str:
    return quote(value, safe="")


def _unavailable(whom: str, response: httpx.Response) -> str:
    """What a 5xx said, e.g. ``503 storage-unavailable: the artifact disk is full``."""
    problem = transfer.problem_of(response)
    what = slug(problem) or "error"
    detail = problem.get("detail") or problem.get("title")
    said = f"{response.status_code} {what}: {detail}" if detail else str(response.status_code)
    return f"{whom} answered {said}"


def _describe(error: httpx.HTTPError) -> str:
    if isinstance(error, httpx.ConnectError):
        return "connection refused or host unknown"
    if isinstance(error, httpx.TimeoutException):
        return "timed out"
    return str(error) or type(error).__name__
