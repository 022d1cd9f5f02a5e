"""`flexai training run --sweep` against a real `flexai server` process, on SQLite and on
PostgreSQL: one job per combination, named NAME-1, NAME-2, ..., each with its values in its
environment as `inspect` shows it; a job that cannot start fails alone and says why; a sweep
over the server's limit for one request goes in several."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.e2e.harness import Cluster, start_server
from tests.pg import fresh_database

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Cluster]:  # fmt: skip
    """A server alone (no agent: the jobs only wait)."""
    root = tmp_path_factory.mktemp(f"sweep-{request.param}")
    with ExitStack() as stack:
        database_url = None
        if request.param == "postgres":
            database_url = stack.enter_context(fresh_database("flexai_e2e"))
        cluster = start_server(root, database_url, scheduling_patience=3600)
        stack.callback(cluster.stop)
        (root / "repo" / ".git").mkdir(parents=True)  # no job of these runs: no commit needed
        yield cluster


def sweep(server: Cluster, name: str, *flags: str, check: bool = True) -> tuple[int, str, str]:
    done = server.flexai("training", "run", name, "-u", str(server.root / "repo"), *flags,
                         "--", "train.py", "--epochs", "1", check=check)  # fmt: skip
    return done.returncode, done.stdout, done.stderr


def inspected_env(server: Cluster, name: str) -> dict[str, str]:
    document = json.loads(server.flexai("training", "inspect", name, "--json").stdout)
    env: dict[str, str] = document["spec"]["env"]
    return env


def test_a_sweep_starts_a_job_per_combination_with_its_values_in_its_env(
    server: Cluster,
) -> None:
    _, out, _ = sweep(server, "grid", "--sweep", "LR=0.1,0.01,0.001", "--sweep", "BS=16,32",
                      "-E", "SEED=7")  # fmt: skip
    assert "6 of 6 jobs started" in out
    expected = [(lr, bs) for lr in ("0.1", "0.01", "0.001") for bs in ("16", "32")]
    for index, (lr, bs) in enumerate(expected, 1):
        assert f"  grid-{index}  LR={lr} BS={bs}\n" in out
        assert inspected_env(server, f"grid-{index}") == {"SEED": "7", "LR": lr, "BS": bs}
    assert "flexai training list --name-prefix grid-" in out
    listed = server.flexai("training", "list", "--name-prefix", "grid-").stdout
    assert sorted(line.split()[0] for line in listed.splitlines()[1:]
                  if line.startswith("grid-")) == [f"grid-{i}" for i in range(1, 7)]  # fmt: skip


def test_a_job_of_the_sweep_whose_name_is_taken_fails_alone_and_says_why(
    server: Cluster,
) -> None:
    body = {"name": "clash-2", "entry_point": ["t.py"], "repository_url": str(server.root)}
    taken = server.api("POST", "/v1/jobs", json=body)
    assert taken.status_code == 201, taken.text
    code, out, err = sweep(server, "clash", "--sweep", "LR=1,2,3", check=False)
    assert code == 1
    assert "2 of 3 jobs started" in out
    assert "  clash-1  LR=1\n" in out and "  clash-3  LR=3\n" in out and "clash-2  LR" not in out
    assert "error: clash-2 (LR=2) was not started: a job named 'clash-2' already exists" in err
    assert inspected_env(server, "clash-3") == {"LR": "3"}
    assert inspected_env(server, "clash-2") == {}  # the earlier job, untouched


def test_a_sweep_over_one_requests_limit_is_sent_in_several(server: Cluster) -> None:
    _, out, _ = sweep(server, "wide", "--sweep", f"I={','.join(map(str, range(91)))}",
                      "--sweep", f"J={','.join(map(str, range(11)))}")  # fmt: skip
    assert "1001 of 1001 jobs started" in out
    assert out.count("\n  wide-") == 1001
    assert inspected_env(server, "wide-1001") == {"I": "90", "J": "10"}
    assert inspected_env(server, "wide-1000") == {"I": "90", "J": "9"}


def test_a_bad_sweep_is_refused_before_anything_is_sent(server: Cluster) -> None:
    code, _, err = sweep(server, "bad", "--sweep", "LR", check=False)
    assert code == 2 and "expected KEY=V1,V2,..." in err
    code, _, err = sweep(server, "bad", "--sweep", "LR=1", "-E", "LR=2", check=False)
    assert code == 2 and "LR is given both with --env and --sweep" in err
    assert server.api("GET", "/v1/jobs", params={"name_prefix": "bad"}).json()["count"] == 0
