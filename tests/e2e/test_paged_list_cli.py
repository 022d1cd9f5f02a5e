"""`flexai training list` against a real `flexai server` process holding 120 jobs, on SQLite
and on PostgreSQL: one page by default with a line saying how to see more, --limit, --all
through every page, --json, filters, and one-line errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.e2e.harness import Cluster, start_server
from tests.pg import fresh_database

pytestmark = pytest.mark.e2e
SPEC = {"repository_url": "/nowhere", "entry_point": ["train.py"]}
NAMES = [f"job-{index:03d}" for index in range(120)]
NEWEST_FIRST = NAMES[::-1]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Cluster]:  # fmt: skip
    """A server alone (no agent: the jobs only wait), with 120 jobs submitted over HTTP."""
    root = tmp_path_factory.mktemp(f"paged-{request.param}")
    with ExitStack() as stack:
        database_url = None
        if request.param == "postgres":
            database_url = stack.enter_context(fresh_database("flexai_e2e"))
        cluster = start_server(root, database_url, scheduling_patience=3600)
        stack.callback(cluster.stop)
        for name in NAMES:
            response = cluster.api("POST", "/v1/jobs", json={**SPEC, "name": name})
            assert response.status_code == 201, response.text
        yield cluster


def table_names(output: str) -> list[str]:
    """The NAME column of a printed table (header and any note after it left out)."""
    lines = output.splitlines()
    assert lines[0].split()[0] == "NAME", output
    return [line.split()[0] for line in lines[1:] if line.startswith("job-")]


def test_list_shows_the_newest_50_and_says_how_to_see_every_one(server: Cluster) -> None:
    out = server.flexai("training", "list").stdout
    assert table_names(out) == NEWEST_FIRST[:50]
    assert "`flexai training list --all`" in out.splitlines()[-1]


def test_list_limit_shows_that_many(server: Cluster) -> None:
    out = server.flexai("training", "list", "--limit", "7").stdout
    assert table_names(out) == NEWEST_FIRST[:7]
    assert "more" in out.splitlines()[-1]


def test_list_all_pages_through_every_job_once_in_order(server: Cluster) -> None:
    out = server.flexai("training", "list", "--all").stdout
    assert table_names(out) == NEWEST_FIRST
    assert "--all" not in out
    answer = json.loads(server.flexai("training", "list", "--all", "--limit", "50",
                                      "--json").stdout)  # fmt: skip
    assert [job["name"] for job in answer["jobs"]] == NEWEST_FIRST
    assert answer["count"] == 120 and answer["next_cursor"] is None


def test_list_json_prints_one_page_with_its_cursor(server: Cluster) -> None:
    answer = json.loads(server.flexai("training", "list", "--json").stdout)
    assert answer["count"] == 50 and answer["next_cursor"]


def test_list_filters_by_status_and_name_prefix(server: Cluster) -> None:
    out = server.flexai("training", "list", "--status", "pending,scheduling",
                        "--name-prefix", "job-11").stdout  # fmt: skip
    assert table_names(out) == [f"job-{index}" for index in range(119, 109, -1)]
    none = server.flexai("training", "list", "--status", "succeeded").stdout
    assert "No training jobs match" in none


def test_an_unknown_status_or_a_bad_limit_is_one_line_that_says_what_to_do(
    server: Cluster,
) -> None:
    unknown = server.flexai("training", "list", "--status", "running", check=False)
    assert unknown.returncode != 0 and "'in progress'" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1, unknown.stderr
    limit = server.flexai("training", "list", "--limit", "501", check=False)
    assert limit.returncode != 0 and "1 to 500" in limit.stderr
    assert len(limit.stderr.strip().splitlines()) == 1, limit.stderr
