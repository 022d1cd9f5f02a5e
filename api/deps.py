"""Dependencies for the routes, as ``Annotated`` aliases.

They are coroutines: FastAPI runs a plain function dependency in a worker thread, a hop (and a
wait for a free thread) per dependency per request. Whatever may block runs in a thread here.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from api.problems import unauthorized, views_halted
from api.services import Services
from projections.projector import ProjectionHalted


async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def current_user(request: Request, services: ServicesDep) -> str:
    """The token's user; the body limits already checked it for requests with a body."""
    known: str | None = getattr(request.state, "user_id", None)
    if known is not None:
        return known
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    user_id = None
    if scheme.lower() == "bearer":
        token = token.strip()
        user_id = services.state.known_user(token)
        if user_id is None:  # not remembered: a query
            user_id = await run_in_threadpool(services.state.user_for, token)
    if user_id is None:
        raise unauthorized()
    return user_id


CurrentUser = Annotated[str, Depends(current_user)]


async def ledger_writable(services: ServicesDep) -> None:
    """Writes wait while the views are halted: an event recorded now could not be shown, and
    read-your-writes would hang. Nothing is recorded; reads keep answering from the views."""
    halted = services.projector.halted
    if halted is not None:
        raise views_halted(ProjectionHalted(halted))


LedgerWritable = ledger_writable
