"""The web console's pages in-process (each store): who sees which job, the jobs page's pages
and filters, what a job page shows (escaped, under a strict Content-Security-Policy), time
travel, the nodes page, and the live streams."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from api.console.streams import REASONS_S
from tests.console import Site, console_site, server_events

HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)>"


@pytest.fixture
def site(database_url: str, tmp_path: Path) -> Iterator[Site]:
    with console_site(database_url, tmp_path / "data") as opened:
        yield opened


def running(site: Site, job_id: str, node: str = "gpu-1") -> str:
    """Place the job on ``node`` (registered with 4 accelerators) and start it there."""
    jobs = site.services.jobs
    node_id, _ = jobs.register_node(node, accels=4, accel_type="H100")
    jobs.begin_scheduling(UUID(job_id))
    jobs.assign(UUID(job_id), node_id, node)
    jobs.report(UUID(job_id), node_id, {"node_id": node_id, "type": "built", "commit": "c0ffee"})
    site.services.state.heartbeat(node_id)
    site.services.projector.catch_up()
    return node_id


class Markup(HTMLParser):
    """What of a page could run script or set style inline."""

    def __init__(self) -> None:
        super().__init__()
        self.inline: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {name for name, _ in attrs}
        if tag == "script" and "src" not in names or tag == "style":
            self.inline.append(tag)
        self.inline += [f"{tag} {name}" for name in names
                        if name.startswith("on") or name == "style"]  # fmt: skip
        if any(value and value.strip().lower().startswith("javascript:") for _, value in attrs):
            self.inline.append(f"{tag} javascript: URL")


def inline_code(html: str) -> list[str]:
    markup = Markup()
    markup.feed(html)
    return markup.inline


def test_another_users_job_is_a_404_page_on_every_console_route(site: Site) -> None:
    alice, bob = site.person("alice"), site.person("bob")
    alice.submit("private")
    assert alice.client.get("/jobs/private").status_code == 200
    for path in ("/jobs/private", "/jobs/private?owner=alice", "/jobs/private/live"):
        answer = bob.client.get(path)
        assert answer.status_code == 404, path
    page = bob.client.get("/jobs/private")
    assert "Job not found" in page.text and "alice" not in page.text
    stop = bob.post("/jobs/private/stop", {"csrf": bob.csrf(), "owner": "alice"})
    assert stop.status_code == 404
    assert "private" not in bob.client.get("/").text
    assert bob.client.get("/v1/jobs/private/logs").status_code == 404
    assert alice.client.get("/v1/jobs/private", headers=alice.bearer).json()["status"] == "pending"


def test_an_admin_sees_everyones_jobs_with_their_owner_and_filters_by_owner(site: Site) -> None:
    alice, bob = site.person("alice"), site.person("bob")
    root = site.person("root", admin=True)
    alice.submit("alices-job")
    bob.submit("bobs-job")
    everyone = root.client.get("/").text
    assert "Owner</th>" in everyone and "alices-job" in everyone and "bobs-job" in everyone
    assert 'href="/jobs/bobs-job?owner=bob"' in everyone
    only_bob = root.client.get("/?owner=bob").text
    assert "bobs-job" in only_bob and "alices-job" not in only_bob
    assert root.client.get("/jobs/bobs-job?owner=bob").status_code == 200
    assert "Owner</th>" not in alice.client.get("/").text
    assert "bobs-job" not in alice.client.get("/?owner=bob").text


def test_the_jobs_page_pages_newest_first_and_filters_by_status_and_name_prefix(
    site: Site,
) -> None:
    alice = site.person("alice")
    for index in range(7):
        alice.submit(f"run-{index:02d}")
    alice.submit("other-job")
    alice.post("/jobs/run-03/stop", {"csrf": alice.csrf()})
    first = alice.client.get("/?name=run-&limit=3").text
    assert re.findall(r">(run-\d\d)</a>", first) == ["run-06", "run-05", "run-04"]
    older = re.search(r'rel="next" href="([^"]+)"', first)
    assert older is not None
    second = alice.client.get(older.group(1).replace("&amp;", "&")).text
    assert re.findall(r">(run-\d\d)</a>", second) == ["run-03", "run-02", "run-01"]
    stopped = alice.client.get("/?status=stopped").text
    assert re.findall(r">([a-z]+-[a-z0-9]+)</a>", stopped) == ["run-03"]
    assert "other-job" not in first + second
    assert "out of date" in alice.client.get("/?cursor=forged").text


def test_a_job_page_shows_its_spec_by_name_and_escapes_whatever_the_job_holds(
    site: Site,
) -> None:
    alice = site.person("alice")
    site.services.secrets.create("alice", "hf-token", "the-secret-value-123")
    job = alice.submit("shown", entry_point=["train.py", HOSTILE], repository_revision=HOSTILE,
                       env={"LEARNING_RATE": "0.01-value"}, secrets={"HF_TOKEN": "hf-token"})
    node_id = running(site, job["id"])
    site.services.jobs.report(UUID(job["id"]), node_id, {
        "node_id": node_id, "type": "failed", "code": "entry_point_failed", "message": HOSTILE})
    site.services.projector.catch_up()
    page = alice.client.get("/jobs/shown")
    html = page.text
    assert page.status_code == 200 and HOSTILE not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "LEARNING_RATE" in html and "0.01-value" not in html
    assert "HF_TOKEN from secret hf-token" in html and "the-secret-value-123" not in html
    assert inline_code(html) == []
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe" not in policy
    assert "style-src 'self'" in policy and "frame-ancestors 'none'" in policy


@pytest.mark.parametrize("path", ["/", "/nodes", "/sign-in", "/jobs/ghost"])
def test_every_page_has_the_strict_policy_and_no_inline_script_or_style(
    site: Site, path: str
) -> None:
    alice = site.person("alice")
    page = alice.client.get(path)
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    assert page.headers["x-content-type-options"] == "nosniff"
    assert inline_code(page.text) == []


def test_the_log_stream_sends_lines_as_text_and_ends_with_the_last_one(site: Site) -> None:
    alice = site.person("alice")
    job = alice.submit("talker")
    node_id = running(site, job["id"])
    site.services.artifacts.append_log(job["id"], 0, f"step 1\n{HOSTILE}\n".encode())
    site.services.jobs.report(UUID(job["id"]), node_id,
                              {"node_id": node_id, "type": "exited", "exit_code": 0})  # fmt: skip
    site.services.projector.catch_up()
    with alice.client.stream("GET", "/jobs/talker/live?since=1") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = server_events(stream.iter_lines(), until="end")
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "job" and kinds[-1] == "end" and "log" in kinds
    text = "".join(json.loads(data) for kind, data in events if kind == "log")
    assert text == f"step 1\n{HOSTILE}\n"
    job_event = json.loads(events[0][1])
    assert job_event["status"] == "succeeded" and not job_event["can_stop"]
    assert [entry["event"] for entry in job_event["history"]][-1] == "Succeeded"
    assert job_event["history"][0]["version"] == 2


def test_a_reconnecting_log_stream_goes_on_from_the_last_byte_it_had(site: Site) -> None:
    alice = site.person("alice")
    job = alice.submit("resumer")
    node_id = running(site, job["id"])
    site.services.artifacts.append_log(job["id"], 0, "first line\nsecond λ line\n".encode())
    site.services.jobs.request_stop(UUID(job["id"]), by={"kind": "user", "id": "alice"})
    site.services.jobs.report(UUID(job["id"]), node_id, {"node_id": node_id, "type": "stopped"})
    site.services.projector.catch_up()
    with alice.client.stream("GET", "/jobs/resumer/live",
                             headers={"Last-Event-ID": "11"}) as stream:  # fmt: skip
        events = server_events(stream.iter_lines(), until="end")
    assert "".join(json.loads(d) for k, d in events if k == "log") == "second λ line\n"


def test_time_travel_shows_the_job_as_it_was_and_marks_the_version_on_the_timeline(
    site: Site,
) -> None:
    alice = site.person("alice")
    job = alice.submit("traveller")
    running(site, job["id"])
    now = alice.client.get("/jobs/traveller").text
    assert re.findall(r'data-version="(\d+)"', now) == ["1", "2", "3", "4", "5"]
    past = alice.client.get("/jobs/traveller?version=2").text
    assert re.search(r'data-field="past-status">scheduling<', past)
    assert re.search(r'<li data-version="2" aria-current="step"', past)
    assert 'data-field="status">in progress<' in past
    assert "has no version 9" in alice.client.get("/jobs/traveller?version=9").text


def test_the_nodes_page_shows_who_holds_each_accelerator_and_names_only_visible_jobs(
    site: Site,
) -> None:
    alice, bob = site.person("alice"), site.person("bob")
    root = site.person("root", admin=True)
    job = alice.submit("big-run", accels=3)
    running(site, job["id"])
    site.services.jobs.register_node("gpu-2", accels=2, accel_type="A100", isolation={
        "level": "sandbox", "detail": "each job in a sandbox of its own", "limits": True})
    site.services.projector.catch_up()
    mine = alice.client.get("/nodes").text
    assert '<td title="each job in a sandbox of its own">sandbox</td>' in mine  # gpu-2's
    assert '<td title="an agent from before isolation levels">unknown</td>' in mine  # gpu-1's
    assert re.search(r">big-run</a>: accelerators 0, 1, 2", mine)
    row = re.search(r"<td>gpu-1</td>.*?</tr>", mine, re.S)
    assert row is not None and '<td class="num">1</td>' in row.group(0)
    lost = re.search(r"<td>gpu-2</td>.*?</tr>", mine, re.S)
    assert lost is not None and ">lost<" in lost.group(0)
    theirs = bob.client.get("/nodes").text
    assert "big-run" not in theirs and "another user's job: accelerators 0, 1, 2" in theirs
    assert ">big-run</a> (alice)" in root.client.get("/nodes").text


def test_the_jobs_stream_sends_the_rows_that_changed_and_only_the_callers(site: Site) -> None:
    alice, bob = site.person("alice"), site.person("bob")
    mine = alice.submit("watched")
    theirs = bob.submit("not-yours")
    alice.post("/jobs/watched/stop", {"csrf": alice.csrf()})
    with alice.client.stream("GET", f"/live/jobs?ids={mine['id']},{theirs['id']}") as stream:
        events = server_events(stream.iter_lines(), until="jobs")
    rows: list[dict[str, Any]] = json.loads(events[-1][1])
    assert [(row["id"], row["status"]) for row in rows] == [(mine["id"], "stopped")]


def test_the_jobs_stream_sends_a_waiting_jobs_new_reason_as_this_servers_scheduler_writes_it(
    site: Site,
) -> None:
    alice = site.person("alice")
    job = alice.submit("waiting")
    site.services.jobs.begin_scheduling(UUID(job["id"]))
    site.services.projector.catch_up()
    site.services.waits.replace({job["id"]: {"reason": "waits for a node to register"}})
    with alice.client.stream("GET", f"/live/jobs?ids={job['id']}") as stream:
        lines = stream.iter_lines()
        first = json.loads(server_events(lines, until="jobs")[-1][1])
        assert [row["reason"] for row in first] == ["waits for a node to register"]
        changed = time.monotonic()
        site.services.waits.replace({job["id"]: {"reason": "waits for 1 accelerator"}})
        again = json.loads(server_events(lines, until="jobs")[-1][1])
    assert [row["reason"] for row in again] == ["waits for 1 accelerator"]
    assert time.monotonic() - changed < REASONS_S - 1  # not at the next poll: at once
