"""What `/metrics` counts as it happens: requests per route, their latency, scheduler rounds.

Each server's figures live in a registry of its own (one per app, so tests and several apps in
one process never mix them). :class:`RequestMetrics` is a pure ASGI middleware: the route is
the path template the router matched (``/v1/jobs/{name}``), never the raw path, so a metric
never holds a job's name and their number stays bounded.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.http.route_templates import RouteTemplates

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 30.0)
UNMATCHED = "unmatched"


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "flexai_http_requests", "HTTP requests answered, by method, route and status",
            ("method", "route", "status"), registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "flexai_http_request_duration_seconds",
            "time from a request's arrival to the end of its answer (streams: their whole life)",
            ("method", "route"), buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.scheduler_rounds = Histogram(
            "flexai_scheduler_round_seconds", "time one scheduler round takes (leader only)",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip


class RequestMetrics:
    """Counts and times every HTTP request by the route it matched."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics, templates: RouteTemplates) -> None:
        self.app = app
        self.metrics = metrics
        self.templates = templates

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            method = str(scope.get("method", ""))
            route = getattr(scope.get("route"), "path", None) or self.templates.template(
                method, str(scope.get("path", ""))
            ) or UNMATCHED  # answered before the router ran (a 401 or 413 of the body limits)
            self.metrics.requests.labels(method, route, str(status)).inc()
            self.metrics.latency.labels(method, route).observe(time.perf_counter() - started)

