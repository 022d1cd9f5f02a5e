"""Lists a Training Job's events, straight from the ledger.

One line per event, oldest first: its version, when it was recorded (UTC), who caused it, the
event and its facts (long facts are cut; --full shows them whole). A name no live job holds
shows the newest deleted job of that name; --all shows every job that ever held the name, each
after a line with its id, when it was created and whether it is deleted or live.
"""

from __future__ import annotations

import argparse

from cli.commands import add_json_flag, add_name, add_owner_flag


def configure(parser: argparse.ArgumentParser) -> None:
    add_owner_flag(parser)
    add_name(parser)
    add_json_flag(parser)
    parser.add_argument("--full", action="store_true", help="show every event's facts whole")
    parser.add_argument(
        "--all", action="store_true",
        help="every job that ever held the name, deleted ones too, oldest first",
    )  # fmt: skip


def execute(args: argparse.Namespace) -> int:
    import sys

    from cli.client.api import ApiClient
    from cli.output.formats import render_json
    from cli.output.ledger import audit_event_lines, audit_job_header
    from cli.timetravel import job_named

    with ApiClient.from_config(owner=args.owner) as client:
        if args.all:
            jobs = client.audit_jobs(args.name).get("jobs") or []
            if not jobs:
                job_named(client, args.name)  # says that no job ever had the name
            note = None
        else:
            job, note = job_named(client, args.name)
            jobs = [job]
        histories = [{**job, "events": client.audit_events(job["id"])["events"]}
                     for job in jobs]  # fmt: skip
    if args.json:
        print(render_json({"jobs": histories} if args.all else histories[0]))
        return 0
    if note:
        print(note, file=sys.stderr)
    blocks = [
        "\n".join(([audit_job_header(job)] if args.all else [])
                  + audit_event_lines(job["events"], full=args.full))
        for job in histories
    ]  # fmt: skip
    print("\n\n".join(blocks))
    return 0
