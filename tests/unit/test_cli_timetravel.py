"""Moments as `inspect --at` reads them, and the lines `history` prints."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cli.errors import UsageError
from cli.output.formats import utc_iso
from cli.output.ledger import audit_event_lines
from cli.timetravel import parse_moment

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-03T10:00:00Z", datetime(2026, 12, 3, 10, tzinfo=UTC)),
        ("2026-12-03T10:00:00", datetime(2026, 12, 3, 10, tzinfo=UTC)),
        ("2026-12-03T11:00:00+01:00", datetime(2026, 12, 3, 10, tzinfo=UTC)),
        ("2026-12-03", datetime(2026, 12, 3, tzinfo=UTC)),
        ("-10m", NOW - timedelta(minutes=10)),
        ("-2h", NOW - timedelta(hours=2)),
        ("1d", NOW - timedelta(days=1)),
    ],
)
def test_a_moment_is_iso_8601_taken_as_utc_when_naive_or_a_time_ago(
    text: str, expected: datetime
) -> None:
    assert parse_moment(text, now=NOW) == expected


def test_a_moment_that_is_neither_says_what_is_accepted() -> None:
    with pytest.raises(UsageError, match="-10m"):
        parse_moment("yesterday", now=NOW)


def test_utc_iso_shows_any_offset_as_utc_to_the_second() -> None:
    assert utc_iso("2026-12-03T11:00:00.123456+01:00") == "2026-12-03T10:00:00Z"


def test_history_lines_cut_long_facts_with_an_ellipsis_unless_full() -> None:
    events = [
        {"version": 1, "at": "2026-12-03T10:00:00+00:00", "by": {"kind": "user", "id": "ann"},
         "type": "Submitted", "facts": {"spec": "x" * 300}},
        {"version": 2, "at": "2026-12-03T10:00:01+00:00", "by": {"kind": "scheduler",
         "id": "scheduler"}, "type": "SchedulingStarted", "facts": {}},
    ]  # fmt: skip
    header, submitted, scheduling = audit_event_lines(events)
    assert header.split() == ["VERSION", "AT", "BY", "EVENT", "FACTS"]
    assert submitted.split()[:5] == ["1", "2026-12-03T10:00:00Z", "user", "ann", "Submitted"]
    assert submitted.endswith("\u2026") and len(submitted) < 200
    assert scheduling.split() == ["2", "2026-12-03T10:00:01Z", "scheduler", "SchedulingStarted"]
    assert audit_event_lines(events, full=True)[1].endswith("x" * 300)
