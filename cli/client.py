"""The one HTTP client of the CLI: the "Users" routes of the control plane API.

Every answer that is not a success becomes a :class:`CliError` carrying the problem's
``detail``; every transport failure becomes a :class:`CliError` that says what to check.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import quote

import httpx

from cli.errors import CliError
from common.client_config import load_client_config

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
# A followed log may stay quiet for long: a read timeout only makes the client reconnect
# at the offset it reached, so nothing is lost or repeated.
FOLLOW_TIMEOUT = httpx.Timeout(30.0, connect=10.0, read=60.0)
FOLLOW_RETRIES = 5
RETRY_DELAY = 1.0
PROBLEM_MEDIA_TYPE = "application/problem+json"
TERMINAL_STATUSES = frozenset({"rejected", "succeeded", "failed", "stopped", "stop failed"})


_OWNED_PATHS = ("/v1/jobs", "/v1/audit/jobs")
"""The routes an admin's ``owner`` applies to."""
POSITION_HEADER = "X-Flexai-Position"
MIN_POSITION_HEADER = "X-Flexai-Min-Position"


def _segment(value: str | int) -> str:
    """One URL path segment, so that a name can never reach another route."""
    return quote(str(value), safe="")


class ApiClient:
    """Talks to the control plane's ``/v1`` "Users" routes with a bearer token."""

    def __init__(
        self,
        api_url: str,
        token: str,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        owner: str | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.owner = owner
        """Whose jobs the job routes act on (an admin's ``--owner``); None: the caller's."""
        self._http = httpx.Client(
            base_url=self.api_url,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "User-Agent": "flexai-cli",
            },
            timeout=timeout,
            event_hooks={"request": [self._ask_position], "response": [self._note_position]},
        )
        self.position = 0
        """The ledger position of this client's last write: later reads wait for it, on
        whichever replica answers them (``X-Flexai-Min-Position``)."""

    def _ask_position(self, request: httpx.Request) -> None:
        if self.position:
            request.headers[MIN_POSITION_HEADER] = str(self.position)
        if self.owner is not None and request.url.path.startswith(_OWNED_PATHS):
            request.url = request.url.copy_merge_params({"owner": self.owner})

    def _note_position(self, response: httpx.Response) -> None:
        value = response.headers.get(POSITION_HEADER, "")
        if value.isdigit():
            self.position = max(self.position, int(value))

    @classmethod
    def from_config(cls, owner: str | None = None) -> ApiClient:
        """A client for the URL and token of ``common.client_config`` (env vars, then the
        file); with ``owner``, acting on that user's jobs (admins)."""
        config = load_client_config()
        return cls(config.api_url, config.token, owner=owner)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- jobs ----------------------------------------------------------------------------

    def create_job(self, job: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/jobs``: submit a JobCreate, get the JobPublic."""
        return self._json("POST", "/v1/jobs", json=job)

    def list_jobs(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        statuses: Iterable[str] = (),
        name_prefix: str | None = None,
    ) -> dict[str, Any]:
        """``GET /v1/jobs``: one page, ``{"jobs": [JobSummary], "count": n, "next_cursor":
        str | None}``, newest first; pass ``next_cursor`` back as ``cursor`` for the next."""
        params: dict[str, Any] = {"status": list(statuses)}
        if limit is not None:
            params["limit"] = limit
        if cursor:
            params["cursor"] = cursor
        if name_prefix:
            params["name_prefix"] = name_prefix
        return self._json("GET", "/v1/jobs", params=params)

    def get_job(self, name: str) -> dict[str, Any]:
        """``GET /v1/jobs/{name}``: the JobPublic."""
        return self._json("GET", f"/v1/jobs/{_segment(name)}")

    def stop_job(self, name: str) -> dict[str, Any]:
        """``POST /v1/jobs/{name}/stop``: ask for the stop, get the JobPublic."""
        return self._json("POST", f"/v1/jobs/{_segment(name)}/stop")

    def delete_job(self, name: str) -> dict[str, Any]:
        """``DELETE /v1/jobs/{name}``: ``{"id", "name", "deleted_at"}``."""
        return self._json("DELETE", f"/v1/jobs/{_segment(name)}")

    def list_checkpoints(self, name: str) -> dict[str, Any]:
        """``GET /v1/jobs/{name}/checkpoints``: ``{"checkpoints": [...]}``, oldest first."""
        return self._json("GET", f"/v1/jobs/{_segment(name)}/checkpoints")

    def iter_output(self, name: str, node_index: int = 0) -> Iterator[bytes]:
        """``GET /v1/jobs/{name}/outputs/{node_index}``: the zip, chunk by chunk."""
        path = f"/v1/jobs/{_segment(name)}/outputs/{_segment(node_index)}"
        with self._translated(), self._open("GET", path) as response:
            yield from response.iter_bytes()

    def iter_logs(
        self, name: str, *, follow: bool = False, offset: int = 0, node_index: int = 0
    ) -> Iterator[bytes]:
        """``GET /v1/jobs/{name}/logs``: the log bytes from ``offset`` as they come.

        With ``follow`` the server keeps the answer open until the job is terminal and every
        line was sent. If the connection breaks on the way, reconnect at the byte reached.
        """
        path = f"/v1/jobs/{_segment(name)}/logs"
        failures = 0
        while True:
            params = {"offset": str(offset), "follow": "true" if follow else "false"}
            if node_index:
                params["node_index"] = str(node_index)
            connected = False
            try:
                with self._open(
                    "GET", path, params=params, timeout=FOLLOW_TIMEOUT if follow else None
                ) as response:
                    connected = True
                    for chunk in response.iter_bytes():
                        failures = 0
                        offset += len(chunk)
                        yield chunk
                if not follow or self._status(name) in TERMINAL_STATUSES:
                    return
                # the server ended the stream early (it restarts): resume where we are
                time.sleep(RETRY_DELAY)
            except httpx.ReadTimeout as error:
                if not (follow and connected):
                    raise self._transport_error(error) from error
                # the job is quiet: ask again from where we are
            except httpx.TransportError as error:
                failures += 1
                if not follow or failures > FOLLOW_RETRIES:
                    raise self._transport_error(error) from error
                time.sleep(RETRY_DELAY)

    def _status(self, name: str) -> str:
        """The job's status; a transport failure is raised as is (a follower retries it)."""
        response = self._http.get(f"/v1/jobs/{_segment(name)}")
        self._raise_for_problem(response)
        return str(response.json()["status"])

    # --- debug sessions ------------------------------------------------------------------

    def open_debug_session(self, name: str, public_key: str, node_index: int = 0) -> dict[str, Any]:
        """``POST /v1/jobs/{name}/debug-sessions``: the DebugSessionPublic (``waiting``)."""
        body = {"public_key": public_key, "node_index": node_index}
        return self._json("POST", f"/v1/jobs/{_segment(name)}/debug-sessions", json=body)

    def debug_session(self, name: str, session_id: str, wait: float = 0) -> dict[str, Any]:
        """``GET /v1/jobs/{name}/debug-sessions/{id}?wait=S``: answered once the node took it."""
        path = f"/v1/jobs/{_segment(name)}/debug-sessions/{_segment(session_id)}"
        return self._json("GET", path, params={"wait": wait},
                          timeout=httpx.Timeout(30.0 + wait, connect=10.0))  # fmt: skip

    def close_debug_session(self, name: str, session_id: str) -> dict[str, Any]:
        """``DELETE /v1/jobs/{name}/debug-sessions/{id}``: the session ended (no error twice)."""
        path = f"/v1/jobs/{_segment(name)}/debug-sessions/{_segment(session_id)}"
        return self._json("DELETE", path)

    def debug_stream_target(self, name: str, session_id: str) -> tuple[str, dict[str, str]]:
        """The WebSocket URL of a session's stream, and the header that authenticates it."""
        path = f"/v1/jobs/{_segment(name)}/debug-sessions/{_segment(session_id)}/stream"
        url = "ws" + self.api_url.removeprefix("http") + path
        return url, {"Authorization": self._http.headers["Authorization"]}

    # --- datasets ------------------------------------------------------------------------

    def push_dataset(self, name: str, archive: Iterable[bytes]) -> dict[str, Any]:
        """``PUT /v1/datasets/{name}``: the zip, streamed as it is made; the DatasetPushed."""
        headers = {"Content-Type": "application/zip"}
        return self._json("PUT", f"/v1/datasets/{_segment(name)}", content=archive,
                          headers=headers)  # fmt: skip

    def list_datasets(self) -> dict[str, Any]:
        """``GET /v1/datasets``: ``{"datasets": [DatasetPublic], "count": n}``, by name."""
        return self._json("GET", "/v1/datasets")

    def get_dataset(self, name: str) -> dict[str, Any]:
        """``GET /v1/datasets/{name}``: the DatasetDetail, its versions newest first."""
        return self._json("GET", f"/v1/datasets/{_segment(name)}")

    # --- secrets -------------------------------------------------------------------------

    def create_secret(self, name: str, value: str, *, update: bool = False) -> dict[str, Any]:
        """``POST /v1/secrets`` (409 if the name is taken), or with ``update`` ``PUT
        /v1/secrets/{name}`` (create or replace): the SecretPublic, never the value."""
        if update:
            return self._json("PUT", f"/v1/secrets/{_segment(name)}", json={"value": value})
        return self._json("POST", "/v1/secrets", json={"name": name, "value": value})

    def list_secrets(self) -> dict[str, Any]:
        """``GET /v1/secrets``: ``{"secrets": [SecretPublic], "count": n}``, by name."""
        return self._json("GET", "/v1/secrets")

    def delete_secret(self, name: str) -> dict[str, Any]:
        """``DELETE /v1/secrets/{name}``."""
        return self._json("DELETE", f"/v1/secrets/{_segment(name)}")

    # --- users and tokens ----------------------------------------------------------------

    def whoami(self) -> dict[str, Any]:
        """``GET /v1/whoami``: who this token acts for."""
        return self._json("GET", "/v1/whoami")

    def create_user(self, name: str, *, admin: bool = False) -> dict[str, Any]:
        """``POST /v1/admin/users``: the user and its first token (shown once)."""
        return self._json("POST", "/v1/admin/users", json={"name": name, "admin": admin})

    def list_users(self) -> dict[str, Any]:
        """``GET /v1/admin/users``."""
        return self._json("GET", "/v1/admin/users")

    def create_token(self, *, user: str | None = None, label: str = "") -> dict[str, Any]:
        """``POST /v1/tokens``: a token of the caller's (an admin: of ``user``), shown once."""
        body: dict[str, Any] = {"label": label, **({"user": user} if user else {})}
        return self._json("POST", "/v1/tokens", json=body)

    def list_tokens(self, *, user: str | None = None, all_users: bool = False) -> dict[str, Any]:
        """``GET /v1/tokens``: tokens without their values."""
        params: dict[str, Any] = {"all_users": "true"} if all_users else {}
        if user:
            params["user"] = user
        return self._json("GET", "/v1/tokens", params=params)

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        """``DELETE /v1/tokens/{token_id}``."""
        return self._json("DELETE", f"/v1/tokens/{_segment(token_id)}")

    def create_node_token(self, node: str, *, label: str = "") -> dict[str, Any]:
        """``POST /v1/admin/node-tokens``: a token for one node's agent, shown once."""
        return self._json("POST", "/v1/admin/node-tokens", json={"node": node, "label": label})

    # --- audit ---------------------------------------------------------------------------

    def audit_jobs(self, name: str) -> dict[str, Any]:
        """``GET /v1/audit/jobs?name=N``: every job that ever had that name."""
        return self._json("GET", "/v1/audit/jobs", params={"name": name})

    def audit_events(self, job_id: str) -> dict[str, Any]:
        """``GET /v1/audit/jobs/{job_id}``: the events of one job, from the ledger."""
        return self._json("GET", f"/v1/audit/jobs/{_segment(job_id)}")

    def admin_verify(self, expect_digest: str | None = None) -> dict[str, Any]:
        """``POST /v1/admin/verify``: the ledger's chain and the views checked (admin token)."""
        body = {"expect_digest": expect_digest} if expect_digest else {}
        return self._json("POST", "/v1/admin/verify", json=body)

    def admin_rebuild(self) -> dict[str, Any]:
        """``POST /v1/admin/rebuild-projections``: start rebuilding the views (admin token)."""
        return self._json("POST", "/v1/admin/rebuild-projections")

    def admin_rebuild_progress(self) -> dict[str, Any]:
        """``GET /v1/admin/rebuild-projections``: the last rebuild's progress."""
        return self._json("GET", "/v1/admin/rebuild-projections")

    def audit_state(
        self, job_id: str, version: int | None = None, at: str | None = None
    ) -> dict[str, Any]:
        """``GET /v1/audit/jobs/{job_id}/state?version=N|at=ISO``: the job folded from the
        ledger as it was then (the AuditJobState)."""
        params: dict[str, Any] = {"version": version, "at": at}
        return self._json("GET", f"/v1/audit/jobs/{_segment(job_id)}/state",
                          params={key: value for key, value in params.items()
                                  if value is not None})  # fmt: skip

    # --- plumbing ------------------------------------------------------------------------

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        with self._translated():
            response = self._http.request(method, path, **kwargs)
        self._raise_for_problem(response)
        try:
            data = response.json()
        except ValueError as error:
            raise CliError(
                f"the control plane at {self.api_url} answered {method} {path} with something "
                f"that is not JSON (HTTP {response.status_code}); is FLEXAI_API_URL right?"
            ) from error
        if not isinstance(data, dict):
            raise CliError(f"unexpected answer to {method} {path}: {data!r:.200}")
        return data

    @contextlib.contextmanager
    def _open(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> Iterator[httpx.Response]:
        """A streamed answer whose status was checked; its body is not read yet."""
        extra: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
        with self._http.stream(method, path, params=params, **extra) as response:
            if not response.is_success:
                response.read()
                self._raise_for_problem(response)
            yield response

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except httpx.TransportError as error:
            raise self._transport_error(error) from error

    def _transport_error(self, error: httpx.TransportError) -> CliError:
        if isinstance(error, httpx.ConnectError):
            return CliError(
                f"cannot reach the control plane at {self.api_url}: is `flexai server` "
                f"running? (set FLEXAI_API_URL)"
            )
        if isinstance(error, httpx.TimeoutException):
            return CliError(
                f"the control plane at {self.api_url} did not answer in time; try again"
            )
        if isinstance(error, httpx.UnsupportedProtocol):
            return CliError(
                f"the API URL {self.api_url!r} is not an http:// or https:// URL "
                f"(set FLEXAI_API_URL)"
            )
        reason = str(error) or type(error).__name__
        return CliError(f"the connection to the control plane at {self.api_url} failed: {reason}")

    @staticmethod
    def _raise_for_problem(response: httpx.Response) -> None:
        if response.is_success:
            return
        raise problem_error(response)


def problem_error(response: httpx.Response) -> CliError:
    """The CliError for a failed answer: the problem's detail, else its title, else the text."""
    status = response.status_code
    problem: Any = None
    try:
        problem = response.json()
    except ValueError:
        problem = None
    if isinstance(problem, dict):
        detail = problem.get("detail")
        title = problem.get("title")
        problem_type = str(problem.get("type") or "")
        slug = problem_type.rsplit("/", 1)[-1] if problem_type else None
        if isinstance(detail, list):  # a framework's validation error list, not RFC 9457
            detail = "; ".join(_validation_message(item) for item in detail)
        message = str(detail or title or f"the control plane answered HTTP {status}")
        return CliError(
            " ".join(message.split()),
            title=str(title) if title else None,
            status=status,
            slug=slug,
        )
    text = " ".join(response.text.split())[:200]
    reason = response.reason_phrase or "error"
    suffix = f": {text}" if text else ""
    return CliError(f"the control plane answered HTTP {status} {reason}{suffix}", status=status)


def _validation_message(item: Any) -> str:
    if isinstance(item, dict):
        where = ".".join(str(part) for part in item.get("loc", []) if part != "body")
        message = item.get("msg", "invalid")
        return f"{where}: {message}" if where else str(message)
    return str(item)
