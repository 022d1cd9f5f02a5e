"""Removes the artifacts of jobs deleted before a date from the artifact store.

Deleting a job keeps its artifacts (its logs, checkpoints and outputs stay fetchable by id for
audit: `flexai training fetch --id JOB_ID`). This removes them for every job deleted before
DATE (`2026-01-31`: midnight UTC; or a moment, `2026-01-31T12:00:00+01:00`) and records an
`ArtifactsPurged` event in each job's history: how many objects went, and who purged them. A
job purged once is not purged again, so running it twice removes nothing more. Prints what it
purged. Needs the admin token.
"""

from __future__ import annotations

import argparse
from datetime import UTC, date, datetime

from cli.commands import add_json_flag


def moment(value: str) -> str:
    """A date (midnight UTC) or an ISO 8601 moment (naive: UTC), as ISO 8601."""
    try:
        if len(value) == 10:
            day = date.fromisoformat(value)
            return datetime(day.year, day.month, day.day, tzinfo=UTC).isoformat()
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r:.80} is not a date: give YYYY-MM-DD or an ISO 8601 moment"
        ) from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).isoformat()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--deleted-before", type=moment, required=True, metavar="DATE",
        help="purge the artifacts of jobs deleted before this date (YYYY-MM-DD, UTC) or moment",
    )  # fmt: skip
    add_json_flag(parser)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.formats import render_json

    with ApiClient.from_config() as client:
        answer = client.admin_purge(args.deleted_before)
    if args.json:
        print(render_json(answer))
        return 0
    purged = answer.get("purged") or []
    for job in purged:
        print(f"purged {job['owner']}/{job['name']} ({job['id']}, deleted {job['deleted_at']}): "
              f"{job['objects']} object(s)")  # fmt: skip
    print(f"{len(purged)} job(s) deleted before {answer['deleted_before']} purged"
          + ("" if purged else " (none left to purge)"))  # fmt: skip
    return 0
