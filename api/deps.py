"""Dependencies for the routes, as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api.problems import Problem
from api.services import Services


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def current_user(request: Request, services: ServicesDep) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    user_id = services.state.user_for(token.strip()) if scheme.lower() == "bearer" else None
    if user_id is None:
        raise Problem(
            401, "unauthorized", "Unauthorized",
            "missing or unknown API token: send `Authorization: Bearer <token>` "
            "(`flexai server` printed the admin token on first start; set FLEXAI_TOKEN)",
        )  # fmt: skip
    return user_id


CurrentUser = Annotated[str, Depends(current_user)]
