"""The console on the API's app: its routes, its static files, and the projector listener that
wakes its live pages."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from api.console import auth, job_page, pages, streams
from api.console.chart import LossHistories
from api.console.live import JobWatch
from api.services import Services

STATIC = Path(__file__).resolve().parent / "static"


@dataclass
class Console:
    """The console's own state in one server process."""

    watch: JobWatch = field(default_factory=JobWatch)
    histories: LossHistories = field(default_factory=LossHistories)


def install(app: FastAPI, services: Services) -> Console:
    """Serve the console at ``/`` beside the API (same process, port, users and tokens)."""
    console = Console()
    app.state.console = console
    services.projector.listeners.append(console.watch.on_events)
    for router in (auth.router, pages.router, job_page.router, streams.router):
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="console-static")
    return console
