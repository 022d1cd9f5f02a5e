"""Health and metrics: whether this server can serve, and how far its views have read."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from api.http.deps import ServicesDep
from api.services import Services
from ledger.database import is_unavailable

router = APIRouter(tags=["health"])


def positions(services: Services) -> tuple[int, int]:
    """How far the views have read the ledger, and how far the ledger goes."""
    ledger = services.jobs.recorder.max_notification_id() or 0
    return services.projector.position(), ledger


@router.get("/health")
def health(services: ServicesDep) -> JSONResponse:
    """200 while this server can serve; 503 naming what stops it (views, database)."""
    try:
        views, ledger = positions(services)
    except Exception as error:
        if not is_unavailable(error):
            raise
        reason = " ".join(str(error).split())[:300]
        return _answer(False, database=f"unavailable: {reason}",
                       scheduler=scheduler_role(services))  # fmt: skip
    body: dict[str, Any] = {"projection_position": views, "ledger_position": ledger,
                            "scheduler": scheduler_role(services)}  # fmt: skip
    halted = services.projector.halted
    if halted is not None:
        return _answer(
            False, **body, views_halted=asdict(halted),
            detail=f"the views stopped at an event they cannot apply: {halted.describe()}; "
            "writes are refused until the server restarts with a fix, or with "
            f"--skip-event {halted.position}",
        )  # fmt: skip
    return _answer(True, **body)


def _answer(ok: bool, **body: Any) -> JSONResponse:
    return JSONResponse({"ok": ok, **body}, status_code=200 if ok else 503)


def scheduler_role(services: Services) -> str:
    """``leader`` while this server schedules, ``standby`` while another replica does."""
    return "leader" if services.scheduler_leader.is_set() else "standby"


@router.get("/metrics", response_class=Response)
def metrics(services: ServicesDep) -> Response:
    """Prometheus metrics of this server (text exposition format)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServerCollector(services))
    text = generate_latest(registry) + generate_latest(services.metrics.registry)
    return Response(text, media_type="text/plain; version=0.0.4")


class ServerCollector(Collector):
    """Reads the figures when scraped, so they are never stale."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def collect(self) -> Iterator[GaugeMetricFamily]:
        services = self.services
        halted = services.projector.halted
        yield _gauge(
            "flexai_views_halted",
            "1 while the views are stopped at an event they cannot apply",
            1 if halted is not None else 0,
        )
        yield _gauge(
            "flexai_views_halted_position",
            "the ledger position of the event the views stopped at (0 when running)",
            halted.position if halted is not None else 0,
        )
        try:
            views, ledger = positions(services)
        except Exception as error:
            if not is_unavailable(error):
                raise
            yield _gauge("flexai_database_up", "1 when the database answers", 0)
        else:
            yield _gauge("flexai_database_up", "1 when the database answers", 1)
            yield _gauge("flexai_views_position", "ledger position the views hold", views)
            yield _gauge("flexai_ledger_position", "the last ledger position", ledger)
            yield _gauge("flexai_views_lag_events", "events the views have yet to apply",
                         max(0, ledger - views))  # fmt: skip
            yield _gauge("flexai_views_lag_seconds",
                         "age of the oldest event the views have yet to apply (0: none)",
                         _lag_seconds(services, views, ledger))  # fmt: skip
            jobs = GaugeMetricFamily("flexai_jobs", "live (not deleted) jobs by status",
                                     labels=["status"])  # fmt: skip
            for status, count in services.queries.jobs_per_status().items():
                jobs.add_metric([status], count)
            yield jobs
        yield _gauge(
            "flexai_log_followers", "open `logs --follow` streams", services.log_followers.count
        )
        yield _gauge(
            "flexai_scheduler_leader",
            "1 while this server schedules (holds the scheduler lock), 0 while it stands by",
            1 if services.scheduler_leader.is_set() else 0,
        )


def _lag_seconds(services: Services, views: int, ledger: int) -> float:
    if ledger <= views:
        return 0.0
    pending = services.jobs.recorder.select_notifications(views + 1, 1)
    if not pending:
        return 0.0
    event: Any = services.jobs.mapper.to_domain_event(pending[0])
    recorded: datetime = event.timestamp
    return max(0.0, (datetime.now(UTC) - recorded).total_seconds())


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
