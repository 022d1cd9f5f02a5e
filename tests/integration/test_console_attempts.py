"""A retried job's page in-process (each store): it shows and follows the job's current
attempt, as `flexai training logs --follow` does, lets its user pick an earlier one, and a
page that followed an attempt hears when the job runs again."""

from __future__ import annotations

import html
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from common.attempts import attempt_key
from tests.console import Person, Site, console_site, server_events
from tests.support import wait_until

FIRST_LOG = "attempt 1: step 1\nattempt 1: killed\n"
SECOND_LOG = "attempt 2: resumed\n"


@pytest.fixture
def site(database_url: str, tmp_path: Path) -> Iterator[Site]:
    with console_site(database_url, tmp_path / "data") as opened:
        yield opened


def run(site: Site, job_id: str, node_id: str) -> None:
    """The job, waiting to be scheduled, runs on ``node_id``."""
    jobs = site.services.jobs
    jobs.assign(UUID(job_id), node_id, "gpu-1")
    jobs.report(UUID(job_id), node_id, {"node_id": node_id, "type": "built", "commit": "c0ffee"})
    site.services.projector.catch_up()


def report(site: Site, job_id: str, node_id: str, exit_code: int) -> None:
    exited = {"node_id": node_id, "type": "exited", "exit_code": exit_code}
    site.services.jobs.report(UUID(job_id), node_id, exited)
    site.services.projector.catch_up()


def retrying(site: Site, alice: Person) -> tuple[str, str]:
    """Alice's job ``trainer``, retried on exit code 137, running its first attempt (its log
    written); its id and its node's."""
    job = alice.submit("trainer", max_retries=1, retry_on_exit_codes=[137])
    node_id, _ = site.services.jobs.register_node("gpu-1", accels=4, accel_type="H100")
    site.services.state.heartbeat(node_id)
    site.services.jobs.begin_scheduling(UUID(job["id"]))
    run(site, job["id"], node_id)
    site.services.artifacts.append_log(job["id"], 0, FIRST_LOG.encode())
    return job["id"], node_id


def retried(site: Site, job_id: str, node_id: str) -> None:
    """The first attempt exits with 137: the job runs again, and its second attempt logs."""
    report(site, job_id, node_id, 137)
    run(site, job_id, node_id)
    site.services.artifacts.append_log(attempt_key(job_id, 2), 0, SECOND_LOG.encode())


def followed(person: Person, path: str) -> tuple[str, dict[str, Any]]:
    """The log text a page's stream sends, and its ``end``."""
    with person.client.stream("GET", path) as stream:
        events = server_events(stream.iter_lines(), until="end")
    text = "".join(json.loads(data) for kind, data in events if kind == "log")
    assert events[-1][0] == "end", events
    return text, json.loads(events[-1][1])


def live_url(page: str) -> str:
    start = page.index('data-live="') + len('data-live="')
    return html.unescape(page[start:page.index('"', start)])


def test_a_retried_jobs_page_shows_its_current_attempt_and_links_to_each(site: Site) -> None:
    alice = site.person("alice")
    job_id, node_id = retrying(site, alice)
    retried(site, job_id, node_id)
    report(site, job_id, node_id, 0)

    page = alice.client.get("/jobs/trainer").text
    assert "Logs, attempt 2" in page and "attempt 2 (current)" in page
    assert 'href="/jobs/trainer?attempt=1#logs-title"' in page
    assert "attempt=2" in live_url(page) and "data-pinned" not in page
    assert followed(alice, live_url(page)) == (SECOND_LOG, {
        "offset": len(SECOND_LOG), "attempt": 2, "current": 2})  # fmt: skip

    picked = alice.client.get("/jobs/trainer?attempt=1").text
    assert "Logs, attempt 1" in picked and "data-pinned" in picked
    assert 'download="trainer-node0.log"' in picked
    assert followed(alice, live_url(picked)) == (FIRST_LOG, {
        "offset": len(FIRST_LOG), "attempt": 1, "current": 2})  # fmt: skip
    assert followed(alice, "/jobs/trainer/live?attempt=9")[0] == SECOND_LOG  # the last it had
    assert 'download="trainer-node0.attempt-2.log"' in page


def test_a_page_following_the_current_attempt_hears_when_the_job_runs_again(site: Site) -> None:
    alice = site.person("alice")
    job_id, node_id = retrying(site, alice)
    page = alice.client.get("/jobs/trainer").text
    assert "attempt=1" in live_url(page)
    heard: list[tuple[str, dict[str, Any]]] = []
    follower = threading.Thread(target=lambda: heard.append(followed(alice, live_url(page))))
    follower.start()
    wait_until(lambda: site.services.log_followers.count == 1, timeout=10)

    retried(site, job_id, node_id)  # its second attempt's lines are not this stream's
    follower.join(timeout=20)

    assert heard == [(FIRST_LOG, {"offset": len(FIRST_LOG), "attempt": 1, "current": 2})]
    assert followed(alice, "/jobs/trainer/live?attempt=1")[1]["current"] == 2
