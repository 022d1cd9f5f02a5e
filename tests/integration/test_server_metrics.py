"""`/metrics` on each store: requests per route template (never a job's name), their latency,
jobs per status, the views' lag, scheduler rounds."""

from __future__ import annotations

import re
import time

from prometheus_client.parser import text_string_to_metric_families

from api.scheduling.scheduler import Scheduler
from tests.integration import test_time_travel
from tests.integration.test_time_travel import Api

api = test_time_travel.api  # the real app on each store


def samples(api: Api) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = api.client.get("/metrics").text
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples}  # fmt: skip


def test_metrics_count_routes_jobs_lag_and_rounds(api: Api) -> None:
    api.succeeded("done-1")
    api.submit("waiting-1")
    for _ in range(3):
        assert api.client.get("/v1/jobs/done-1", headers=api.headers).status_code == 200
    assert api.client.get("/v1/jobs/no-such-job", headers=api.headers).status_code == 404
    Scheduler(api.services.scheduling()).run_once()
    figures = samples(api)

    inspect = ("flexai_http_requests_total",
               (("method", "GET"), ("route", "/v1/jobs/{name}"), ("status", "200")))  # fmt: skip
    assert figures[inspect] == 3
    missing = (inspect[0], (("method", "GET"), ("route", "/v1/jobs/{name}"), ("status", "404")))
    assert figures[missing] == 1
    submitted = (inspect[0], (("method", "POST"), ("route", "/v1/jobs"), ("status", "201")))
    assert figures[submitted] == 2
    text = api.client.get("/metrics").text
    assert "done-1" not in text and "no-such-job" not in text  # templates, never names
    count = ("flexai_http_request_duration_seconds_count",
             (("method", "GET"), ("route", "/v1/jobs/{name}")))  # fmt: skip
    assert figures[count] == 4

    assert figures[("flexai_jobs", (("status", "succeeded"),))] == 1
    assert sum(value for (name, _), value in figures.items() if name == "flexai_jobs") == 2
    assert figures[("flexai_views_lag_seconds", ())] == 0
    assert figures[("flexai_views_lag_events", ())] == 0
    assert figures[("flexai_scheduler_round_seconds_count", ())] >= 1
    assert re.search(r"^flexai_scheduler_leader [01]", text, re.MULTILINE)


def test_answers_given_before_routing_count_under_their_route_template(api: Api) -> None:
    """A 401 or 413 of the body limits, and a 405, are answered before the router runs: they
    are counted under the template the path matches all the same, not ``unmatched``."""
    refused = {"Authorization": "Bearer nope"}
    assert api.client.post("/v1/jobs", headers=refused, json={}).status_code == 401
    assert api.client.post("/v1/jobs/job-1/stop", headers=refused).status_code == 401
    huge = b"x" * (api.services.settings.limits.request_bytes + 1)
    assert api.client.post("/v1/jobs", headers=api.headers, content=huge).status_code == 413
    assert api.client.put("/v1/jobs", headers=api.headers).status_code == 405
    assert api.client.get("/v1/nowhere", headers=api.headers).status_code == 404
    figures = samples(api)

    def count(method: str, route: str, status: int) -> float:
        labels = (("method", method), ("route", route), ("status", str(status)))
        return figures.get(("flexai_http_requests_total", labels), 0)

    assert count("POST", "/v1/jobs", 401) == 1
    assert count("POST", "/v1/jobs/{name}/stop", 401) == 1
    assert count("POST", "/v1/jobs", 413) == 1
    assert count("PUT", "/v1/jobs", 405) == 1
    assert count("GET", "unmatched", 404) == 1  # no route: one label, never the path
    assert "job-1" not in api.client.get("/metrics").text


def test_the_lag_in_seconds_is_the_age_of_the_oldest_unapplied_event(api: Api) -> None:
    api.succeeded("first")
    with api.services.projector.held():  # the views cannot move: the next write waits
        api.services.jobs.submit("alice", "unseen", {
            "repository_url": "https://example.com/r.git", "entry_point": ["t.py"],
            "accels": 1, "nodes": 1}, by={"kind": "user", "id": "alice"})  # fmt: skip
        time.sleep(0.3)
        figures = samples_while_held(api)
    assert figures["flexai_views_lag_events"] >= 1
    assert 0.25 <= figures["flexai_views_lag_seconds"] < 30


def samples_while_held(api: Api) -> dict[str, float]:
    """The plain gauges, read while the views are held (a scrape does not catch them up)."""
    text = api.client.get("/metrics").text
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.labels}  # fmt: skip
