"""Every request's path and query are text the views can hold: UTF-8, no control character.

A name or value with a NUL, a control character or bytes that are not UTF-8 can never be
stored (``domain/values.py`` refuses them), and PostgreSQL refuses NUL outright, so such a
request is answered 422 here, before any route or database sees it, whichever route it is
for. A path with an encoded slash (``%2F``) is refused too: the server would decode it into a
separator, so that a job named ``x/checkpoints`` (which no name may be) reached another route.
:class:`CleanRequestText` is a pure ASGI middleware.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote_to_bytes

from api.http.problems import Problem, problem_response

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def text_problem(raw: bytes, where: str) -> Problem | None:
    """Why the percent-encoded ``raw`` (a path, a query) is no text a name or value may be."""
    try:
        text = unquote_to_bytes(raw.replace(b"+", b" ")).decode("utf-8")
    except UnicodeDecodeError as error:
        return _refused(where, f"holds bytes that are not UTF-8 (at byte {error.start})")
    bad = _CONTROL.search(text)
    if bad is not None:
        return _refused(where, f"holds the control character U+{ord(bad.group()):04X} at "
                               f"position {bad.start()}")  # fmt: skip
    return None


def path_problem(raw: bytes) -> Problem | None:
    """Why the percent-encoded path ``raw`` can name no resource, if it cannot."""
    if b"%2F" in raw or b"%2f" in raw:
        return Problem(
            422, "invalid-request", "Invalid request",
            "the request's path holds an encoded '/' (%2F) inside a name; no job, dataset, "
            "checkpoint, secret or user name holds '/': fix the name and send it again",
            field="path",
        )  # fmt: skip
    return text_problem(raw, "path")


def _refused(where: str, problem: str) -> Problem:
    return Problem(
        422, "invalid-request", "Invalid request",
        f"the request's {where} {problem}; names and values are UTF-8 text without control "
        "characters: fix it and send it again", field=where,
    )  # fmt: skip


class CleanRequestText:
    """Refuses (422) a request whose path or query string is not clean UTF-8 text."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw_path = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
            problem = path_problem(raw_path) or text_problem(
                scope.get("query_string", b""), "query"
            )
            if problem is not None:
                response = problem_response(problem, None, path=scope["path"])
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
