"""Displays detailed information about a Training Job.

Its spec (repository, revision and resolved commit, requirements, accelerators, nodes, entry
point, environment, secret names), its status and failure reason, its node and accelerators,
its timestamps, and its history: one line per lifecycle event with when it happened, the status
it left the job in, who caused it and the facts behind it.

With --at TIME or --at-version N it shows the job as it was then instead, folded from the
ledger: its status, spec, nodes, accelerators, exit code and failure at that version. A name
no live job holds shows the newest deleted job of that name.
"""

from __future__ import annotations

import argparse

from cli.commands import add_json_flag, add_name, add_owner_flag


def configure(parser: argparse.ArgumentParser) -> None:
    add_owner_flag(parser)
    add_name(parser)
    add_json_flag(parser)
    past = parser.add_mutually_exclusive_group()
    past.add_argument(
        "--at", metavar="TIME",
        help="show the job as it was at TIME: ISO 8601 (e.g. 2026-12-03T10:00:00Z; without an "
        "offset it is UTC), or a time ago: --at=-10m, -2h, -1d",
    )  # fmt: skip
    past.add_argument(
        "--at-version", metavar="N", type=int,
        help="show the job as it was after its Nth event (`flexai training history` lists "
        "them)",
    )  # fmt: skip


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.formats import render_json
    from cli.output.jobs import render_job

    if args.at is not None or args.at_version is not None:
        return _past(args)
    with ApiClient.from_config(owner=args.owner) as client:
        job = client.get_job(args.name)
    print(render_json(job) if args.json else render_job(job))
    return 0


def _past(args: argparse.Namespace) -> int:
    import sys

    from cli.client.api import ApiClient
    from cli.output.formats import render_json
    from cli.output.ledger import render_past_job
    from cli.timetravel import job_named, parse_moment

    at = None if args.at is None else parse_moment(args.at).isoformat()
    with ApiClient.from_config(owner=args.owner) as client:
        job, note = job_named(client, args.name)
        state = client.audit_state(job["id"], version=args.at_version, at=at)
    if note:
        print(note, file=sys.stderr)
    print(render_json(state) if args.json else render_past_job(state))
    return 0
