"""Errors as problem details (RFC 9457); never a stack trace."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.artifacts import InvalidArchive, LogOffsetMismatch
from domain.application import JobNotFound, WrongNode
from domain.model import (
    DomainError,
    IllegalTransition,
    InvalidJobSpec,
    JobDeleted,
    JobNotTerminal,
    NameTaken,
)

log = logging.getLogger(__name__)
MEDIA_TYPE = "application/problem+json"


class Problem(Exception):
    def __init__(self, status: int, slug: str, title: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.slug, self.title, self.detail, self.extra = (
            status, slug, title, detail, extra,
        )  # fmt: skip


def problem_response(problem: Problem, request: Request) -> JSONResponse:
    body = {
        "type": f"https://flexai.dev/problems/{problem.slug}",
        "title": problem.title,
        "status": problem.status,
        "detail": problem.detail,
        "instance": request.url.path,
        **problem.extra,
    }
    return JSONResponse(body, status_code=problem.status, media_type=MEDIA_TYPE)


def from_domain(error: Exception) -> Problem:
    detail = str(error)
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
        (DomainError, 409, "conflict", "Refused"),
    ]
    for kind, status, slug, title in table:
        if isinstance(error, kind):
            return Problem(status, slug, title, detail)
    return Problem(500, "internal-error", "Internal error", "unexpected error; see server log")


def install(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(request: Request, error: Problem) -> JSONResponse:
        return problem_response(error, request)

    @app.exception_handler(DomainError)
    async def _domain(request: Request, error: DomainError) -> JSONResponse:
        return problem_response(from_domain(error), request)

    @app.exception_handler(InvalidArchive)
    async def _archive(request: Request, error: InvalidArchive) -> JSONResponse:
        return problem_response(from_domain(error), request)

    @app.exception_handler(LogOffsetMismatch)
    async def _offset(request: Request, error: LogOffsetMismatch) -> JSONResponse:
        problem = Problem(
            409, "log-offset-mismatch", "Log offset mismatch", str(error),
            expected_offset=error.expected,
        )  # fmt: skip
        return problem_response(problem, request)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        details = "; ".join(
            f"{'.'.join(str(part) for part in item['loc'][1:]) or 'body'}: {item['msg']}"
            for item in error.errors()
        )
        problem = Problem(
            422, "invalid-request", "Invalid request",
            f"the request is invalid: {details}; fix it and send it again",
        )  # fmt: skip
        return problem_response(problem, request)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        slug = "not-found" if error.status_code == 404 else "http-error"
        detail = f"{error.detail}: {request.url.path}"
        problem = Problem(error.status_code, slug, str(error.detail), detail)
        return problem_response(problem, request)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return problem_response(from_domain(error), request)
