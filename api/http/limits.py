"""Limits on what one request may cost, checked before the request's body is read.

:class:`BodyLimits` is a pure ASGI middleware in front of the routes. For a request that
carries a body it checks, in this order and before a byte of the body is read: the bearer
token of an API request (401, so that an unknown client cannot make the server read 100 MB;
the web console's forms, outside ``/v1``, carry its session instead), the declared
``Content-Length`` against the route's limit (413), then counts the bytes as the route reads
them and stops at the limit (413, for chunked bodies that declared nothing).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from api.http.deps import bearer_token, resolve_caller
from api.http.problems import (
    PayloadTooLarge,
    Problem,
    database_unavailable,
    payload_too_large,
    problem_response,
)
from api.identity.identities import Identities
from api.settings import Limits
from ledger.database import is_unavailable

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_LOGS = re.compile(r"^/v1/agent/jobs/[^/]+/logs$")
_UPLOAD = re.compile(r"^/v1/agent/uploads/[^/]+/parts/[^/]+$|^/v1/datasets/[^/]+$")
DRAIN_BYTES = 16 * 2**20
"""A body at most this much over its limit is read and dropped before the 413 is sent, so that
the client sees the answer; a larger one is cut off (its connection closed)."""
_TOKEN_PATHS = "/v1"
"""The API: a body comes with a bearer token. The web console's forms (every other path that
takes a body) carry its session cookie and CSRF token instead, checked by the console itself;
their bodies are bounded all the same."""


def body_limit(limits: Limits, method: str, path: str) -> tuple[int, str]:
    """The most bytes a request to ``path`` may carry, and what to call them in an error."""
    if method == "POST" and _LOGS.match(path):
        return limits.log_chunk_bytes, "the log chunk"
    if method == "PUT" and _UPLOAD.match(path):
        return limits.upload_bytes, "the archive"
    return limits.request_bytes, "the request body"


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimits:
    """Authenticates, then bounds the body of every request that may carry one."""

    def __init__(self, app: ASGIApp, limits: Limits, identities: Identities) -> None:
        self.app = app
        self.limits = limits
        self.identities = identities

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path.startswith(_TOKEN_PATHS):
            token = bearer_token(scope)
            try:
                caller = await resolve_caller(self.identities, token)
            except Problem as problem:
                await self._answer(scope, send, problem)
                return
            except Exception as error:  # outside the routes' handlers: answer it here
                if not is_unavailable(error):
                    raise
                log.warning("%s %s: %s", scope["method"], path, error)
                await self._answer(scope, send, database_unavailable(error))
                return
            scope.setdefault("state", {})["caller"] = caller
        limit, what = body_limit(self.limits, scope["method"], path)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            if declared <= limit + DRAIN_BYTES:
                await _drain(receive)  # so that the client reads the 413, not a reset
            await self._answer(scope, send, payload_too_large(PayloadTooLarge(limit, what)))
            return
        await self.app(scope, _counting(receive, limit, what), send)

    @staticmethod
    async def _answer(scope: Scope, send: Send, problem: Problem) -> None:
        response = problem_response(problem, None, path=scope["path"])
        response.headers["Connection"] = "close"  # the body was not read: do not reuse
        await response(scope, _no_receive, send)


async def _drain(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


def _counting(receive: Receive, limit: int, what: str) -> Receive:
    seen = 0

    async def counted() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise PayloadTooLarge(limit, what)
        return message

    return counted


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}
