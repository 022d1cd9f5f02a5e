"""Errors as problem details (RFC 9457); never a stack trace."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from eventsourcing.persistence import MapperDeserialisationError
from fastapi import FastAPI, Request
from fastapi.exceptions import HTTPException, RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.artifacts.archives import ArchiveTooLarge, InvalidArchive
from api.artifacts.store import LogOffsetMismatch, StorageUnavailable, UploadIncomplete
from api.http.route_templates import RouteTemplates
from api.identity import identities
from api.identity.identities import IdentityError
from api.scheduling.nodes import NodeTaken
from domain.errors import (
    DomainError,
    IllegalTransition,
    InvalidJobSpec,
    JobDeleted,
    JobNotTerminal,
    NameTaken,
)
from domain.outcomes import JobNotFound
from domain.reports import WrongNode
from ledger.database import is_unavailable
from projections.projector import ProjectionHalted, ProjectionTimeout

log = logging.getLogger(__name__)
MEDIA_TYPE = "application/problem+json"


RETRY_AFTER_S = 2


class ProblemDetails(BaseModel):
    """An error (RFC 9457): what went wrong and what to do, with the extension members of its
    type (``field``, ``limit``, ``expected_offset``, ...)."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="https://flexai.dev/problems/<slug>")
    title: str
    status: int
    detail: str = Field(description="what was wrong and what to do")
    instance: str = Field(description="the request's path")


def _documented(description: str) -> dict[str, Any]:
    schema = ProblemDetails.model_json_schema()
    return {"description": description, "content": {MEDIA_TYPE: {"schema": schema}}}


OPENAPI_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": _documented("The request was refused: problem details say why and what to do"),
    "5XX": _documented("503: unavailable for a moment (retry after `Retry-After` seconds)"),
}
"""Every operation's errors as OpenAPI documents them (FastAPI's own 422 schema is not used)."""


class Problem(Exception):
    def __init__(
        self, status: int, slug: str, title: str, detail: str,
        headers: dict[str, str] | None = None, **extra: Any,
    ) -> None:  # fmt: skip
        super().__init__(detail)
        self.status, self.slug, self.title, self.detail, self.extra = (
            status, slug, title, detail, extra,
        )  # fmt: skip
        self.headers = headers or {}


class PayloadTooLarge(HTTPException):
    """A body over its route's limit; raised while it is read, before it is parsed."""

    def __init__(self, limit: int, what: str) -> None:
        super().__init__(413, f"{what} is larger than the limit of {limit} bytes")
        self.limit = limit
        self.what = what


def payload_too_large(error: PayloadTooLarge) -> Problem:
    return Problem(
        413, "payload-too-large", "Payload too large",
        f"{error.detail}; send less (the server's limit is a setting of `flexai server`)",
        limit=error.limit,
    )  # fmt: skip


CHALLENGE = {"WWW-Authenticate": 'Bearer realm="flexai"'}
"""A 401's challenge (RFC 9110 section 11.6.1): the token scheme the API takes."""


def unauthorized() -> Problem:
    return Problem(
        401, "unauthorized", "Unauthorized",
        "missing or unknown API token: send `Authorization: Bearer <token>` (`flexai login` "
        "keeps one; `flexai server` printed the admin token on first start, and an admin "
        "makes the others: `flexai admin user create`, `flexai admin node-token create`)",
        headers=CHALLENGE,
    )  # fmt: skip


def revoked_token(token_id: str, revoked_at: str) -> Problem:
    return Problem(
        401, "token-revoked", "Token revoked",
        f"this API token (id {token_id}) was revoked at {revoked_at}: `flexai login` with "
        "another one (an admin makes them: `flexai admin token create`)",
        headers={"WWW-Authenticate": f'{CHALLENGE["WWW-Authenticate"]}, error="invalid_token"'},
    )  # fmt: skip


def forbidden(slug: str, title: str, detail: str) -> Problem:
    return Problem(403, slug, title, detail)


def unavailable(slug: str, title: str, detail: str) -> Problem:
    """A 503 that passes by itself: the client should retry after a moment."""
    return Problem(503, slug, title, detail, headers={"Retry-After": str(RETRY_AFTER_S)})


def database_unavailable(error: BaseException) -> Problem:
    reason = " ".join(str(error).split())[:300] or type(error).__name__
    return unavailable(
        "database-unavailable", "Database unavailable",
        f"the control plane cannot reach its database right now ({reason}); nothing was "
        f"lost: retry in {RETRY_AFTER_S} s",
    )  # fmt: skip


def views_halted(error: ProjectionHalted) -> Problem:
    problem = unavailable(
        "views-halted", "Views halted",
        "the control plane's views stopped at an event they cannot apply "
        f"({error.poison.describe()}), so changes are refused until an operator restarts the "
        f"server with a fix, or with `--skip-event {error.poison.position}`; reads still answer "
        "from the views as they stood. Retry later (GET /health tells when it is fixed)",
    )  # fmt: skip
    problem.extra["halted_at"] = error.poison.position
    return problem


def too_many_followers(error: Exception) -> Problem:
    return unavailable("too-many-followers", "Too many log streams", str(error))


def upload_not_found(upload_id: str) -> Problem:
    return Problem(
        404, "upload-not-found", "Upload not found",
        f"no unfinished upload {upload_id[:64]} of a job of this node (it was aborted, or "
        "another upload of the same artifact replaced it); begin the upload again",
    )  # fmt: skip


def upload_incomplete(detail: str) -> Problem:
    return Problem(409, "upload-incomplete", "Upload incomplete",
                   f"{detail}; begin the upload again")  # fmt: skip


def problem_response(problem: Problem, request: Request | None, path: str = "") -> JSONResponse:
    body = {
        "type": f"https://flexai.dev/problems/{problem.slug}",
        "title": problem.title,
        "status": problem.status,
        "detail": problem.detail,
        "instance": request.url.path if request is not None else path,
        **problem.extra,
    }
    return JSONResponse(
        body, status_code=problem.status, media_type=MEDIA_TYPE, headers=problem.headers
    )


IDENTITY_PROBLEMS: list[tuple[type[IdentityError], int, str]] = [
    (identities.InvalidIdentityValue, 422, "invalid-request"),
    (identities.UserNotFound, 404, "user-not-found"),
    (identities.UserExists, 409, "user-exists"),
    (identities.TokenNotFound, 404, "token-not-found"),
    (IdentityError, 409, "conflict"),
]  # how each refusal of users and tokens is answered


def from_identity(error: IdentityError) -> Problem:
    status, slug = next((code, slug) for kind, code, slug in IDENTITY_PROBLEMS
                        if isinstance(error, kind))  # fmt: skip
    return Problem(status, slug, error.title, error.detail)


def from_domain(error: Exception) -> Problem:
    detail = str(error)
    if isinstance(error, InvalidJobSpec) and error.field:
        return Problem(422, "invalid-request", "Invalid job", detail, field=error.field)
    if isinstance(error, IllegalTransition):
        return Problem(
            409, "illegal-transition", "Illegal status change", detail,
            current_status=error.current.value, attempted_status=error.attempted.value,
        )  # fmt: skip
    table: list[tuple[type[Exception], int, str, str]] = [
        (JobNotFound, 404, "job-not-found", "Job not found"),
        (NameTaken, 409, "name-taken", "Name already in use"),
        (JobNotTerminal, 409, "job-not-terminal", "Job is still running"),
        (JobDeleted, 409, "job-deleted", "Job was deleted"),
        (InvalidJobSpec, 422, "invalid-request", "Invalid job"),
        (WrongNode, 409, "wrong-node", "Job belongs to another node"),
        (InvalidArchive, 422, "invalid-request", "Invalid archive"),
        (NodeTaken, 409, "node-taken", "Node held by another agent"),
        (ArchiveTooLarge, 413, "payload-too-large", "Archive too large"),
        (DomainError, 409, "conflict", "Refused"),
    ]
    for kind, status, slug, title in table:
        if isinstance(error, kind):
            return Problem(status, slug, title, detail)
    if isinstance(error, ProjectionHalted):
        return views_halted(error)
    if isinstance(error, StorageUnavailable):
        return unavailable(
            "storage-unavailable", "Storage unavailable",
            f"{detail}; nothing was lost: retry in {RETRY_AFTER_S} s (an operator must bring "
            "the artifact store back)",
        )  # fmt: skip
    if isinstance(error, UploadIncomplete):
        return upload_incomplete(detail)
    if isinstance(error, ProjectionTimeout):
        return unavailable(
            "views-behind", "Views behind",
            f"{detail}; the command was recorded: look again in a moment",
        )  # fmt: skip
    if is_unavailable(error):
        return database_unavailable(error)
    if isinstance(error, MapperDeserialisationError):
        return Problem(
            500, "ledger-unreadable", "Ledger unreadable",
            f"{' '.join(detail.split())[:500]}: the stored event was altered behind the "
            "ledger's back; an admin's `flexai admin verify` names every such event",
        )  # fmt: skip
    return Problem(500, "internal-error", "Internal error", "unexpected error; see server log")


def install(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(request: Request, error: Problem) -> JSONResponse:
        return problem_response(error, request)

    @app.exception_handler(DomainError)
    async def _domain(request: Request, error: DomainError) -> JSONResponse:
        return problem_response(from_domain(error), request)

    @app.exception_handler(IdentityError)
    async def _identity(request: Request, error: IdentityError) -> JSONResponse:
        return problem_response(from_identity(error), request)

    @app.exception_handler(InvalidArchive)
    async def _archive(request: Request, error: InvalidArchive) -> JSONResponse:
        return problem_response(from_domain(error), request)

    @app.exception_handler(PayloadTooLarge)
    async def _too_large(request: Request, error: PayloadTooLarge) -> JSONResponse:
        return problem_response(payload_too_large(error), request)

    @app.exception_handler(LogOffsetMismatch)
    async def _offset(request: Request, error: LogOffsetMismatch) -> JSONResponse:
        problem = Problem(
            409, "log-offset-mismatch", "Log offset mismatch", str(error),
            expected_offset=error.expected,
        )  # fmt: skip
        return problem_response(problem, request)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return problem_response(invalid_request(request, error.errors()), request)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return problem_response(http_problem(request, error), request)

    async def _mapped(request: Request, error: Exception) -> JSONResponse:
        problem = from_domain(error)
        if problem.status == 500:
            log.error("unexpected %s on %s %s", type(error).__name__, request.method,
                      request.url.path, exc_info=error)  # fmt: skip
        else:
            log.warning("%s %s: %s", request.method, request.url.path, problem.detail)
        return problem_response(problem, request)

    # Known failures answered here, not by the last-resort handler (which re-raises to the
    # server, so that each would be logged as a crash).
    for kind in (ProjectionHalted, ProjectionTimeout, StorageUnavailable, ArchiveTooLarge,
                 UploadIncomplete, NodeTaken, MapperDeserialisationError,
                 *_database_errors()):  # fmt: skip
        app.add_exception_handler(kind, _mapped)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        problem = from_domain(error)
        if problem.status == 500:
            log.exception("unexpected error on %s %s", request.method, request.url.path)
        else:
            log.warning("%s %s: %s", request.method, request.url.path, problem.detail)
        return problem_response(problem, request)


def unreadable_body(request: Request, reason: str = "") -> Problem:
    """A body that is not JSON text at all (400), whatever the route."""
    return Problem(
        400, "invalid-request", "Unreadable body",
        f"the body of {request.method} {request.url.path} could not be read as JSON"
        f"{f' ({reason})' if reason else ''}: send UTF-8 JSON with "
        "`Content-Type: application/json`",
    )  # fmt: skip


def _field(location: Sequence[Any], source: bool) -> str:
    """A value's place as a 422's ``field`` names it: ``name``, ``env.KEY``, ``0.name`` (an
    item of a list body), ``limit`` (a query parameter); ``body`` for the body as a whole.
    ``source``: the location begins with where the value came from (``body``, ``query``)."""
    parts = location[1:] if source else location
    return ".".join(str(part) for part in parts) or str(location[0] if source else "body")


PLAIN = {
    "missing": "is required", "extra_forbidden": "is not a field of this request",
    "greater_than_equal": "must be at least {ge}", "less_than_equal": "must be at most {le}",
    "greater_than": "must be more than {gt}", "less_than": "must be less than {lt}",
    "int_type": "must be a whole number", "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number", "bool_type": "must be true or false",
    "bool_parsing": "must be true or false", "string_type": "must be text",
    "string_too_short": "must have at least {min_length} characters",
    "string_too_long": "must have at most {max_length} characters",
    "too_short": "must have at least {min_length} items",
    "too_long": "must have at most {max_length} items", "literal_error": "must be {expected}",
    "string_pattern_mismatch": "must match {pattern}",
    "datetime_parsing": "must be an ISO 8601 moment ({error})",
    "datetime_from_date_parsing": "must be an ISO 8601 moment ({error})",
    "timezone_aware": "must hold its offset from UTC (e.g. +00:00)",
}  # fmt: skip
"""Pydantic's error types in the words of the rest of the API (``must be at most 3600``, not
``Input should be less than or equal to 3600``)."""


def plain(error: Mapping[str, Any]) -> str:
    """One validation error's message: our own checks' words as they raised them."""
    wording, context = PLAIN.get(str(error.get("type"))), error.get("ctx") or {}
    if error.get("type") == "value_error":
        return str(context.get("error") or error["msg"])
    try:
        return wording.format(**context) if wording else str(error["msg"])
    except (KeyError, IndexError):
        return str(error["msg"])


def invalid_values(errors: Sequence[Any], title: str, what: str, source: bool = True) -> Problem:
    """Pydantic's validation errors as one 422, whose ``field`` names the first invalid value
    (and ``fields`` all of them, when there are several)."""
    fields = [_field(item["loc"], source) for item in errors] or ["body"]
    details = "; ".join(f"{field}: {plain(item)}"
                        for field, item in zip(fields, errors, strict=False)) or "body: invalid"
    problem = Problem(422, "invalid-request", title,
                      f"{what} is invalid: {details}; fix it and send it again",
                      field=fields[0])  # fmt: skip
    if len(set(fields)) > 1:
        problem.extra["fields"] = list(dict.fromkeys(fields))
    return problem


def invalid_request(request: Request, errors: Sequence[Any]) -> Problem:
    """FastAPI's validation errors as one problem: JSON that does not parse is a 400, the rest
    a 422 (``invalid_values``)."""
    for item in errors:
        if item.get("type") == "json_invalid":
            where = item["loc"][-1] if len(item["loc"]) > 1 else None
            reason = str(item.get("ctx", {}).get("error") or item["msg"])
            return unreadable_body(request, f"{reason} at character {where}"
                                   if isinstance(where, int) else reason)  # fmt: skip
    return invalid_values(errors, "Invalid request", "the request")


def http_problem(request: Request, error: StarletteHTTPException) -> Problem:
    """Starlette's own answers (no such route, a method the route has not, a body that is not
    JSON) as problems, their headers (a 405's ``Allow``) kept."""
    headers = dict(error.headers or {})
    if error.status_code == 400:  # FastAPI's word for a body that is not even JSON text
        return unreadable_body(request)
    if error.status_code == 405:  # Starlette's Allow names the first route's methods only
        templates: RouteTemplates | None = getattr(request.app.state, "route_templates", None)
        allowed = (templates.methods(request.url.path) if templates else []) or [
            method.strip() for method in headers.get("Allow", "").split(",") if method.strip()
        ]  # fmt: skip
        headers["Allow"] = ", ".join(allowed)
        return Problem(
            405, "method-not-allowed", "Method not allowed",
            f"{request.method} is not a method of {request.url.path}: use "
            f"{' or '.join(allowed) or 'another path'}", headers=headers,
        )  # fmt: skip
    slug = "not-found" if error.status_code == 404 else "http-error"
    return Problem(error.status_code, slug, str(error.detail),
                   f"{error.detail}: {request.url.path}", headers=headers)  # fmt: skip


def _database_errors() -> list[type[Exception]]:
    """The drivers' "cannot reach the database" exceptions (mapped to 503 when they are)."""
    import sqlite3

    import psycopg
    from eventsourcing import persistence

    from ledger.database import DatabaseUnavailable

    return [
        DatabaseUnavailable, sqlite3.OperationalError, psycopg.OperationalError,
        psycopg.InterfaceError, persistence.OperationalError, persistence.InterfaceError,
    ]  # fmt: skip
