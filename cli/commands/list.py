"""Lists all the Training Jobs.

Newest first, deleted jobs left out: name, status, accelerators per node, nodes, when the job
was created and how long it has run. One page at a time: the newest 50 (--limit N, up to 500),
then a line saying that there are more; --all pages through every one. --status (repeatable,
or comma-separated, e.g. `--status "in progress",enqueued`) and --name-prefix narrow the list.
Your own jobs; an admin lists one user's with --owner USER, or everyone's with --all-users.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from cli.commands import add_json_flag
from common.contract import MAX_PAGE

DEFAULT_LIMIT = 50
MAX_LIMIT = MAX_PAGE
"""The server's largest page; --all pages by it unless --limit says otherwise."""


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_LIMIT}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit", type=_limit, metavar="N",
        help=f"jobs per page (default {DEFAULT_LIMIT}, at most {MAX_LIMIT})",
    )  # fmt: skip
    parser.add_argument(
        "--status", action="append", default=[], metavar="S",
        help="only jobs in this status (repeatable, or comma-separated)",
    )  # fmt: skip
    parser.add_argument("--name-prefix", metavar="P", help="only jobs whose name starts with P")
    parser.add_argument("--all", action="store_true", help="list every job, page after page")
    whose = parser.add_mutually_exclusive_group()
    whose.add_argument("--all-users", action="store_true",
                       help="every user's jobs, with an OWNER column (admins only)")  # fmt: skip
    whose.add_argument("--owner", metavar="USER", help="that user's jobs (admins only)")
    add_json_flag(parser)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.formats import render_json
    from cli.output.tables import render_jobs_table

    filters: dict[str, Any] = {"statuses": args.status, "name_prefix": args.name_prefix}
    owner = "*" if args.all_users else args.owner
    with ApiClient.from_config(owner=owner) as client:
        if args.all:
            answer = _every_page(client, args.limit or MAX_LIMIT, filters)
        else:
            answer = client.list_jobs(limit=args.limit or DEFAULT_LIMIT, **filters)
    if args.json:
        print(render_json(answer))
        return 0
    jobs = answer.get("jobs") or []
    if not jobs:
        print(_nothing(args))
        return 0
    print(render_jobs_table(jobs, owners=args.all_users))
    if answer.get("next_cursor"):
        print(f"{len(jobs)} newest jobs shown, more exist; `{_command_for_all(args)}` lists "
              "every one")  # fmt: skip
    return 0


def _every_page(client: Any, limit: int, filters: dict[str, Any]) -> dict[str, Any]:
    """Every page followed by its cursor, as one answer of the same shape."""
    jobs: list[dict[str, Any]] = []
    cursor = None
    while True:
        answer = client.list_jobs(limit=limit, cursor=cursor, **filters)
        jobs += answer.get("jobs") or []
        cursor = answer.get("next_cursor")
        if not cursor:
            return {"jobs": jobs, "count": len(jobs), "next_cursor": None}


def _nothing(args: argparse.Namespace) -> str:
    if args.status or args.name_prefix:
        return "No training jobs match. `flexai training list` without filters shows them all."
    return "No training jobs. Start one with `flexai training run NAME -u URL -- ENTRY_POINT`."


def _command_for_all(args: argparse.Namespace) -> str:
    words = ["flexai", "training", "list", "--all"]
    for status in args.status:
        words += ["--status", status]
    if args.name_prefix:
        words += ["--name-prefix", args.name_prefix]
    if args.all_users:
        words.append("--all-users")
    elif args.owner:
        words += ["--owner", args.owner]
    return shlex.join(words)
