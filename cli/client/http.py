"""The HTTP mechanics under :class:`cli.client.api.ApiClient`: the bearer token, the ledger
position a later read waits for, answers that are not a success as a :class:`CliError`
carrying the problem's ``detail``, transport failures as one that says what to check, and
streams resumed at the byte reached when the connection breaks."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, Self

import httpx

from cli.errors import CliError
from common.contract import MIN_POSITION_HEADER, POSITION_HEADER
from common.tls import TlsConfigError, check_url, client_context, describe_failure
from common.tls import ca_file as tls_ca_file

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
# A followed log may stay quiet for long: a read timeout only makes the client reconnect
# at the offset it reached, so nothing is lost or repeated.
FOLLOW_TIMEOUT = httpx.Timeout(30.0, connect=10.0, read=60.0)
FOLLOW_RETRIES = 5
RETRY_DELAY = 1.0
PROBLEM_MEDIA_TYPE = "application/problem+json"

_OWNED_PATHS = ("/v1/jobs", "/v1/audit/jobs")
"""The routes an admin's ``owner`` applies to."""


class HttpSession:
    """A connection to the control plane with a bearer token: JSON answers or errors."""

    def __init__(
        self,
        api_url: str,
        token: str,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        owner: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.owner = owner
        """Whose jobs the job routes act on (an admin's ``--owner``); None: the caller's."""
        self.ca_file = tls_ca_file(ca_file)
        try:
            check_url(self.api_url)  # before any connection: no token in clear text elsewhere
            verify = client_context(self.ca_file) if self.api_url.startswith("https:") else True
        except TlsConfigError as refused:
            raise CliError(str(refused)) from None
        self._http = httpx.Client(
            base_url=self.api_url,
            verify=verify,
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

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

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

    def _resumed_stream(
        self,
        path: str,
        params: dict[str, str],
        *,
        offset: int,
        follow: bool,
        finished: Callable[[], bool],
        sticky: dict[str, str] | None = None,
    ) -> Iterator[bytes]:
        """``GET path`` from byte ``offset`` as the bytes come (``params`` besides).

        With ``follow`` the server keeps the answer open; if it ends before ``finished()``
        or the connection breaks on the way, reconnect at the byte reached. ``sticky``: answer
        headers whose value a reconnection sends back as the query parameter they map to (the
        attempt a log answer was of, so that the bytes reached stay that attempt's); ``params``
        gets them.
        """
        failures = 0
        while True:
            query = {"offset": str(offset), "follow": "true" if follow else "false", **params}
            connected = False
            try:
                with self._open(
                    "GET", path, params=query, timeout=FOLLOW_TIMEOUT if follow else None
                ) as response:
                    connected = True
                    for header, param in (sticky or {}).items():
                        if header in response.headers and param not in params:
                            params[param] = response.headers[header]
                    for chunk in response.iter_bytes():
                        failures = 0
                        offset += len(chunk)
                        yield chunk
                if not follow or finished():
                    return
                # the server ended the stream early (it restarts): resume where we are
                time.sleep(RETRY_DELAY)
            except httpx.ReadTimeout as error:
                if not (follow and connected):
                    raise self._transport_error(error) from error
                # the stream is quiet: ask again from where we are
            except httpx.TransportError as error:
                failures += 1
                if not follow or failures > FOLLOW_RETRIES:
                    raise self._transport_error(error) from error
                time.sleep(RETRY_DELAY)

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
        untrusted = describe_failure(error, self.api_url, self.ca_file)
        if untrusted is not None:
            return CliError(untrusted)
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
