"""Dependencies for the routes, as ``Annotated`` aliases.

They are coroutines: FastAPI runs a plain function dependency in a worker thread, a hop (and a
wait for a free thread) per dependency per request. Whatever may block runs in a thread here.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request, Response
from starlette.concurrency import run_in_threadpool

from api.problems import Problem, unauthorized, views_halted
from api.services import Services
from projections.projector import ProjectionHalted, ProjectionTimeout


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


POSITION_HEADER = "X-Flexai-Position"
"""On a write's answer: the ledger position of what it recorded."""
MIN_POSITION_HEADER = "X-Flexai-Min-Position"
"""On a read: answer only from views that hold this ledger position (read your writes, made
through any replica)."""
READ_AFTER_WAIT_S = 5.0


async def read_after(request: Request, services: ServicesDep) -> None:
    """Hold a read until the views reach the position the client asks for (a write it made,
    maybe through another replica, answered with it): no fixed sleep, no stale answer."""
    value = request.headers.get(MIN_POSITION_HEADER)
    if value is None:
        return
    try:
        position = int(value)
    except ValueError:
        position = -1
    if not 0 <= position < 2**63:
        raise Problem(
            422, "invalid-request", "Invalid position",
            f"{MIN_POSITION_HEADER} must be a ledger position (a whole number from 0), as a "
            f"write's {POSITION_HEADER} answer header gave it", field=MIN_POSITION_HEADER,
        )  # fmt: skip
    if position == 0:
        return
    try:  # in a worker thread: even reading where the views stand is a query
        await run_in_threadpool(services.projector.wait, position, READ_AFTER_WAIT_S)
    except ProjectionTimeout:
        raise Problem(
            503, "views-behind", "Views behind",
            f"this server's views did not reach ledger position {position} within "
            f"{READ_AFTER_WAIT_S:g} s; try again", headers={"Retry-After": "1"},
        ) from None  # fmt: skip


ReadAfter = Depends(read_after)


def tell_position(response: Response, position: int | None) -> None:
    """Put a write's ledger position on its answer (nothing recorded: none)."""
    if position is not None:
        response.headers[POSITION_HEADER] = str(position)
