"""What people read: durations, timestamps, tables and the YAML-like inspect view."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cli.output.formats import format_duration, format_size, format_timestamp
from cli.output.jobs import render_job
from cli.output.tables import render_checkpoints_table, render_jobs_table, render_table
from cli.output.yaml_like import render_yaml
from common.durations import human_duration, parse_duration


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time is UTC, so timestamps print the same on every machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "-"),
        (0, "0s"),
        (42.9, "42s"),
        (65, "1m 05s"),
        (600, "10m 00s"),
        (3600 + 180 + 4, "1h 03m 04s"),
        (2 * 86400 + 3 * 3600 + 5 * 60 + 9, "2d 03h 05m"),
    ],
)
def test_durations_read_like_minutes_and_seconds(seconds: float | None, shown: str) -> None:
    assert format_duration(seconds) == shown


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("30m", 1800), ("1.5h", 5400), ("1h30m", 5400), ("1d2h", 93600),
     ("2h30m15s", 9015), ("1min30sec", 90)],
)  # fmt: skip
def test_a_duration_is_read_as_written_and_as_inspect_shows_it(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(human_duration(seconds)) == seconds  # `time limit: 1h30m` reads back


@pytest.mark.parametrize("text", ["30m1h", "1h1h", "1h30", "2h 30m", "1hx", "", "-5m"])
def test_a_duration_with_parts_out_of_order_or_unknown_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration: use e.g. 90s, 30m, 1h30m"):
        parse_duration(text)


def test_timestamps_are_shown_in_local_time_to_the_second(utc: None) -> None:
    assert format_timestamp("2026-12-02T16:20:00.123456+00:00") == "2026-12-02 16:20:00"
    assert format_timestamp(None) == "-"


def test_timestamps_follow_the_local_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        assert format_timestamp("2026-12-02T16:20:00+00:00") == "2026-12-02 21:50:00"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_sizes_use_binary_units() -> None:
    assert [format_size(n) for n in (512, 1536, 5 * 1024 * 1024)] == [
        "512 B",
        "1.5 KiB",
        "5.0 MiB",
    ]


def test_tables_align_columns_under_a_capitalised_header() -> None:
    table = render_table(("NAME", "N"), [("a", 1), ("longer-name", None)])
    assert table.splitlines() == [
        "NAME         N",
        "a            1",
        "longer-name  -",
    ]


def test_the_jobs_table_keeps_the_server_order_and_shows_durations(utc: None) -> None:
    jobs = [
        {"name": "newest", "status": "in progress", "accels": 2, "nodes": 1,
         "created_at": "2026-12-02T16:25:00+00:00", "duration_seconds": 65.2},
        {"name": "older-job", "status": "pending", "accels": 1, "nodes": 1,
         "created_at": "2026-12-02T16:20:00+00:00", "duration_seconds": None},
    ]  # fmt: skip
    assert render_jobs_table(jobs).splitlines() == [
        "NAME       STATUS       ACCELS  NODES  CREATED              DURATION",
        "newest     in progress  2       1      2026-12-02 16:25:00  1m 05s",
        "older-job  pending      1       1      2026-12-02 16:20:00  -",
    ]


def test_checkpoint_cells_without_a_value_show_a_dash(utc: None) -> None:
    checkpoints: list[dict[str, Any]] = [
        {"id": "c1", "name": "checkpoint-100", "node": "gpu-1", "step": 100,
         "train_loss": 0.51234567, "eval_loss": None, "model": "GPT2LMHeadModel",
         "version": "4.46.0", "inference_ready": True, "size": 10,
         "created_at": "2026-12-02T16:20:00+00:00"},
        {"id": "c2", "name": "final", "node": None, "step": None, "train_loss": None,
         "eval_loss": None, "model": None, "version": None, "inference_ready": False,
         "size": 3, "created_at": "2026-12-02T16:21:00+00:00"},
    ]  # fmt: skip
    lines = render_checkpoints_table(checkpoints).splitlines()
    assert lines[0].split("  ")[0] == "ID"
    assert "TRAIN LOSS" in lines[0] and "INFERENCE READY" in lines[0]
    assert lines[1].split() == [
        "c1", "checkpoint-100", "gpu-1", "100", "0.512346", "-", "GPT2LMHeadModel",
        "4.46.0", "yes", "2026-12-02", "16:20:00",
    ]  # fmt: skip
    assert lines[2].split() == ["c2", "final", "-", "-", "-", "-", "-", "-", "no",
                                "2026-12-02", "16:21:00"]  # fmt: skip


def test_yaml_like_renders_nesting_lists_and_multiline_text() -> None:
    data = {"a": 1, "b": {"c": None, "d": [1, 2]}, "e": [], "f": "one\ntwo", "g": True}
    text = render_yaml(data)
    assert text.splitlines() == [
        "a: 1",
        "b:",
        "  c: -",
        "  d:",
        "    - 1",
        "    - 2",
        "e: -",
        "f: |",
        "  one",
        "  two",
        "g: yes",
    ]


SAMPLE_JOB: dict[str, Any] = {
    "id": "7d1f",
    "name": "mnist-1",
    "status": "failed",
    "accels": 1,
    "nodes": 1,
    "node": "gpu-1",
    "created_at": "2026-12-02T16:20:00+00:00",
    "started_at": "2026-12-02T16:20:30+00:00",
    "ended_at": "2026-12-02T16:21:35+00:00",
    "duration_seconds": 65.0,
    "owner": "admin",
    "spec": {
        "repository_url": "https://github.com/org/mnist",
        "repository_revision": None,
        "requirements_path": "requirements.txt",
        "accels": 1,
        "nodes": 1,
        "env": {"LR": "0.1"},
        "secrets": {"HF_TOKEN": "hf-token"},
        "datasets": [],
        "checkpoint": None,
        "entry_point": ["train.py", "--note", "two words"],
    },
    "commit": "0a1b2c3",
    "accelerators": [0],
    "updated_at": "2026-12-02T16:21:35+00:00",
    "failure": {"code": "entry_point_failed", "message": "the entry point exited with code 3"},
    "stop": None,
    "history": [
        {"event": "Submitted", "status": "pending", "at": "2026-12-02T16:20:00+00:00",
         "by": {"kind": "user", "id": "admin"}, "facts": {}},
        {"event": "NodeAssigned", "status": "building", "at": "2026-12-02T16:20:01+00:00",
         "by": {"kind": "scheduler", "id": "scheduler"}, "facts": {"node": "gpu-1"}},
        {"event": "Started", "status": "in progress", "at": "2026-12-02T16:20:30+00:00",
         "by": {"kind": "agent", "id": "gpu-1"},
         "facts": {"commit": "0a1b2c3", "accelerators": [0]}},
        {"event": "Failed", "status": "failed", "at": "2026-12-02T16:21:35+00:00",
         "by": {"kind": "agent", "id": "gpu-1"},
         "facts": {"code": "entry_point_failed", "exit_code": 3}},
    ],
}  # fmt: skip


def test_inspect_view_shows_spec_failure_timestamps_and_history(utc: None) -> None:
    text = render_job(SAMPLE_JOB)
    assert text.splitlines() == [
        "name: mnist-1",
        "id: 7d1f",
        "status: failed",
        "owner: admin",
        "failure:",
        "  code: entry_point_failed",
        "  message: the entry point exited with code 3",
        "spec:",
        "  repository:",
        "    url: https://github.com/org/mnist",
        "    revision: (default branch)",
        "    commit: 0a1b2c3",
        "  requirements: requirements.txt",
        "  accels: 1",
        "  nodes: 1",
        "  entry point: train.py --note 'two words'",
        "  env:",
        "    LR: 0.1",
        "  secrets:",
        "    HF_TOKEN: hf-token",
        "  datasets: -",
        "  checkpoint: -",
        "  time limit: -",
        "  stop grace: -",
        "  priority: normal",
        "node: gpu-1",
        "accelerators: 0",
        "timestamps:",
        "  created: 2026-12-02 16:20:00",
        "  started: 2026-12-02 16:20:30",
        "  ended: 2026-12-02 16:21:35",
        "  updated: 2026-12-02 16:21:35",
        "  duration: 1m 05s",
        "history:",
        "  - 2026-12-02 16:20:00  pending      Submitted     by user admin",
        "  - 2026-12-02 16:20:01  building     NodeAssigned  by scheduler    node=gpu-1",
        "  - 2026-12-02 16:20:30  in progress  Started       by agent gpu-1  "
        "commit=0a1b2c3 accelerators=0",
        "  - 2026-12-02 16:21:35  failed       Failed        by agent gpu-1  "
        "code=entry_point_failed exit_code=3",
    ]  # fmt: skip


STOP = {"requested_at": "2026-12-02T16:21:00+00:00", "from_status": "in progress",
        "requested_by": {"kind": "user", "id": "alice"}}  # fmt: skip
STOP_LINES = ("stop:\n  requested: 2026-12-02 16:21:00\n  by: user alice\n"
              "  from status: in progress\n")  # fmt: skip


def test_inspect_view_tells_whether_a_stopped_job_had_accelerators(utc: None) -> None:
    job = dict(SAMPLE_JOB, failure=None, status="stopped",
               stop={**STOP, "accelerators_allocated": False})  # fmt: skip
    text = render_job(job)
    assert "failure:" not in text
    assert STOP_LINES + "  accelerators allocated: no\nspec:" in text


def test_inspect_view_shows_the_exit_code_of_a_stop_that_raced_the_end(utc: None) -> None:
    job = dict(SAMPLE_JOB, failure=None, status="stopped",
               stop={**STOP, "accelerators_allocated": True, "exit_code": 0})  # fmt: skip
    assert STOP_LINES + "  accelerators allocated: yes\n  exit code: 0" in render_job(job)


def test_inspect_view_says_why_a_stop_failed(utc: None) -> None:
    job = dict(SAMPLE_JOB, status="stop failed", stop={
        **STOP, "accelerators_allocated": True, "reason": "2 processes survived SIGKILL"})
    assert STOP_LINES + ("  accelerators allocated: yes\n"
                         "  reason: 2 processes survived SIGKILL\n") in render_job(job)  # fmt: skip


def test_inspect_view_says_why_logs_are_missing_and_where_they_are(utc: None) -> None:
    job = dict(SAMPLE_JOB, logs_unavailable={
        "message": "cannot store log bytes (Read-only file system); kept on gpu-1 at /x/job.log",
        "offset": 1024, "written": 4096, "at": "2026-12-02T16:21:00+00:00",
    })  # fmt: skip
    lines = render_job(job).splitlines()
    assert lines[lines.index("logs:"):lines.index("logs:") + 4] == [
        "logs:",
        "  unavailable: stored up to byte 1024 of 4096",
        "  reason: cannot store log bytes (Read-only file system); kept on gpu-1 at /x/job.log",
        "  since: 2026-12-02 16:21:00",
    ]


def test_inspect_view_says_why_an_enqueued_job_waits_and_where_it_stands_in_line() -> None:
    waiting = {
        "reason": "waits for 2 accelerators: gpu-1 has 0 of 4 free (held by big)",
        "asked": {"accels": 2, "nodes": 1},
        "nodes": [{"node": "gpu-1", "accels": 4, "free": 0, "alive": True,
                   "held_by": [{"job": "big", "accelerators": [0, 1, 2, 3]}],
                   "ahead": ["earlier"]}],
        "place": 2,
    }  # fmt: skip
    text = render_job(dict(SAMPLE_JOB, status="enqueued", failure=None, waiting=waiting))
    assert "\n".join([
        "waiting:",
        "  reason: waits for 2 accelerators: gpu-1 has 0 of 4 free (held by big)",
        "  asked for: 2 accelerator(s) on each of 1 node(s)",
        "  nodes:",
        "    - gpu-1: 0 of 4 free; held by big 0,1,2,3; ahead in line: earlier",
        "  place in line: 2",
    ]) in text  # fmt: skip


def test_the_jobs_table_gets_a_reason_column_only_when_a_job_waits(utc: None) -> None:
    quiet = [{"name": "a", "status": "succeeded", "accels": 1, "nodes": 1}]
    assert "REASON" not in render_jobs_table(quiet)
    waiting = [*quiet, {"name": "b", "status": "scheduling", "accels": 1, "nodes": 2,
                        "reason": "waits for 2 live nodes with 1 accelerator; " + "x" * 80}]
    table = render_jobs_table(waiting).splitlines()
    assert table[0].split()[-1] == "REASON"
    assert table[2].endswith("\u2026") and "waits for 2 live nodes" in table[2]


def test_inspect_view_survives_a_minimal_answer() -> None:
    text = render_job({"name": "bare", "status": "pending", "history": []})
    assert text.startswith("name: bare\nstatus: pending\nowner: -\n")
    assert text.endswith("history: -")


def test_tz_fixture_restores_the_environment() -> None:
    assert os.environ.get("TZ") != "Asia/Kolkata"


def test_inspect_shows_each_nodes_output_with_its_size_and_sha256() -> None:
    outputs = [{"node_index": 0, "size": 3 * 2**20, "sha256": "ab" * 32, "at": "2026-12-03"}]
    text = render_job(dict(SAMPLE_JOB, outputs=outputs))
    assert f"outputs:\n  - output_0.zip: 3.0 MiB, SHA-256 {'ab' * 32}" in text
    assert "outputs:" not in render_job(SAMPLE_JOB)


def test_inspect_view_shows_priority_preemptibility_and_retries_from_the_spec() -> None:
    low = render_job(dict(SAMPLE_JOB, spec={**SAMPLE_JOB["spec"], "priority": "low"}))
    assert "  priority: low\n  preemptible: yes\n" in low
    retried = render_job(dict(SAMPLE_JOB, spec={
        **SAMPLE_JOB["spec"], "priority": "high", "preemptible": True, "max_retries": 2,
        "retry_on_exit_codes": [137, 143]}))  # fmt: skip
    assert ("  priority: high\n  preemptible: yes\n  max retries: 2\n"
            "  retry on exit codes: 137,143\n") in retried  # fmt: skip
    assert "preemptible" not in render_job(SAMPLE_JOB) and "max retries" not in low


def test_inspect_view_shows_each_attempt_and_the_preemption_asked(utc: None) -> None:
    job = dict(SAMPLE_JOB, attempt=2, attempts=[
        {"attempt": 1, "nodes": ["gpu-1"], "started_at": "2026-12-02T16:20:30+00:00",
         "ended_at": "2026-12-02T16:40:00+00:00", "cause": "node_lost"},
        {"attempt": 2, "nodes": ["gpu-2", "gpu-3"], "started_at": "2026-12-02T16:41:00+00:00"},
    ], preemption={"requested_at": "2026-12-02T16:50:00+00:00", "by_job": "urgent",
                   "by_owner": "bob"})  # fmt: skip
    text = render_job(job)
    assert "\nattempt: 2\nattempts:\n  - ATTEMPT  NODES" in text
    assert "  - 1        gpu-1        2026-12-02 16:20:30  2026-12-02 16:40:00  node_lost" in text
    assert "  - 2        gpu-2,gpu-3  2026-12-02 16:41:00  -                    -" in text
    assert ("preemption:\n  requested: 2026-12-02 16:50:00\n  by job: urgent\n"
            "  by owner: bob") in text  # fmt: skip


def test_inspect_view_of_an_older_document_shows_no_attempts_and_survives_odd_ones() -> None:
    assert "attempt" not in render_job(SAMPLE_JOB) and "preemption" not in render_job(SAMPLE_JOB)
    odd = render_job(dict(SAMPLE_JOB, attempt=None, attempts=[{}, "x"], preemption={}))
    assert "attempts:\n  - ATTEMPT  NODES  STARTED  ENDED  CAUSE\n  - -" in odd
