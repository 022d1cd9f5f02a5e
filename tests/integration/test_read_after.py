"""Read your writes through any replica: a write answers with its ledger position
(``X-Flexai-Position``), and a read that asks for it (``X-Flexai-Min-Position``) waits until the
views hold it, with no fixed sleep, or says the views are behind."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from api.http import deps
from cli.client.api import ApiClient
from domain.actors import user
from tests.integration import test_time_travel
from tests.integration.test_time_travel import SPEC, Api

api = test_time_travel.api  # the real app on each store


def test_writes_answer_their_position_and_reads_wait_for_it(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = api.client.post("/v1/jobs", headers=api.headers, json={**SPEC, "name": "first"})
    assert created.status_code == 201
    position = int(created.headers["X-Flexai-Position"])
    assert position > 0
    stopped = api.client.post("/v1/jobs/first/stop", headers=api.headers)
    assert int(stopped.headers["X-Flexai-Position"]) > position
    at = {**api.headers, "X-Flexai-Min-Position": str(position)}
    assert api.client.get("/v1/jobs/first", headers=at).status_code == 200

    # Recorded in the ledger, not yet in the views: the read waits for them, no longer.
    answers: list[Any] = []
    with api.services.projector.held():
        spec = {**SPEC, "accels": 1, "nodes": 1}
        outcome = api.services.jobs.submit("admin", "second", spec, by=user("admin"))
        wanted = {**api.headers, "X-Flexai-Min-Position": str(outcome.position)}
        reader = threading.Thread(target=lambda: answers.append(
            (api.client.get("/v1/jobs/second", headers=wanted), time.monotonic())))
        reader.start()
        time.sleep(0.3)
        released = time.monotonic()
    reader.join(timeout=10)
    answer, answered = answers[0]
    assert answer.status_code == 200 and answer.json()["name"] == "second"
    assert answered >= released

    monkeypatch.setattr(deps, "READ_AFTER_WAIT_S", 0.2)
    ahead = {**api.headers, "X-Flexai-Min-Position": str(10**12)}
    behind = api.client.get("/v1/jobs", headers=ahead)
    assert behind.status_code == 503 and behind.json()["type"].endswith("views-behind")
    assert behind.headers["Retry-After"] == "1"
    bad = api.client.get("/v1/jobs", headers={**api.headers, "X-Flexai-Min-Position": "x"})
    assert bad.status_code == 422 and "X-Flexai-Position" in bad.json()["detail"]


def test_the_cli_client_reads_after_its_own_writes() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("X-Flexai-Min-Position"))
        if request.method == "POST":
            return httpx.Response(201, json={"name": "x"}, headers={"X-Flexai-Position": "41"})
        return httpx.Response(200, json={"jobs": [], "count": 0, "next_cursor": None})

    client = ApiClient("http://127.0.0.1:9", "token")
    client._http = httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(
        handler), event_hooks=client._http.event_hooks)  # fmt: skip
    client.list_jobs()
    client._json("POST", "/v1/jobs", json={})
    client.list_jobs()
    assert seen == [None, None, "41"]
    assert client.position == 41
