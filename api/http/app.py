"""The FastAPI application over the services."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from fastapi import FastAPI

from api.console.site import install as install_console
from api.debug.orphans import OrphanSweep, close_at_start
from api.http import problems
from api.http.deps import ReadAfter
from api.http.limits import BodyLimits
from api.http.metrics import RequestMetrics
from api.http.request_text import CleanRequestText
from api.http.route_templates import RouteTemplates
from api.http.routes import (
    admin,
    agent,
    audit,
    datasets,
    debug,
    health,
    identity,
    jobs,
    nodes,
    runtimes,
    secrets,
    uploads,
)
from api.http.strict_transport import StrictTransport
from api.scheduling.scheduler import Scheduler
from api.services import Services
from projections.projector import ProjectionHalted


def create_app(services: Services, *, background: bool = True) -> FastAPI:
    """Routes, problem handlers, and (with ``background``) the projector and scheduler."""
    sweep = OrphanSweep(services.orphans())  # on the leader, each round (it keeps its pace)
    scheduler = Scheduler(services.scheduling(), chores=[sweep.run_if_due])

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        with suppress(ProjectionHalted):  # the server starts anyway: health and metrics say why
            services.projector.catch_up()
        close_at_start(services.orphans())  # the debug sessions of servers killed meanwhile
        if background:
            services.projector.start(services.settings.projection_interval_s)
            scheduler.start()
        try:
            yield
        finally:
            end_long_requests(services)
            await debug.settle()
            scheduler.stop()
            services.projector.stop()

    app = FastAPI(
        title="flexai control plane",
        version="0.1.0",
        summary="Training jobs from a git revision, with an append-only job ledger.",
        lifespan=lifespan,
        responses=problems.OPENAPI_RESPONSES,
    )
    app.state.services = services
    app.state.scheduler = scheduler
    problems.install(app)
    reading = (jobs.router, nodes.router, datasets.router)  # the position a read waits for
    routers = (jobs.router, agent.router, uploads.router, debug.router, debug.agent_router,
               audit.router, admin.router, identity.router, nodes.router, datasets.router,
               secrets.router, runtimes.router, health.router)  # fmt: skip
    for router in routers:
        app.include_router(router, dependencies=[ReadAfter] if router in reading else None)
    app.state.route_templates = templates = RouteTemplates(routers)
    install_console(app, services)  # the web console at /
    app.add_middleware(BodyLimits, limits=services.settings.limits,
                       identities=services.identities)  # fmt: skip
    app.add_middleware(StrictTransport)  # HSTS over https
    app.add_middleware(CleanRequestText)  # before the token: a path no route could hold
    app.add_middleware(RequestMetrics, metrics=services.metrics,  # outermost: times it all
                       templates=templates)  # fmt: skip
    return app


def end_long_requests(services: Services) -> None:
    """The server stops (on its event loop): every `logs --follow` stream, agents' long poll
    and debug session ends now, and their end is recorded (:func:`debug.settle` waits)."""
    services.log_followers.close_all()
    services.assignment_waiters.close_all()
    debug.close_all(services)
