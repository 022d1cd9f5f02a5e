"""PostgreSQL away: every request that needs it is answered 503 ``database-unavailable`` within
2 s (never 500, never a hang), and the server recovers by itself once PostgreSQL is back.

The outage is real: the server reaches PostgreSQL through a TCP proxy that the tests cut (every
open connection dropped, new ones refused or left unanswered) and restore.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from eventsourcing import persistence
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.identity.identities import ensure_admin_token
from api.services import Services, build_services
from api.settings import Settings
from domain.actors import user
from domain.application import TrainingJobs
from domain.errors import NameTaken
from ledger.database import DEFAULT_WAIT_S, open_database
from ledger.pool import RETRY_MAX_S, DatabaseUnavailable
from tests.integration.conftest import job_spec
from tests.integration.test_api_problems import SPEC, assert_problem
from tests.support import node_headers
from tests.tcp_proxy import Outage, TcpProxy, tcp_proxy

DUE_S = DEFAULT_WAIT_S + 1.0
"""The 503 is due after one wait for a connection (1.5 s, where ten retries would take 15 s),
with a second of slack for a loaded machine (a full suite once answered after 2.07 s)."""
RECOVERY_S = 8.0
AGENT_ID = "agent-outage-0123456789"


@dataclasses.dataclass
class Server:
    client: TestClient
    services: Services
    proxy: TcpProxy
    headers: dict[str, str]
    agent_headers: dict[str, str]
    """Node gpu-1's agent's: the agent routes take its node token, not a user's."""
    node_id: str = ""

    def request(self, method: str, path: str, body: Any = None) -> tuple[Any, float]:
        """The response and how long it took (an agent route's with the node's token)."""
        headers = self.agent_headers if path.startswith("/v1/agent/") else self.headers
        started = time.monotonic()
        response = self.client.request(method, path, headers=headers, json=body)
        return response, time.monotonic() - started

    def needs_the_database(self, name: str) -> list[tuple[str, str, Any]]:
        """A read, a write through the ledger, and an agent's heartbeat."""
        return [
            ("GET", "/v1/jobs", None),
            ("POST", "/v1/jobs", {**SPEC, "name": name}),
            ("POST", f"/v1/agent/nodes/{self.node_id}/heartbeat", {}),
        ]

    def register_node(self) -> None:
        body = {"name": "gpu-1", "accels": 1, "accel_type": "cpu", "agent_id": AGENT_ID}
        response = self.client.post("/v1/agent/nodes", headers=self.agent_headers, json=body)
        assert response.status_code == 200, response.text
        self.node_id = response.json()["node_id"]


def within(seconds: float, attempt: Callable[[], bool]) -> None:
    """Retries ``attempt`` until it holds; fails after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not attempt():
        assert time.monotonic() < deadline, f"not within {seconds} s"
        time.sleep(0.1)


@pytest.fixture
def direct_url(postgres_url: str) -> str:
    return postgres_url


@pytest.fixture
def proxy(direct_url: str) -> Iterator[TcpProxy]:
    with tcp_proxy(direct_url) as proxy:
        yield proxy


@pytest.fixture
def start(
    proxy: TcpProxy, direct_url: str, tmp_path: Path
) -> Iterator[Callable[..., Server]]:
    """Starts the API in-process on the database behind the proxy (the ledger only, with
    ``ledger_only``: the views then reach PostgreSQL directly)."""
    opened: list[tuple[TestClient, Services]] = []
    ledgers: list[TrainingJobs] = []

    def start_one(*, background: bool = True, ledger_only: bool = False,
                  raise_server_exceptions: bool = False) -> Server:  # fmt: skip
        proxied = Settings(data_dir=tmp_path / "data", database_url=proxy.proxied(direct_url))
        if not ledger_only:
            services = build_services(proxied)
        else:  # the views' projector keeps reading the ledger directly
            services = build_services(proxied.model_copy(update={"database_url": direct_url}))
            ledgers.append(services.jobs)
            services = dataclasses.replace(
                services, jobs=TrainingJobs(env=proxied.event_store_env())
            )
        token, _ = ensure_admin_token(services.identities, proxied.data_dir)
        client = TestClient(create_app(services, background=background),
                            raise_server_exceptions=raise_server_exceptions)  # fmt: skip
        client.__enter__()
        opened.append((client, services))
        headers = {"Authorization": f"Bearer {token}"}
        agent_headers = node_headers(services, "gpu-1", agent_id=AGENT_ID)
        return Server(client, services, proxy, headers, agent_headers)

    yield start_one
    for client, services in opened:
        client.__exit__(None, None, None)
        services.close()
    for ledger in ledgers:
        ledger.close()


def assert_unavailable_in_time(response: Any, elapsed: float) -> None:
    assert_problem(response, 503, "database-unavailable")
    assert response.headers["Retry-After"].isdigit()
    assert elapsed < DUE_S, f"answered after {elapsed:.2f} s"


@pytest.mark.parametrize("outage", ["refuse", "blackhole"])
def test_with_postgres_away_reads_writes_and_heartbeats_are_503_after_one_wait_then_recover(
    start: Callable[..., Server], direct_url: str, outage: Outage
) -> None:
    server = start()
    server.register_node()
    assert server.request("POST", "/v1/jobs", {**SPEC, "name": "before"})[0].status_code == 201

    server.proxy.cut(outage)
    replica = TrainingJobs(env=Settings(data_dir=Path(), database_url=direct_url).event_store_env())
    try:  # another replica, still connected, records a job meanwhile
        replica.submit("admin", "elsewhere", job_spec(), by=user("admin"))
    finally:
        replica.close()
    for method, path, body in server.needs_the_database("during"):
        response, elapsed = server.request(method, path, body)
        assert_unavailable_in_time(response, elapsed)

    server.proxy.restore()
    within(RECOVERY_S, lambda: server.request("GET", "/v1/jobs")[0].status_code == 200)
    for method, path, body in server.needs_the_database("after"):
        response, _ = server.request(method, path, body)
        assert response.status_code in (200, 201), response.text

    def listed() -> set[str]:
        return {job["name"] for job in server.request("GET", "/v1/jobs")[0].json()["jobs"]}

    within(RECOVERY_S, lambda: "elsewhere" in listed())  # the views' catch-up resumed
    assert listed() == {"before", "elsewhere", "after"}


def test_a_write_whose_ledger_is_away_is_503_after_one_wait_not_ten_retries(
    start: Callable[..., Server],
) -> None:
    server = start(ledger_only=True)
    server.proxy.cut("refuse")
    response, elapsed = server.request("POST", "/v1/jobs", {**SPEC, "name": "during"})
    assert_unavailable_in_time(response, elapsed)

    server.proxy.restore()
    within(RECOVERY_S, lambda: server.request("POST", "/v1/jobs", {**SPEC, "name": "after"})[0]
           .status_code == 201)  # fmt: skip


def test_a_ledger_command_waits_for_postgres_as_long_as_the_settings_say(
    proxy: TcpProxy, direct_url: str, tmp_path: Path
) -> None:
    settings = Settings(
        data_dir=tmp_path, database_url=proxy.proxied(direct_url), database_wait_s=0.5
    )
    jobs = TrainingJobs(env=settings.event_store_env())
    try:
        proxy.cut("blackhole")
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable, match="within 0.5 s"):
            jobs.submit("admin", "late", job_spec(), by=user("admin"))
        assert time.monotonic() - started < 1.2
    finally:
        jobs.close()


def test_after_a_restart_the_first_requests_succeed_on_fresh_connections(
    start: Callable[..., Server],
) -> None:
    server = start()
    server.register_node()
    for name in ("one", "two", "three"):
        assert server.request("POST", "/v1/jobs", {**SPEC, "name": name})[0].status_code == 201

    server.proxy.cut("refuse")  # every pooled connection is closed by the "server"
    server.proxy.restore()
    for method, path, body in server.needs_the_database("four"):
        response, elapsed = server.request(method, path, body)
        assert response.status_code in (200, 201), response.text
        assert elapsed < DUE_S


def test_while_postgres_is_away_a_request_logs_one_line_and_no_traceback(
    start: Callable[..., Server], caplog: pytest.LogCaptureFixture
) -> None:
    # An error that escapes to the server is re-raised here, as uvicorn would log its trace.
    server = start(background=False, raise_server_exceptions=True)
    server.register_node()
    server.proxy.cut("refuse")
    with caplog.at_level(logging.INFO):
        for method, path, body in server.needs_the_database("during"):
            response, _ = server.request(method, path, body)
            assert response.status_code == 503
    records = [record for record in caplog.records if record.name.startswith("api")]
    assert len(records) <= 3  # one line per request at most
    assert all(record.levelno == logging.WARNING and not record.exc_info for record in records)


def test_opening_a_silent_postgres_fails_within_the_connect_timeout_saying_so(
    proxy: TcpProxy, direct_url: str
) -> None:
    proxy.cut("blackhole")
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError, match="timeout"):
        open_database(proxy.proxied(direct_url), connect_timeout_s=2)
    assert time.monotonic() - started < 4


def test_a_postgres_restart_under_load_loses_nothing(start: Callable[..., Server]) -> None:
    """Four clients submit while PostgreSQL goes away twice and comes back: every answer is a
    201 or a 503 problem (never a 500), every job answered 201 exists once, and the server
    recovers by itself."""
    server = start()
    created: list[str] = []
    other: list[tuple[str, int, str]] = []
    names = iter(range(10**6))
    lock = threading.Lock()
    done = threading.Event()

    def client() -> None:
        while not done.is_set():
            with lock:
                name = f"load-{next(names)}"
            response, _ = server.request("POST", "/v1/jobs", {**SPEC, "name": name})
            with lock:
                if response.status_code == 201:
                    created.append(name)
                else:
                    other.append((name, response.status_code, response.text[:200]))
            if response.status_code == 503:
                time.sleep(0.05)

    clients = [threading.Thread(target=client) for _ in range(4)]
    for thread in clients:
        thread.start()
    for outage in ("refuse", "blackhole"):
        time.sleep(1.0)
        server.proxy.cut(outage)
        time.sleep(3.0)  # past a request's wait for a connection (1.5 s): some are refused
        server.proxy.restore()
    with lock:
        before_the_end = len(created)
    # The clients go on until 20 more were answered 201, all of them since PostgreSQL is back.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(created) < before_the_end + 20:
        time.sleep(0.1)
    done.set()
    for thread in clients:
        thread.join(timeout=30)
    assert len(created) >= before_the_end + 20, "the server did not take submissions again"
    assert all(code == 503 and "database-unavailable" in text for _, code, text in other), other
    assert other, "the outages were not felt"
    for name in created:
        response, _ = server.request("GET", f"/v1/audit/jobs?name={name}")
        assert response.status_code == 200 and len(response.json()["jobs"]) == 1, name
    response, elapsed = server.request("POST", "/v1/jobs", {**SPEC, "name": "after"})
    assert response.status_code == 201 and elapsed < DUE_S


@pytest.mark.parametrize("outage", ["refuse", "blackhole"])
def test_after_a_long_outage_both_pools_find_postgres_within_a_second_of_its_return(
    proxy: TcpProxy, direct_url: str, outage: Outage
) -> None:
    # psycopg_pool's own pace (1, 2, 4 s between attempts) left one pool seconds behind the
    # other: reads answered while writes still said 503.
    views = open_database(proxy.proxied(direct_url))
    jobs = TrainingJobs(env=Settings(data_dir=Path(), database_url=proxy.proxied(direct_url))
                        .event_store_env())  # fmt: skip
    try:
        proxy.cut(outage)
        away_until = time.monotonic() + 4.5  # long enough for the doubling waits to reach 4 s
        while time.monotonic() < away_until:
            with pytest.raises(DatabaseUnavailable):
                jobs.submit("admin", "away", job_spec(), by=user("admin"))
            with pytest.raises(DatabaseUnavailable), views.transaction() as cursor:
                cursor.execute("SELECT 1")
        proxy.restore()
        back = time.monotonic()
        jobs.submit("admin", "back", job_spec(), by=user("admin"))
        with views.transaction() as cursor:
            cursor.execute("SELECT 1")
        assert time.monotonic() - back < RETRY_MAX_S + 0.5
    finally:
        jobs.close()
        views.close()


def test_a_submission_whose_commit_answer_was_lost_is_answered_as_saved_not_as_taken(
    direct_url: str,
) -> None:
    # The connection breaks after PostgreSQL committed and before its answer came: the save is
    # tried again, meets its own events, and is the submission's success (no "name taken").
    jobs = TrainingJobs(env=Settings(data_dir=Path(), database_url=direct_url).event_store_env())
    group_commit = jobs.recorder.group_commit  # type: ignore[attr-defined]
    save, broken = group_commit.save, []

    def answer_lost(events: Any, **kwargs: Any) -> Any:
        saved = save(events, **kwargs)
        if not broken:
            broken.append(saved)
            raise persistence.OperationalError("server closed the connection unexpectedly")
        return saved

    group_commit.save = answer_lost
    try:
        outcome = jobs.submit("admin", "committed-once", job_spec(), by=user("admin"))
        assert broken and outcome.position == max(broken[0])
        assert jobs.job_id_for("admin", "committed-once") == outcome.job_id
        with pytest.raises(NameTaken):  # a real second submission of the name is refused
            jobs.submit("admin", "committed-once", job_spec(), by=user("admin"))
    finally:
        group_commit.save = save
        jobs.close()
