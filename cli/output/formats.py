"""One value as people read it: durations, timestamps (local, or UTC for the ledger), sizes,
table cells, who did something and what; and a whole answer as JSON, for scripts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from common.wording import plain

EMPTY = "-"


def format_duration(seconds: float | int | None) -> str:
    """``42s``, ``1m 05s``, ``2h 03m 04s``, ``3d 04h 05m``; ``-`` when unknown."""
    if seconds is None:
        return EMPTY
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h {minutes:02d}m"
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def format_seconds(value: Any) -> str | None:
    """A spec's duration in seconds as people write it (``2h``); None when not a number."""
    from common.durations import human_duration

    return human_duration(value) if isinstance(value, int | float) else None


def format_timestamp(value: str | None) -> str:
    """An ISO 8601 UTC timestamp shown in local time, to the second; ``-`` when absent."""
    if not value:
        return EMPTY
    try:
        moment = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return str(value)
    if moment.tzinfo is not None:
        moment = moment.astimezone()
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def utc_iso(value: str | datetime | None) -> str:
    """``2026-12-03T10:00:00Z``: UTC to the second; ``-`` when absent."""
    if not value:
        return "-"
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_size(size: int | None) -> str:
    """``512 B``, ``1.5 KiB``, ``12.3 MiB``."""
    if size is None:
        return EMPTY
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover - the loop always returns


def format_cell(value: Any) -> str:
    """One table cell: ``-`` for nothing, ``yes``/``no`` for booleans, lists comma-joined."""
    return plain(value, ",")


def format_scalar(value: Any) -> str:
    """One value of the YAML-like view: ``-`` for nothing, ``yes``/``no`` for booleans."""
    if value is None or value == [] or value == {}:
        return EMPTY
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def format_by(by: Any) -> str:
    """Who did something: ``KIND ID``, or one of them when the other is missing or the same."""
    if isinstance(by, Mapping):
        kind, who = by.get("kind"), by.get("id")
        if kind and who and kind != who:
            return f"{kind} {who}"
        return str(who or kind or EMPTY)
    return format_scalar(by)


def format_facts(facts: Any) -> str:
    """An event's facts as ``key=value`` pairs, one space apart."""
    if not isinstance(facts, Mapping):
        return "" if facts is None else str(facts)
    return " ".join(f"{key}={format_cell(value)}" for key, value in facts.items())


def render_json(data: Any) -> str:
    """The server's answer as indented JSON, for scripts."""
    return json.dumps(data, indent=2, ensure_ascii=False)
