"""What `inspect --at` and `history` share: moments as users write them, and a job name
resolved to one job of the ledger (the live one, or the newest deleted one)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from cli.errors import CliError, UsageError
from cli.output.formats import utc_iso

if TYPE_CHECKING:
    from cli.client.api import ApiClient

MOMENT_HELP = (
    "ISO 8601 (e.g. 2026-12-03T10:00:00Z; without an offset it is UTC), or a time ago: "
    "-10m, -2h, -1d (write --at=-10m, or --at 10m)"
)


def parse_moment(text: str, now: datetime | None = None) -> datetime:
    """``text`` as a UTC moment: ISO 8601 (naive taken as UTC), or a duration ago."""
    from common.durations import parse_duration

    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        pass
    else:
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    try:
        ago = parse_duration(text.strip().removeprefix("-"))
    except ValueError:
        raise UsageError(f"--at {text!r} is not a time: use {MOMENT_HELP}") from None
    return (now or datetime.now(UTC)) - timedelta(seconds=ago)


def job_named(client: ApiClient, name: str) -> tuple[dict[str, Any], str | None]:
    """The job holding ``name``, else the newest deleted one that held it (with a note
    saying so); CliError when no job ever had that name."""
    jobs = client.audit_jobs(name).get("jobs") or []
    if not jobs:
        raise CliError(f"no job was ever named '{name}'; `flexai training list` shows your jobs")
    live = [job for job in jobs if not job.get("deleted")]
    if live:
        return live[-1], None
    newest = max(jobs, key=lambda job: str(job.get("created_at")))
    note = (
        f"note: no live job is named '{name}'; showing the newest deleted one (id "
        f"{newest['id']}, created {utc_iso(newest.get('created_at'))}"
        + (f", 1 of {len(jobs)}; `flexai training history {name} --all` shows all)"
           if len(jobs) > 1 else ")")
    )  # fmt: skip
    return newest, note
