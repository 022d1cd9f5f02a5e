"""The CLI against a tiny real HTTP server answering canned JSON: what users see."""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

import cli.client.api as cli_api
import cli.client.http
from cli.main import main
from tests.fake_http import FakeHandler, serve, server_url

PROBLEM = "application/problem+json"
TOKEN = "test-token"


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes


Handler = Callable[[FakeHandler, Seen], None]


@dataclass
class FakeControlPlane:
    """Routes ``(method, path)`` to a canned answer or a handler; records every request."""

    url: str = ""
    routes: dict[tuple[str, str], Handler] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def answer(
        self, method: str, path: str, status: int, body: Any, content_type: str | None = None
    ) -> None:
        if isinstance(body, bytes):
            payload, kind = body, content_type or "application/octet-stream"
        else:
            payload = json.dumps(body).encode()
            kind = content_type or (PROBLEM if status >= 400 else "application/json")

        def handle(handler: FakeHandler, _: Seen) -> None:
            handler.send(status, kind, payload)

        self.routes[(method, path)] = handle

    def problem(self, method: str, path: str, status: int, slug: str, detail: str) -> None:
        body = {
            "type": f"https://flexai.dev/problems/{slug}",
            "title": slug.replace("-", " ").capitalize(),
            "status": status,
            "detail": detail,
        }
        self.answer(method, path, status, body)

    def handler(self) -> type[FakeHandler]:
        """Each request recorded, then routed (404 when no route is set)."""
        plane = self

        class Routed(FakeHandler):
            def answer(self, method: str, body: bytes) -> None:
                parts = urlsplit(self.path)
                seen = Seen(method, parts.path, parse_qs(parts.query), dict(self.headers.items()),
                            body)  # fmt: skip
                plane.seen.append(seen)
                route = plane.routes.get((method, parts.path))
                if route is None:
                    self.send(404, PROBLEM, b'{"detail": "no such route in the fake"}')
                else:
                    route(self, seen)

        return Routed


def checkout(root: Path) -> str:
    """A git checkout's root to give as ``-u`` (the CLI checks that it is one)."""
    (root / "repo" / ".git").mkdir(parents=True, exist_ok=True)
    return str(root / "repo")


@pytest.fixture(scope="module")
def server() -> Iterator[FakeControlPlane]:
    fake = FakeControlPlane()
    httpd = serve(fake.handler())
    fake.url = server_url(httpd)
    yield fake
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def plane(
    server: FakeControlPlane, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> FakeControlPlane:
    """The fake control plane with no routes yet, and the CLI pointed at it."""
    server.routes.clear()
    server.seen.clear()
    monkeypatch.setenv("FLEXAI_CONFIG", str(tmp_path / "absent-config.json"))
    monkeypatch.setenv("FLEXAI_API_URL", server.url)
    monkeypatch.setenv("FLEXAI_TOKEN", TOKEN)
    monkeypatch.setattr(cli.client.http, "RETRY_DELAY", 0.01)
    return server


def job_public(name: str = "my-job", status: str = "pending", **extra: Any) -> dict[str, Any]:
    job = {
        "id": "j1", "name": name, "status": status, "accels": 1, "nodes": 1, "node": None,
        "created_at": "2026-12-02T16:20:00+00:00", "started_at": None, "ended_at": None,
        "duration_seconds": None, "owner": "admin", "spec": {}, "commit": None,
        "accelerators": [], "updated_at": "2026-12-02T16:20:00+00:00", "failure": None,
        "stop": None,
        "history": [{"event": "Submitted", "status": "pending", "at": "2026-12-02T16:20:00+00:00",
                     "by": {"kind": "user", "id": "admin"}, "facts": {}}],
    }  # fmt: skip
    job.update(extra)
    return job


def one_error_line(err: str) -> str:
    assert err.startswith("error: ")
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err.removeprefix("error: ").rstrip("\n")


# --- run ---------------------------------------------------------------------------------


def test_run_posts_the_job_with_the_token_and_says_how_to_follow_it(
    plane: FakeControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plane.answer("POST", "/v1/jobs", 201, job_public())
    code = main(
        ["training", "run", "my-job", "-u", checkout(tmp_path), "-E", "A=1", "--", "train.py", "-x"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "Training job my-job started: status pending." in out
    assert "flexai training logs my-job --follow" in out
    [request] = plane.seen
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    body = json.loads(request.body)
    assert body["repository_url"] == str(tmp_path / "repo")
    assert body["env"] == {"A": "1"}
    assert body["entry_point"] == ["train.py", "-x"]


def test_run_from_a_checkpoint_name_says_which_checkpoint_it_pinned(
    plane: FakeControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plane.answer("POST", "/v1/jobs", 201, job_public(spec={"input_checkpoint_id": "c-42"}))
    assert main(["training", "run", "my-job", "-u", checkout(tmp_path), "-C", "checkpoint-500",
                 "--", "train.py"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "It starts from checkpoint c-42, the newest named checkpoint-500.\n" in out
    plane.answer("POST", "/v1/jobs", 201, job_public(spec={"input_checkpoint_id": "c-42"}))
    assert main(["training", "run", "my-job", "-u", checkout(tmp_path), "-C", "c-42",
                 "--", "train.py"]) == 0  # fmt: skip
    assert "It starts from" not in capsys.readouterr().out


def test_run_json_prints_the_job_public_answer(
    plane: FakeControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plane.answer("POST", "/v1/jobs", 201, job_public())
    argv = ["training", "run", "my-job", "-u", checkout(tmp_path), "--json", "--", "t.py"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out) == job_public()


def test_a_problem_answer_becomes_one_error_line_with_its_detail(
    plane: FakeControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    detail = "the name my-job is taken by a job that is not deleted; pick another name"
    plane.problem("POST", "/v1/jobs", 409, "name-taken", detail)
    code = main(["training", "run", "my-job", "-u", checkout(tmp_path), "--", "train.py"])
    assert code == 1
    assert one_error_line(capsys.readouterr().err) == detail


def test_a_multiline_detail_is_still_one_line(
    plane: FakeControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    plane.problem("GET", "/v1/jobs/x-1", 404, "job-not-found", "no job named x-1;\nsee list")
    assert main(["training", "inspect", "x-1"]) == 1
    assert one_error_line(capsys.readouterr().err) == "no job named x-1; see list"


def test_a_framework_validation_answer_names_the_field(
    plane: FakeControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = {"detail": [{"loc": ["body", "accels"], "msg": "Input should be >= 1"}]}
    plane.answer("POST", "/v1/jobs", 422, body, content_type="application/json")
    assert main(["training", "run", "my-job", "-u", checkout(tmp_path), "--", "t.py"]) == 1
    assert one_error_line(capsys.readouterr().err) == "accels: Input should be >= 1"


def test_an_answer_that_is_not_a_problem_shows_the_status(
    plane: FakeControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    plane.answer("GET", "/v1/jobs", 502, b"<html>Bad gateway</html>", "text/html")
    assert main(["training", "list"]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("the control plane answered HTTP 502")


def test_an_unreachable_server_says_to_start_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("FLEXAI_CONFIG", str(tmp_path / "absent.json"))
    monkeypatch.setenv("FLEXAI_API_URL", url)
    monkeypatch.setenv("FLEXAI_TOKEN", TOKEN)
    assert main(["training", "list"]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        f"cannot reach the control plane at {url}: is `flexai server` running? (set FLEXAI_API_URL)"
    )


def test_an_api_url_ending_with_v1_says_to_give_the_servers_root(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLEXAI_CONFIG", str(tmp_path / "absent.json"))
    monkeypatch.setenv("FLEXAI_API_URL", "http://127.0.0.1:8000/v1/")
    monkeypatch.setenv("FLEXAI_TOKEN", TOKEN)
    assert main(["training", "list"]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        "the API URL http://127.0.0.1:8000/v1/ ends with /v1: give the server's root, "
        "http://127.0.0.1:8000 (each request adds /v1 itself)"
    )


# --- list, inspect, checkpoints, stop, delete --------------------------------------------


def test_list_prints_a_table_newest_first(
    plane: FakeControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = [job_public("newer-job", "in progress", duration_seconds=65), job_public("old-job")]
    plane.answer("GET", "/v1/jobs", 200, {"jobs": jobs, "count": 2})
    assert main(["training", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "ACCELS", "NODES", "CREATED", "DURATION"]
    assert lines[1].startswith("newer-job  in progress")
    assert lines[1].endswith("1m 05s")
    assert lines[2].startswith("old-job    pending")


def test_list_of_nothing_says_how_to_start(
    plane: FakeControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    plane.answer("GET", "/v1/jobs", 200, {"jobs": [], "count": 0})
    assert main(["training", "list"]) == 0
    assert "flexai training run" in capsys.readouterr().out


def test_inspect_json_prints_the_server_answer_as_is(
    plane: FakeControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    job = job_public(failure={"code": "node_lost", "message": "node gpu-1 stopped answering"})
    plane.answer("GET", "/v1/jobs/my-job", 200, job)
    assert main(["training", "inspect", "my-job", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == job


def test_inspect_shows_the_failure(
    plane: FakeControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    job = job_public(status="failed", failure={"code": "node_lost", "message": "gone"})
    plane.answer("GET", "/v1/jobs/my-job", 200, job)
    assert main(["training", "inspect", "my-job"]) == 0
    assert "failure:\n  code: node_lost\n  message: gone\n" in capsys.readouterr().out


def test_a_name_is_sent_as_one_path_segment(
    plane: FakeControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["training", "inspect", "../audit"]) == 1
    assert plane.seen[0].path == "/v1/jobs/..%2Faudit"


def test_checkpoints_prints_the_table(
    plane: FakeControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = {
        "id": "c1", "name": "checkpoint-10", "node": "gpu-1", "step": 10, "train_loss": 1.5,
        "eval_loss": None, "model": None, "version": None, "inference_ready": False,
        "size": 12, "created_at": "2026-12-02T16:20:00+00:00",
    }  # fmt: skip
    plane.answer("GET", "/v1/jobs/my-job/checkpoints", 200, {"checkpoints": [checkpoint]})
    assert main(["training", "checkpoints", "my-job"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.startswith("ID  NAME           NODE   STEP  TRAIN LOSS  EVAL LOSS  MODEL")
    assert row.split()[:9] == ["c1", "checkpoint-10", "gpu-1", "10", "1.5", "-", "-", "-", "no"]


@pytest.mark.parametrize(("status", "said"), [
    ("running", "Training job my-job (running) has no checkpoints yet: they appear as its "
                "entry point writes them."),
    ("failed", "Training job my-job (failed) wrote no checkpoints."),
    ("stopped", "Training job my-job (stopped) wrote no checkpoints."),
])  # fmt: skip
def test_no_checkpoints_says_whether_more_may_come(
    plane: FakeControlPlane, capsys: pytest.CaptureFixture[str], status: str, said: str
) -> None:
    plane.answer("GET", "/v1/jobs/my-job/checkpoints", 200, {"checkpoints": []})
    plane.answer("GET", "/v1/jobs/my-job", 200, {"status": status})
    assert main(["training", "checkpoints", "my-job"]) == 0
    assert capsys.readouterr().out == said + "\n"
    assert main(["training", "checkpoints", "my-job", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"checkpoints": []}


def test_stop_prints_the_new_status(
    plane: FakeControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    plane.answer("POST", "/v1/jobs/my-job/stop", 202, job_public(status="stop in progress"))
    assert main(["training", "stop", "my-job"]) == 0
    assert "status stop in progress" in capsys.readouterr().out


def test_delete_says_the_name_is_free_again(
    plane: FakeControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = {"id": "j1", "name": "my-job", "deleted_at": "2026-12-02T16:30:00+00:00"}
    plane.answer("DELETE", "/v1/jobs/my-job", 200, answer)
    assert main(["training", "delete", "my-job"]) == 0
    assert "the name my-job is free again" in capsys.readouterr().out


def test_deleting_a_running_job_shows_the_servers_advice(
    plane: FakeControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    detail = "my-job is in progress; stop it first with `flexai training stop my-job`"
    plane.problem("DELETE", "/v1/jobs/my-job", 409, "job-not-terminal", detail)
    assert main(["training", "delete", "my-job"]) == 1
    assert one_error_line(capsys.readouterr().err) == detail


# --- logs --------------------------------------------------------------------------------


def test_logs_write_the_bytes_as_they_are(
    plane: FakeControlPlane, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    raw = b"step 1 loss=0.5\n\xff\x00 not utf-8\r\nlast line without newline"
    plane.answer("GET", "/v1/jobs/my-job/logs", 200, raw, "text/plain")
    plane.answer("GET", "/v1/jobs/my-job", 200, {"status": "in progress", "nodes": 1})
    assert main(["training", "logs", "my-job"]) == 0
    assert capsysbinary.readouterr().out == raw
    [logs] = [seen for seen in plane.seen if seen.path.endswith("/logs")]
    assert logs.query == {"offset": ["0"], "follow": ["false"]}


@pytest.mark.parametrize(("status", "said"), [
    ("rejected", "training job my-job (rejected) left no log lines: it ended before its node "
                 "wrote any; `flexai training inspect my-job` says why"),
    ("pending", "training job my-job (pending) has no log lines yet; follow them with "
                "`flexai training logs my-job --follow`"),
])  # fmt: skip
def test_an_empty_log_is_explained_on_stderr_and_stdout_stays_empty(
    plane: FakeControlPlane, capsysbinary: pytest.CaptureFixture[bytes], status: str, said: str
) -> None:
    plane.answer("GET", "/v1/jobs/my-job/logs", 200, b"", "text/plain")
    plane.answer("GET", "/v1/jobs/my-job", 200, {"status": status, "nodes": 1})
    for flags in ([], ["--node-index", "0"]):
        assert main(["training", "logs", "my-job", *flags]) == 0
        captured = capsysbinary.readouterr()
        assert captured.out == b"" and captured.err.decode() == said + "\n"


def test_logs_of_a_multi_node_job_prefix_each_line_with_its_node_index(
    plane: FakeControlPlane, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    def logs(handler: FakeHandler, seen: Seen) -> None:
        node = seen.query.get("node_index", ["0"])[0]
        handler.send(200, "text/plain", f"rank {node} up\nrank {node} done".encode())

    plane.routes[("GET", "/v1/jobs/my-job/logs")] = logs
    placements = [{"index": 0}, {"index": 1}]
    plane.answer("GET", "/v1/jobs/my-job", 200, {"status": "succeeded", "nodes": 2,
                                                 "placements": placements})  # fmt: skip
    assert main(["training", "logs", "my-job"]) == 0
    assert capsysbinary.readouterr().out.splitlines() == [
        b"[0] rank 0 up", b"[0] rank 0 done", b"[1] rank 1 up", b"[1] rank 1 done",
    ]  # fmt: skip
    assert main(["training", "logs", "my-job", "-f"]) == 0
    followed = capsysbinary.readouterr().out.splitlines()
    assert sorted(followed) == [b"[0] rank 0 done", b"[0] rank 0 up", b"[1] rank 1 done",
                                b"[1] rank 1 up"]  # fmt: skip
    assert followed.index(b"[1] rank 1 up") < followed.index(b"[1] rank 1 done")


def test_following_logs_resumes_at_the_byte_reached_after_a_dropped_connection(
    plane: FakeControlPlane, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    def logs(handler: FakeHandler, seen: Seen) -> None:
        if seen.query["offset"] == ["0"]:
            handler.send_response(200)
            handler.send_header("Content-Type", "text/plain")
            handler.send_header("Content-Length", "1000")  # promises more than it sends
            handler.end_headers()
            handler.wfile.write(b"line 1\n")
            handler.close_connection = True
        else:
            handler.send(200, "text/plain", b"line 2\n")

    plane.routes[("GET", "/v1/jobs/my-job/logs")] = logs
    plane.answer("GET", "/v1/jobs/my-job", 200, {"status": "succeeded"})
    assert main(["training", "logs", "my-job", "--follow"]) == 0
    assert capsysbinary.readouterr().out == b"line 1\nline 2\n"
    assert [s.query for s in plane.seen if s.path.endswith("/logs")] == [
        {"offset": ["0"], "follow": ["true"]},
        {"offset": ["7"], "follow": ["true"]},
    ]


def test_following_logs_resumes_when_the_server_ends_the_stream_of_a_running_job(
    plane: FakeControlPlane, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """A restarting server closes its follow streams cleanly; the job is not over, so the
    client asks again from the byte it reached."""

    def logs(handler: FakeHandler, seen: Seen) -> None:
        handler.send(200, "text/plain", b"line 1\n" if seen.query["offset"] == ["0"] else b"")

    statuses = iter(["in progress", "in progress", "succeeded"])

    def job(handler: FakeHandler, seen: Seen) -> None:
        handler.send(200, "application/json", json.dumps({"status": next(statuses)}).encode())

    plane.routes[("GET", "/v1/jobs/my-job/logs")] = logs
    plane.routes[("GET", "/v1/jobs/my-job")] = job
    assert main(["training", "logs", "my-job", "--follow"]) == 0
    assert capsysbinary.readouterr().out == b"line 1\n"
    assert [s.query["offset"] for s in plane.seen if s.path.endswith("/logs")] == [["0"], ["7"]]


def test_following_logs_outlives_a_server_that_goes_away_just_after_ending_the_stream(
    plane: FakeControlPlane, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """A stopping server ends its follow streams, then stops answering: the status check that
    follows fails like a dropped stream, and is retried, not reported as an error."""

    def logs(handler: FakeHandler, seen: Seen) -> None:
        handler.send(200, "text/plain", b"line 1\n" if seen.query["offset"] == ["0"] else
             b"line 2\n")  # fmt: skip

    statuses = iter(["in progress", None, "succeeded"])  # the first: how many nodes it has

    def job(handler: FakeHandler, seen: Seen) -> None:
        status = next(statuses)
        if status is None:  # gone: the connection closes with no answer
            handler.close_connection = True
            return
        handler.send(200, "application/json", json.dumps({"status": status}).encode())

    plane.routes[("GET", "/v1/jobs/my-job/logs")] = logs
    plane.routes[("GET", "/v1/jobs/my-job")] = job
    assert main(["training", "logs", "my-job", "--follow"]) == 0
    assert capsysbinary.readouterr().out == b"line 1\nline 2\n"
    assert [s.query["offset"] for s in plane.seen if s.path.endswith("/logs")] == [["0"], ["7"]]


def test_logs_of_an_unknown_job_is_one_error_line(
    plane: FakeControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    plane.problem("GET", "/v1/jobs/nope", 404, "job-not-found", "no job named nope")
    assert main(["training", "logs", "nope", "-f"]) == 1
    assert one_error_line(capsys.readouterr().err) == "no job named nope"


# --- fetch -------------------------------------------------------------------------------


def test_fetch_writes_output_0_zip_and_reports_it(
    plane: FakeControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = b"PK\x03\x04" + bytes(range(256)) * 40
    plane.answer("GET", "/v1/jobs/my-job/outputs/0", 200, archive, "application/zip")
    plane.answer("GET", "/v1/jobs/my-job", 200, {"status": "succeeded", "placements": [{}]})
    target_dir = tmp_path / "out"
    assert main(["training", "fetch", "my-job", "--output-dir", str(target_dir)]) == 0
    target = target_dir / "output_0.zip"
    assert target.read_bytes() == archive
    assert sorted(p.name for p in target_dir.iterdir()) == ["output_0.zip"]
    out = capsys.readouterr().out
    assert str(target) in out and f"{len(archive)} bytes" in out


def test_fetch_without_output_leaves_no_file(
    plane: FakeControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plane.problem("GET", "/v1/jobs/my-job/outputs/0", 404, "not-found", "my-job has no output yet")
    plane.answer("GET", "/v1/jobs/my-job", 200, {"status": "succeeded", "placements": [{}]})
    assert main(["training", "fetch", "my-job", "--output-dir", str(tmp_path)]) == 1
    assert one_error_line(capsys.readouterr().err) == "my-job has no output yet"
    assert list(tmp_path.iterdir()) == []


def test_fetch_of_a_job_that_is_not_there_makes_no_directory(
    plane: FakeControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plane.problem("GET", "/v1/jobs/nope/outputs/0", 404, "job-not-found", "no job named nope")
    plane.problem("GET", "/v1/jobs/nope", 404, "job-not-found", "no job named nope")
    for index in ([], ["--node-index", "0"]):
        code = main(["training", "fetch", "nope", *index, "-o", str(tmp_path / "new" / "dir")])
        assert code == 1
        assert one_error_line(capsys.readouterr().err) == "no job named nope"
        assert list(tmp_path.iterdir()) == []


def test_fetch_into_a_file_or_onto_a_directory_says_so_and_writes_nothing(
    plane: FakeControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plane.answer("GET", "/v1/jobs/my-job/outputs/0", 200, b"PK\x05\x06" + bytes(18),
                 "application/zip")  # fmt: skip
    (tmp_path / "a-file").write_text("mine")
    assert main(["training", "fetch", "my-job", "--node-index", "0", "-o",
                 str(tmp_path / "a-file")]) == 1  # fmt: skip
    said = one_error_line(capsys.readouterr().err)
    assert "a-file is a file, not a directory: name a directory" in said
    (tmp_path / "out" / "output_0.zip").mkdir(parents=True)
    assert main(["training", "fetch", "my-job", "--node-index", "0", "-o",
                 str(tmp_path / "out")]) == 1  # fmt: skip
    said = one_error_line(capsys.readouterr().err)
    assert "output_0.zip is a directory, where the archive would go: move it away" in said
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["output_0.zip"]
    assert (tmp_path / "a-file").read_text() == "mine"


def test_a_download_cut_short_again_and_again_leaves_no_half_file(
    plane: FakeControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(cli_api, "FETCH_PATIENCE_S", 0.5)  # tries again after each cut, a while
    def cut(handler: FakeHandler, _: Seen) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/zip")
        handler.send_header("Content-Length", "5000")
        handler.end_headers()
        handler.wfile.write(b"PK\x03\x04 partial")
        handler.close_connection = True

    plane.routes[("GET", "/v1/jobs/my-job/outputs/1")] = cut
    code = main(["training", "fetch", "my-job", "--node-index", "1", "--output-dir", str(tmp_path)])
    assert code == 1
    error = one_error_line(capsys.readouterr().err)
    assert error.startswith("the answer for output_1.zip of job 'my-job' ended early")
    assert "run `flexai training fetch` again" in error
    assert list(tmp_path.iterdir()) == []


def test_fetch_refuses_bytes_that_differ_from_the_recorded_sha256_naming_both(
    plane: FakeControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = b"PK\x05\x06" + bytes(18)
    recorded = "ab" * 32

    def altered(handler: FakeHandler, _: Seen) -> None:
        handler.send(200, "application/zip", archive,
                     {"X-Flexai-Size": str(len(archive)), "X-Flexai-Sha256": recorded})

    plane.routes[("GET", "/v1/jobs/my-job/outputs/0")] = altered
    code = main(["training", "fetch", "my-job", "--node-index", "0", "--output-dir", str(tmp_path)])

    said = one_error_line(capsys.readouterr().err)
    assert code == 1
    assert "output_0.zip of job 'my-job'" in said
    assert recorded in said and hashlib.sha256(archive).hexdigest() in said
    assert list(tmp_path.iterdir()) == []


def test_fetch_tells_clearly_when_the_store_is_away(
    plane: FakeControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(cli_api, "FETCH_PATIENCE_S", 0.3)
    plane.problem("GET", "/v1/jobs/my-job/outputs/0", 503, "storage-unavailable",
                  "cannot store or read outputs in s3://bucket: connection refused")  # fmt: skip

    code = main(["training", "fetch", "my-job", "--node-index", "0", "--output-dir", str(tmp_path)])

    said = one_error_line(capsys.readouterr().err)
    assert code == 1
    assert "503 storage-unavailable" in said and "s3://bucket" in said and "again" in said
    assert list(tmp_path.iterdir()) == []
