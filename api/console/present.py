"""What the pages show of a job, arranged for people: times, durations, the spec (names of
env variables and secrets, never values), a history entry with its facts, why a job waits.

Everything here returns plain text; the templates escape it (autoescape) and the live
streams send it as JSON that the page inserts as text nodes.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from common.job_spec import JobSpec
from common.wording import EMPTY, asked_for, node_lines, place_in_line, plain, whose_failure
from domain.failures import failure_kind
from domain.lifecycle import ROWS
from domain.statuses import TERMINAL, Status

WAITING = frozenset({Status.SCHEDULING.value, Status.ENQUEUED.value})
STOPPABLE = frozenset(status.value for status in ROWS["StopRequested"].sources)
DELETABLE = frozenset(status.value for status in ROWS["Deleted"].sources)
ENDED = frozenset(status.value for status in TERMINAL)


def moment(value: str | None) -> str:
    """An ISO 8601 timestamp in UTC, to the second (``2026-12-02 16:20:00 UTC``)."""
    if not value:
        return EMPTY
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return str(value)
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC)
    return parsed.strftime("%Y-%m-%d %H:%M:%S UTC")


def seconds_between(started: str | None, ended: str | None) -> float | None:
    """From start to end (or now); None before the job ran."""
    if not started:
        return None
    end = datetime.fromisoformat(ended) if ended else datetime.now(UTC)
    return (end - datetime.fromisoformat(started)).total_seconds()


def duration(seconds: float | None) -> str:
    """``1h 02m 03s``, ``4m 05s``, ``6s``; ``-`` when unknown."""
    if seconds is None:
        return EMPTY
    whole = max(int(seconds), 0)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def cell(value: Any) -> str:
    """One value as text: ``-`` for nothing, yes/no, lists comma-joined, mappings as JSON."""
    return plain(value)


def actor(by: Mapping[str, Any] | None) -> str:
    if not by:
        return EMPTY
    kind, who = by.get("kind"), by.get("id")
    return str(who) if kind == "user" else f"{who} ({kind})"


def summary_row(row: Mapping[str, Any], reason: str | None) -> dict[str, Any]:
    """A row of the jobs page (the columns of `flexai training list`, and the reason)."""
    return {
        "id": row["id"],
        "owner": row["owner"],
        "name": row["name"],
        "status": row["status"],
        "accels": row["accels"],
        "nodes": row["nodes"],
        "created": moment(row["created_at"]),
        "created_at": row["created_at"],
        "duration": duration(seconds_between(row.get("started_at"), row.get("ended_at"))),
        "reason": reason if row["status"] in WAITING else None,
    }


def history_entry(version: int, entry: Mapping[str, Any]) -> dict[str, Any]:
    """One event of a job's timeline: its version, what, when, by whom, and its facts."""
    facts = entry.get("facts") or {}
    return {
        "version": version,
        "event": entry.get("event"),
        "status": entry.get("status"),
        "at": moment(entry.get("at")),
        "at_iso": entry.get("at"),
        "by": actor(entry.get("by")),
        "facts": [[str(key), cell(value)] for key, value in facts.items()],
    }


def history(document: Mapping[str, Any], since: int = 0) -> list[dict[str, Any]]:
    """The timeline from version ``since + 1`` on (the view keeps one entry per event)."""
    entries = document.get("history") or []
    return [history_entry(index + 1, entry) for index, entry in enumerate(entries)
            if index + 1 > since]  # fmt: skip


def spec_of(document: Mapping[str, Any]) -> JobSpec:
    """The spec of a job's document of the views, typed."""
    return JobSpec.from_dict(document.get("spec") or {})


def spec_rows(spec: JobSpec, commit: str | None) -> list[tuple[str, str]]:
    """The spec as label and text; env variables and secrets by name only."""
    pins = spec.dataset_hashes
    datasets = [f"{name} ({pins[name][:12]})" if name in pins else f"{name} (not pinned)"
                for name in spec.datasets]  # fmt: skip
    secrets = [f"{variable} from secret {name}" for variable, name in spec.secrets.items()]
    rows = [
        ("repository", cell(spec.repository_url or None)),
        ("revision", spec.repository_revision or "(default branch)"),
        ("commit", cell(commit)),
        ("entry point", cell(shlex.join(spec.entry_point) if spec.entry_point else None)),
        ("requirements", cell(spec.requirements_path)),
        ("accelerators per node", cell(spec.accels)),
        ("nodes", cell(spec.nodes)),
        ("env names", cell(sorted(spec.env))),
        ("secrets", cell(secrets)),
        ("datasets", cell(datasets)),
        ("checkpoint", cell(spec.checkpoint)),
        ("time limit", duration(spec.time_limit_s) if spec.time_limit_s else EMPTY),
    ]
    return rows


def placement_rows(placements: list[Mapping[str, Any]]) -> list[dict[str, str]]:
    return [
        {
            "index": str(placement.get("index", index)),
            "node": cell(placement.get("node") or placement.get("node_name")),
            "address": cell(placement.get("address")),
            "built": cell(bool(placement.get("built"))),
            "accelerators": cell(list(placement.get("accelerators") or [])),
            "exit_code": cell(placement.get("exit_code")),
        }
        for index, placement in enumerate(placements)
    ]


def waiting_lines(waiting: Mapping[str, Any]) -> dict[str, Any]:
    """Why a job waits: the one-line reason, what it asked for, each node, its place."""
    return {
        "reason": waiting.get("reason") or EMPTY,
        "asked": asked_for(waiting),
        "nodes": node_lines(waiting, moment),
        "place": place_in_line(waiting),
    }


def job_state(document: Mapping[str, Any]) -> dict[str, Any]:
    """What the live stream tells a job page: the status and which actions it allows."""
    status = str(document["status"])
    return {
        "status": status,
        "ended": status in ENDED,
        "can_stop": status in STOPPABLE,
        "can_delete": status in DELETABLE and not document.get("deleted_at"),
        "duration": duration(seconds_between(document.get("started_at"),
                                             document.get("ended_at"))),  # fmt: skip
        "failure": failure_text(document.get("failure"), spec_of(document),
                                document.get("retries_left")),  # fmt: skip
    }


def failure_text(failure: Mapping[str, Any] | None, spec: JobSpec,
                 retries_left: int | None) -> str:  # fmt: skip
    """A job's failure as its page shows it: its message, then whose it was (as ``inspect``
    says it); ``-`` for none. A job read from the ledger (``as_of``) has no kind in its
    failure: it is classified here as the views do."""
    if not failure:
        return EMPTY
    if "kind" not in failure and failure.get("code") not in (None, "stop_failed"):
        failure = {**failure, "kind": failure_kind(str(failure["code"])).value}
    asked = spec.max_retries
    whose = whose_failure(failure, asked, asked if retries_left is None else retries_left)
    message = cell(failure.get("message"))
    return f"{message} ({whose})" if whose else message
