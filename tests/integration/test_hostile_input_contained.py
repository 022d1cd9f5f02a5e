"""Hostile input breaks nothing (each store): numbers out of range, paths that climb out,
archives that would unpack outside their directory, bodies and specs too large, control
characters and bytes that are not UTF-8, repository URLs that git would run. Each is refused
with problem details that say what to do, and nothing is written outside the data directory."""

from __future__ import annotations

import io
import os
import stat
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from fastapi.testclient import TestClient

from api.artifacts.store import output_key
from api.http.app import create_app
from api.identity.identities import ensure_admin_token
from api.services import Services, build_services
from api.settings import Limits, Settings
from tests.integration.test_api_problems import assert_problem
from tests.support import node_headers, send_archive

AGENT = "hostile-agent-0123456789"
SPEC = {"repository_url": "https://example.com/org/repo.git", "entry_point": ["train.py"]}


class Api:
    def __init__(self, client: TestClient, services: Services, token: str, root: Path) -> None:
        self.client = client
        self.services = services
        self.headers = {"Authorization": f"Bearer {token}"}
        self.agent = node_headers(services, "gpu-1", AGENT)
        self.root = root
        """The directory around the data directory: nothing may appear in it."""
        self.before = tree_outside(root, services.settings.data_dir)

    def submit(self, **change: Any) -> Any:
        return self.client.post("/v1/jobs", headers=self.headers,
                                json={**SPEC, "name": "hostile", **change})  # fmt: skip

    def running_job(self) -> str:
        """Job ``victim``, running on node gpu-1 (held by AGENT), with a log."""
        node_id = self.client.post("/v1/agent/nodes", headers=self.agent, json={
            "name": "gpu-1", "accels": 2, "agent_id": AGENT}).json()["node_id"]  # fmt: skip
        job_id = self.submit(name="victim").json()["id"]
        self.services.jobs.begin_scheduling(UUID(job_id))
        self.services.jobs.assign(UUID(job_id), node_id, "gpu-1")
        self.services.projector.catch_up()
        self.report(job_id, node_id, "built", commit="c0ffee")
        shipped = self.client.post(f"/v1/agent/jobs/{job_id}/logs", params={"offset": 0},
                                   headers=self.agent, content=b"epoch 1\n")  # fmt: skip
        assert shipped.status_code == 200, shipped.text
        return job_id

    def finished_job(self) -> str:
        """Job ``victim``, run on node gpu-1 to its end, with a log."""
        job_id = self.running_job()
        self.report(job_id, self.node_id(), "exited", exit_code=0)
        return job_id

    def node_id(self) -> str:
        found = self.client.get("/v1/jobs/victim", headers=self.headers)
        return str(found.json()["placements"][0]["node_id"])

    def report(self, job_id: str, node_id: str, kind: str, **facts: Any) -> None:
        answer = self.client.post(f"/v1/agent/jobs/{job_id}/reports", headers=self.agent,
                                  json={"node_id": node_id, "type": kind, **facts})  # fmt: skip
        assert answer.status_code == 200, answer.text

    def assert_nothing_written_outside(self) -> None:
        data_dir = self.services.settings.data_dir
        assert tree_outside(self.root, data_dir) == self.before
        assert self.client.get("/health").json()["ok"] is True


def tree_outside(root: Path, inside: Path) -> set[str]:
    """Every path under ``root`` but those under ``inside`` and the SQLite files."""
    found = set()
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [name for name in subfolders if Path(folder, name) != inside]
        found.update(str(Path(folder, name).relative_to(root)) for name in subfolders + files
                     if not name.startswith("flexai.sqlite3"))  # fmt: skip
    return found


@pytest.fixture
def open_api(database_url: str, tmp_path: Path) -> Iterator[Callable[..., Api]]:
    """The API with its data directory three levels down, so that a path climbing out of it
    would land in the tree the tests watch."""
    opened: list[tuple[TestClient, Services]] = []

    def open_one(**settings: Any) -> Api:
        data_dir = tmp_path / "a" / "b" / "data"
        config = Settings(data_dir=data_dir, database_url=database_url, **settings)
        services = build_services(config)
        token, _ = ensure_admin_token(services.identities, data_dir)
        client = TestClient(create_app(services, background=False))
        client.__enter__()
        opened.append((client, services))
        return Api(client, services, token, tmp_path)

    yield open_one
    for client, services in reversed(opened):
        client.__exit__(None, None, None)
        services.close()


@pytest.fixture
def api(open_api: Callable[..., Api]) -> Api:
    small = Limits(request_bytes=64 * 1024, log_chunk_bytes=4096, upload_bytes=64 * 1024,
                   archive_entries=50, archive_unpacked_bytes=1_000_000)  # fmt: skip
    return open_api(limits=small)


# -- numbers out of range -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/jobs/victim/outputs/99999999999999999999", "node_index"),
        ("/v1/jobs/victim/outputs/-1", "node_index"),
        ("/v1/jobs/victim/outputs/1024", "node_index"),
        ("/v1/jobs/victim/logs?offset=" + "9" * 30, "offset"),
        ("/v1/jobs/victim/logs?node_index=99999999999999999999", "node_index"),
    ],
)
def test_a_number_out_of_its_range_in_a_path_or_query_is_a_422_naming_it(
    api: Api, path: str, field: str
) -> None:
    api.finished_job()
    body = assert_problem(api.client.get(path, headers=api.headers), 422, "invalid-request")
    assert field in body["detail"] and "fix it and send it again" in body["detail"]
    api.assert_nothing_written_outside()


def test_an_offset_past_the_end_of_a_log_answers_no_bytes_rather_than_breaking_the_stream(
    api: Api,
) -> None:
    api.finished_job()
    for offset in (8, 10**15, 2**63 - 1):
        answer = api.client.get("/v1/jobs/victim/logs", headers=api.headers,
                                params={"offset": offset})  # fmt: skip
        assert (answer.status_code, answer.content) == (200, b"")
    followed = api.client.get("/v1/jobs/victim/logs", headers=api.headers,
                              params={"offset": 2**63 - 1, "follow": "true"})  # fmt: skip
    assert (followed.status_code, followed.content) == (200, b"")
    whole = api.client.get("/v1/jobs/victim/logs", headers=api.headers)
    assert whole.content == b"epoch 1\n"


def test_an_agent_log_offset_out_of_range_is_a_422_and_nothing_is_appended(api: Api) -> None:
    job_id = api.finished_job()
    for offset in ("-1", "9" * 30):
        refused = api.client.post(f"/v1/agent/jobs/{job_id}/logs", headers=api.agent,
                                  params={"offset": offset}, content=b"x")  # fmt: skip
        assert "offset" in assert_problem(refused, 422, "invalid-request")["detail"]
    assert api.client.get("/v1/jobs/victim/logs", headers=api.headers).content == b"epoch 1\n"


@pytest.mark.parametrize(
    ("query", "slug", "says"),
    [
        ({"version": "9" * 30}, "invalid-request", "version: must be at most"),
        ({"version": str(-(2**63))}, "version-out-of-range", "from 1 to"),
        ({"at": "9999-12-31T23:59:59-14:00"}, "invalid-request", "at: 9999-12-31T23:59:59-14:00"),
        ({"at": "0001-01-01T00:00:00+14:00"}, "invalid-request", "at: 0001-01-01T00:00:00+14:00"),
    ],
)
def test_a_version_or_moment_out_of_range_in_a_time_travel_is_a_422_naming_it(
    api: Api, query: dict[str, str], slug: str, says: str
) -> None:
    job_id = api.finished_job()
    answer = api.client.get(f"/v1/audit/jobs/{job_id}/state", headers=api.headers, params=query)
    assert says in assert_problem(answer, 422, slug)["detail"]


# -- paths that climb out -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["..", ".", "../../escape", "a/b", "ck\x00pt", "\n", "a\\b"])
def test_a_checkpoint_name_that_is_not_one_plain_name_is_refused_and_nothing_is_stored(
    api: Api, name: str
) -> None:
    job_id = api.running_job()
    answer = send_archive(api.client, api.agent, job_id, api.node_id(),
                          zip_of({"a.txt": b"x"}), name=name)  # fmt: skip
    assert assert_problem(answer, 422, "invalid-request")["field"] == "name"
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert api.client.get("/v1/jobs/victim/checkpoints", headers=api.headers).json() == {
        "checkpoints": []
    }
    api.assert_nothing_written_outside()


@pytest.mark.parametrize("name", ["%2E%2E", "...", ".hidden", "-rf", "a b", "x%00y", "%C3%A9t"])
def test_a_dataset_name_that_could_be_a_path_is_refused_with_the_rule(api: Api, name: str) -> None:
    answer = api.client.put(f"/v1/datasets/{name}", headers=api.headers,
                            content=zip_of({"a.txt": b"x"}))  # fmt: skip
    body = assert_problem(answer, 422, "invalid-request")
    assert "letters, digits" in body["detail"] or "control character" in body["detail"]
    assert api.client.get("/v1/datasets", headers=api.headers).json()["count"] == 0
    api.assert_nothing_written_outside()


def test_a_path_parameter_with_dot_dot_segments_never_reaches_a_file(api: Api) -> None:
    api.finished_job()
    for path in ("/v1/jobs/victim/outputs/..%2F..%2F..%2Fadmin.token",
                 "/v1/jobs/..%2F..%2Fadmin.token/logs",
                 "/v1/agent/checkpoints/..%2F..%2Fadmin.token"):  # fmt: skip
        answer = api.client.get(path, headers=api.headers)
        assert answer.status_code in (404, 422), (path, answer.text)
        assert "flx_" not in answer.text and answer.headers["content-type"].startswith(
            "application/problem+json")  # fmt: skip


def test_a_name_holding_an_encoded_slash_never_reaches_another_route(api: Api) -> None:
    """The CLI sends ``inspect "victim/checkpoints"`` as ``/v1/jobs/victim%2Fcheckpoints``;
    decoded, that path was the checkpoints route of job victim (200, and an empty job shown)."""
    api.finished_job()
    for method, path in (("GET", "/v1/jobs/victim%2Fcheckpoints"),
                         ("GET", "/v1/jobs/victim%2foutputs%2F0"),
                         ("DELETE", "/v1/jobs/victim%2Fdebug-sessions%2Fabc")):  # fmt: skip
        answer = api.client.request(method, path, headers=api.headers)
        body = assert_problem(answer, 422, "invalid-request")
        assert "encoded '/' (%2F)" in body["detail"] and "fix the name" in body["detail"], path
    assert api.client.get("/v1/jobs/victim", headers=api.headers).status_code == 200


# -- archives that would unpack outside their directory -----------------------------------


def zip_of(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(zipfile.ZipInfo(name), data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return buffer.getvalue()


SLIPS = [
    pytest.param({"../../../escape.txt": b"x"}, None, "leaves", id="dot-dot"),
    pytest.param({"/tmp/escape.txt": b"x"}, None, "absolute", id="absolute"),
    pytest.param({"ok/./../../escape": b"x"}, None, "leaves", id="dot-segments"),
    pytest.param({"..\\..\\escape.txt": b"x"}, None, "backslash", id="backslash"),
    pytest.param({}, {"link": "/etc/passwd"}, "link", id="symlink"),
]


@pytest.mark.parametrize(("files", "links", "said"), SLIPS)
@pytest.mark.parametrize("name", ["ck-1", None], ids=["checkpoint", "output"])
def test_a_checkpoint_or_output_archive_with_entries_outside_it_is_refused_and_not_kept(
    api: Api, name: str | None, files: dict[str, bytes], links: dict[str, str] | None,
    said: str,
) -> None:  # fmt: skip
    job_id = api.running_job()
    answer = send_archive(api.client, api.agent, job_id, api.node_id(), zip_of(files, links),
                          name=name)  # fmt: skip
    body = assert_problem(answer, 422, "invalid-request")
    assert said in body["detail"] and "plain files" in body["detail"]
    job_dir = api.services.artifacts.root / "jobs" / job_id
    assert sorted(p.name for p in job_dir.rglob("*") if p.is_file()) == ["logs.txt"]
    api.assert_nothing_written_outside()


@pytest.mark.parametrize(("files", "links", "said"), SLIPS)
def test_a_dataset_archive_with_entries_outside_it_is_refused_and_not_kept(
    api: Api, files: dict[str, bytes], links: dict[str, str] | None, said: str
) -> None:
    answer = api.client.put("/v1/datasets/mnist", headers=api.headers,
                            content=zip_of(files, links))  # fmt: skip
    assert said in assert_problem(answer, 422, "invalid-request")["detail"]
    stored = api.services.artifacts.root / "datasets"
    assert [p for p in stored.rglob("*") if p.is_file()] == []
    api.assert_nothing_written_outside()


# -- bodies and specs too large -----------------------------------------------------------


def test_an_upload_over_the_limit_is_a_413_and_leaves_no_partial_file(api: Api) -> None:
    job_id = api.finished_job()
    begun = api.client.post(f"/v1/agent/jobs/{job_id}/uploads", headers=api.agent, json={
        "kind": "output", "node_id": api.node_id(), "node_index": 0})  # fmt: skip
    assert begun.status_code == 201, begun.text

    def chunked() -> Iterator[bytes]:
        for _ in range(20):
            yield os.urandom(8192)

    upload = f"/v1/agent/uploads/{begun.json()['id']}"
    answer = api.client.put(f"{upload}/parts/1", headers=api.agent, content=chunked())
    body = assert_problem(answer, 413, "payload-too-large")
    assert body["limit"] == 64 * 1024 and "send less" in body["detail"]
    assert api.services.artifacts.size(output_key(job_id, 0)) is None
    assert api.client.delete(upload, headers=api.agent).json()["aborted"] is True
    job_dir = api.services.artifacts.root / "jobs" / job_id
    assert sorted(p.name for p in job_dir.rglob("*") if p.is_file()) == ["logs.txt"]
    api.assert_nothing_written_outside()


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"env": {f"K{i}": "v" for i in range(100_000)}}, id="env-100000-keys"),
        pytest.param({"entry_point": ["train.py", "x" * 2**20]}, id="entry-point-1MiB"),
    ],
)
def test_a_huge_spec_is_a_413_under_the_default_limits(
    open_api: Callable[..., Api], change: dict[str, Any]
) -> None:
    api = open_api()
    body = assert_problem(api.submit(**change), 413, "payload-too-large")
    assert body["limit"] == 2**20
    assert api.client.get("/v1/jobs", headers=api.headers).json()["count"] == 0
    api.assert_nothing_written_outside()


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"env": {f"K{i}": "v" for i in range(100_000)}}, "env", "at most 1024"),
        ({"entry_point": ["train.py", "x" * 2**20]}, "entry_point", "at most 32768"),
        ({"env": {f"K{i}": "v" * 200 for i in range(1000)}}, "spec", "bytes as JSON"),
    ],
)
def test_a_huge_spec_within_a_raised_body_limit_is_a_422_naming_what_to_shrink(
    open_api: Callable[..., Api], change: dict[str, Any], field: str, says: str
) -> None:
    api = open_api(limits=Limits(request_bytes=16 * 2**20))
    body = assert_problem(api.submit(**change), 422, "invalid-request")
    assert field in body["detail"] and says in body["detail"]
    assert api.client.get("/v1/jobs", headers=api.headers).json()["count"] == 0


# -- control characters and bytes that are not UTF-8 --------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "bad\x07name"}, "name"),
        ({"env": {"LR": "0.1\x1b[2J"}}, "env"),
        ({"env": {"L\x00R": "1"}}, "env"),
        ({"entry_point": ["train.py\x00"]}, "entry_point"),
        ({"repository_revision": "main\r\nx"}, "repository_revision"),
        ({"requirements_path": "../../etc/passwd"}, "requirements_path"),
        ({"datasets": ["../etc"]}, "datasets"),
    ],
)
def test_control_characters_and_paths_out_of_the_repository_in_a_spec_are_refused(
    api: Api, change: dict[str, Any], field: str
) -> None:
    body = assert_problem(api.submit(**change), 422, "invalid-request")
    assert field in body["detail"]
    assert api.client.get("/v1/jobs", headers=api.headers).json()["count"] == 0


def test_a_body_that_is_not_utf_8_or_holds_a_lone_surrogate_is_refused_not_a_crash(
    api: Api,
) -> None:
    json_headers = {**api.headers, "Content-Type": "application/json"}
    raw = b'{"name": "bad\xff\xfe", "repository_url": "/r", "entry_point": ["t.py"]}'
    answer = api.client.post("/v1/jobs", headers=json_headers, content=raw)
    assert "UTF-8 JSON" in assert_problem(answer, 400, "invalid-request")["detail"]
    surrogate = b'{"name": "ok-name", "repository_url": "/r", "entry_point": ["\\ud800"]}'
    answer = api.client.post("/v1/jobs", headers=json_headers, content=surrogate)
    assert "surrogate" in assert_problem(answer, 422, "invalid-request")["detail"]
    for path, says in (("/v1/jobs/%FF%FE", "not UTF-8"), ("/v1/datasets/%FF", "not UTF-8"),
                       ("/v1/jobs/%00", "U+0000"), ("/v1/audit/jobs?name=a%1Bb", "U+001B"),
                       ("/v1/jobs?name_prefix=%00", "U+0000")):  # fmt: skip
        body = assert_problem(api.client.get(path, headers=api.headers), 422, "invalid-request")
        assert says in body["detail"] and "fix it" in body["detail"], path
    for header in ("X-Flexai-Min-Position", "X-Flexai-Agent-Id"):
        answer = api.client.get("/v1/jobs", headers={**api.headers, header: b"\xff\x00"})
        assert answer.status_code in (200, 422), answer.text
    assert api.client.get("/v1/jobs", headers=api.headers).json()["count"] == 0


# -- repository URLs git would run ---------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("--upload-pack=touch /tmp/pwned", "starts with '-'"),
        ("-u", "starts with '-'"),
        ("ext::sh -c touch% /tmp/pwned", "transport helper"),
        ("fd::17", "transport helper"),
        ("ssh://-oProxyCommand=touch%20pwned/repo", "starting with '-'"),
        ("git@-oProxyCommand=x:repo", "relative path or not a URL"),
        ("evil://host/repo", "unknown scheme"),
        ("https://host/repo\x1b[2J", "control character"),
        ("repo", "relative path"),
    ],
)
def test_a_repository_url_git_would_read_as_an_option_or_a_command_is_refused(
    api: Api, url: str, says: str
) -> None:
    body = assert_problem(api.submit(repository_url=url), 422, "invalid-request")
    assert "repository_url" in body["detail"] and says in body["detail"]
    assert "https://" in body["detail"] or "control character" in body["detail"]
    assert api.client.get("/v1/jobs", headers=api.headers).json()["count"] == 0
    api.assert_nothing_written_outside()


@pytest.mark.parametrize(
    "url", ["https://alice:s3cret@example.com/r.git", "https://oauth2:s3cret@gitlab.example/r"]
)
def test_a_repository_url_holding_a_password_is_refused_without_repeating_it(
    api: Api, url: str
) -> None:
    """The ledger is append-only: a password in a job's URL would stay in it for good."""
    body = assert_problem(api.submit(repository_url=url), 422, "invalid-request")
    assert "holds a password or token" in body["detail"] and "credential helper" in body["detail"]
    assert "s3cret" not in str(body)
    assert api.client.get("/v1/jobs", headers=api.headers).json()["count"] == 0


@pytest.mark.parametrize(
    "url",
    ["https://github.com/org/repo.git", "ssh://git@host/org/repo", "git@github.com:org/repo",
     "/srv/repos/demo", "file:///srv/repos/demo"],
)
def test_the_default_repository_urls_are_accepted(api: Api, url: str) -> None:
    assert api.submit(repository_url=url).status_code == 201


def test_the_server_accepts_only_the_kinds_of_repository_url_it_is_configured_with(
    open_api: Callable[..., Api],
) -> None:
    api = open_api(allowed_repo_schemes=frozenset({"https"}))
    for url in ("/srv/repos/demo", "git@github.com:org/repo", "http://example.com/r.git"):
        body = assert_problem(api.submit(repository_url=url), 422, "invalid-request")
        assert body["field"] == "repository_url"
        assert "give https://" in body["detail"] and "--allowed-repo-schemes" in body["detail"]
    assert api.submit(repository_url="https://example.com/r.git").status_code == 201
