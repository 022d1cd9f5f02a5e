"""What ``inspect --at`` and ``history`` show from the ledger: a job's past state, its events,
the header of each job that held a name. Times here are UTC, as the ledger keeps them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cli.output.formats import EMPTY, format_by, format_facts, utc_iso
from cli.output.jobs import job_detail
from cli.output.tables import render_table
from cli.output.yaml_like import render_yaml

FACTS_WIDTH = 100


def _utc(value: Any) -> str:
    return utc_iso(value) if isinstance(value, str) else EMPTY


def render_past_job(state: Mapping[str, Any]) -> str:
    """The ``inspect --at`` view of an AuditJobState: a past state, and says so first."""
    event_by = state.get("event_by")
    lines = [
        f"as of {_utc(state.get('as_of'))} (version {state.get('version')} of "
        f"{state.get('latest_version')})",
        f"past state folded from the ledger: the job after its {state.get('event')} event "
        f"at {_utc(state.get('event_at'))}" + (f" by {format_by(event_by)}" if event_by else ""),
    ]
    placements = list(state.get("placements") or [])
    detail = job_detail({**state, "history": []})
    del detail["timestamps"], detail["history"]
    detail["deleted"] = bool(state.get("deleted"))
    if len(placements) == 1:
        detail["exit code"] = placements[0].get("exit_code")
    detail["created"] = _utc(state.get("created_at"))
    return "\n".join(lines) + "\n" + render_yaml(detail)


def audit_event_lines(events: Sequence[Mapping[str, Any]], full: bool = False) -> list[str]:
    """One line per ledger event: version, UTC time, who, event, facts (cut unless
    ``full``)."""
    rows = [
        (event.get("version"), _utc(event.get("at")), format_by(event.get("by")),
         event.get("type"))
        for event in events
    ]  # fmt: skip
    facts = [format_facts(event.get("facts")) for event in events]
    if not full:
        facts = [f if len(f) <= FACTS_WIDTH else f[: FACTS_WIDTH - 1] + "\u2026" for f in facts]
    lines = render_table(("VERSION", "AT", "BY", "EVENT"), rows).splitlines()
    width = max(len(line) for line in lines)
    body = [f"{line.ljust(width)}  {fact}".rstrip() for line, fact in zip(lines[1:], facts,
                                                                          strict=True)]
    return [f"{lines[0].ljust(width)}  FACTS", *body]


def audit_job_header(job: Mapping[str, Any]) -> str:
    """``job ID  created ...  deleted|live  (status)``: one job among those of a name."""
    state = "deleted" if job.get("deleted") else "live"
    return (f"job {job.get('id')}  created {_utc(job.get('created_at'))}  {state}  "
            f"({job.get('status')})")  # fmt: skip
