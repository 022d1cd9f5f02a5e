"""Dependencies for the routes, as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api.problems import unauthorized, views_halted
from api.services import Services
from projections.projector import ProjectionHalted


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def current_user(request: Request, services: ServicesDep) -> str:
    """The token's user; the body limits already checked it for requests with a body."""
    known: str | None = getattr(request.state, "user_id", None)
    if known is not None:
        return known
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    user_id = services.state.user_for(token.strip()) if scheme.lower() == "bearer" else None
    if user_id is None:
        raise unauthorized()
    return user_id


CurrentUser = Annotated[str, Depends(current_user)]


def ledger_writable(services: ServicesDep) -> None:
    """Writes wait while the views are halted: an event recorded now could not be shown, and
    read-your-writes would hang. Nothing is recorded; reads keep answering from the views."""
    halted = services.projector.halted
    if halted is not None:
        raise views_halted(ProjectionHalted(halted))


LedgerWritable = ledger_writable
