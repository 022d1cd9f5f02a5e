"""Signing in and out of the console, and the checks every form passes.

Sign-in takes an API token (the CLI's), checks it as the API does, and opens a server-side
session (:mod:`api.identity.sessions`) whose id goes back in an ``HttpOnly``,
``SameSite=Strict`` cookie (``Secure`` over https); the token itself is never stored by the
browser. A form that changes something is refused unless it comes from a page of this server
(its ``Origin``, else its ``Referer``, names this host) and carries its session's CSRF token.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from api.console.render import page, problem_page, redirect
from api.identity.identities import Caller, Revoked
from api.identity.sessions import SESSION_COOKIE, csrf_token
from api.services import Services

router = APIRouter(include_in_schema=False)
FORM_BYTES = 64 * 1024
"""A console form is a few fields; anything longer is refused (the API's limits apply too)."""


@dataclass(frozen=True)
class Signed:
    """Who a console request acts for, and its session's CSRF token."""

    caller: Caller
    session_id: str

    @property
    def user(self) -> str:
        assert self.caller.user is not None
        return self.caller.user

    @property
    def admin(self) -> bool:
        return self.caller.admin

    @property
    def csrf(self) -> str:
        return csrf_token(self.session_id)


def services_of(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def signed_in(request: Request) -> Signed | None:
    """The request's live session (blocking: call it from a worker thread)."""
    session_id = request.cookies.get(SESSION_COOKIE)
    if not session_id or len(session_id) > 128:
        return None
    caller = services_of(request).sessions.resolve(session_id)
    return Signed(caller, session_id) if caller is not None else None


async def signed_in_async(request: Request) -> Signed | None:
    return await run_in_threadpool(signed_in, request)


def to_sign_in(request: Request) -> Response:
    """Not signed in: the sign-in page, then back here."""
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return redirect(f"/sign-in?next={quote(target, safe='')}")


def local_path(target: str | None) -> str:
    """Where to go after signing in: a path of this server only (never another site)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target


def same_origin(request: Request) -> bool:
    """The form was sent by a page of this server (browsers send Origin with every POST)."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin or origin == "null":
        return False
    return urlsplit(origin).netloc == request.headers.get("host")


async def read_form(request: Request) -> dict[str, str]:
    """The fields of an urlencoded form (first value of each); {} for anything else."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_BYTES:
            return {}
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {key: values[0] for key, values in fields.items()}


def refused_form(request: Request, signed: Signed | None, form: dict[str, str]) -> str | None:
    """Why a form that changes something is refused, or None when it may go on."""
    if not same_origin(request):
        return ("this form did not come from a page of this server (its Origin header names "
                "another site, or none); open the console and use its buttons")
    if signed is None:
        return "you are not signed in (or your session ended); sign in again"
    if not hmac.compare_digest(form.get("csrf", ""), signed.csrf):
        return "this form is out of date (its session token does not match); reload the page"
    return None


@router.get("/sign-in")
async def sign_in_page(request: Request, next: str = "/") -> Response:
    signed = await signed_in_async(request)
    if signed is not None:
        return redirect(local_path(next))
    return page("sign_in.html", next=local_path(next), error=None, signed=None)


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    form = await read_form(request)
    target = local_path(form.get("next"))
    if not same_origin(request):
        return problem_page(403, "Sign-in refused", refused_form(request, None, form) or "")
    token = form.get("token", "").strip()
    services = services_of(request)
    found = await run_in_threadpool(services.identities.resolve, token) if token else None
    error = None
    if found is None:
        error = "This token is not known: paste a token `flexai admin token create` printed."
    elif isinstance(found, Revoked):
        error = f"This token was revoked at {found.revoked_at}: ask an admin for a new one."
    elif found.user is None:
        error = (f"This is node {found.node}'s token: sign in with a user's token "
                 "(the one `flexai login` uses).")  # fmt: skip
    if error is not None or not isinstance(found, Caller):
        return page("sign_in.html", 401, next=target, error=error, signed=None)
    session_id = await run_in_threadpool(services.sessions.open, found)
    response = redirect(target)
    response.set_cookie(
        SESSION_COOKIE, session_id, max_age=int(services.sessions.lifetime_s), path="/",
        httponly=True, samesite="strict", secure=request.url.scheme == "https",
    )  # fmt: skip
    return response


@router.post("/sign-out")
async def sign_out(request: Request) -> Response:
    form = await read_form(request)
    signed = await signed_in_async(request)
    refusal = refused_form(request, signed, form)
    if refusal is not None and signed is not None:
        return problem_page(403, "Sign-out refused", refusal, signed)
    if signed is not None:
        await run_in_threadpool(services_of(request).sessions.end, signed.session_id)
    response = redirect("/sign-in")
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")  # fmt: skip
    return response
