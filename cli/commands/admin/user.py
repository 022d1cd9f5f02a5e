"""Manages users: `create NAME [--admin]` prints the new user's first token, `list` lists them
(with each one's quota and whether it may submit priority high jobs), `quota USER --accels N`
(or `--none`) sets how many accelerators a user's jobs may hold running at once, and
`high-priority USER --allow` (or `--deny`) lets a user submit `--priority high` jobs.

The token is printed once, alone on standard output (what is said about it goes to standard
error), so that `flexai admin user create alice > alice.token` keeps it; the control plane
stores only its hash. Give it to the user: `flexai login` takes it. Needs an admin's token.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cli.commands import add_json_flag


def accel_count(value: str) -> int:
    """An argparse type: a whole number of accelerators, 0 or more."""
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of accelerators, 0 or more, not {value!r} (--none: no "
            "quota)"
        )
    return number


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="make a user and print its first token")
    create.add_argument("name", metavar="NAME", help="lower-case letters, digits, '-' and '_'")
    create.add_argument("--admin", action="store_true", help="an admin: may act on every job")
    add_json_flag(create)
    listing = actions.add_parser("list", help="every user, admin or not, with its token count, "
                                 "quota and leave to use priority high")  # fmt: skip
    add_json_flag(listing)
    quota = actions.add_parser(
        "quota", help="set how many accelerators a user's jobs may hold running at once"
    )
    quota.add_argument("name", metavar="USER")
    limit = quota.add_mutually_exclusive_group(required=True)
    limit.add_argument("--accels", type=accel_count, metavar="N",
                       help="at most N accelerators at once; more of its jobs wait")  # fmt: skip
    limit.add_argument("--none", action="store_true", help="no quota: take the one set away")
    add_json_flag(quota)
    high = actions.add_parser("high-priority", help="allow or deny a user priority high jobs")
    high.add_argument("name", metavar="USER")
    choice = high.add_mutually_exclusive_group(required=True)
    choice.add_argument("--allow", action="store_true", help="it may submit --priority high")
    choice.add_argument("--deny", action="store_true", help="it may not (admins always may)")
    add_json_flag(high)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.formats import render_json

    with ApiClient.from_config() as client:
        if args.action == "create":
            answer = client.create_user(args.name, admin=args.admin)
        elif args.action == "quota":
            answer = client.set_quota(args.name, None if args.none else args.accels)
        elif args.action == "high-priority":
            answer = client.set_high_priority(args.name, bool(args.allow))
        else:
            answer = client.list_users()
    if args.json:
        print(render_json(answer))
    elif args.action == "create":
        kind = "admin" if answer["user"]["admin"] else "user"
        print(answer["token"]["token"])
        print(f"created {kind} {args.name}; the token above (id {answer['token']['token_id']}) is "
              f"shown this once: give it to {args.name}, who runs `flexai login`",
              file=sys.stderr)  # fmt: skip
    else:
        print(_said(args.action, answer))
    return 0


def _said(action: str, answer: dict[str, Any]) -> str:
    """What a set limit now is, or the users' table."""
    from cli.output.tables import render_table

    if action == "quota":
        accels = answer.get("accels")
        if accels is None:
            return f"user {answer['user']} has no quota now: its jobs may use any free accelerators"
        return (f"user {answer['user']}'s jobs may now hold at most {accels} accelerators "
                "running at once; more of its jobs wait")
    if action == "high-priority":
        return (f"user {answer['user']} may now submit priority high jobs" if answer["allowed"]
                else f"user {answer['user']} may no longer submit priority high jobs")
    rows = [(user["name"], "yes" if user["admin"] else "no", user["tokens"],
             user.get("quota_accels"), _high(user),
             user["created_at"], user.get("created_by"))
            for user in answer["users"]]  # fmt: skip
    return render_table(("NAME", "ADMIN", "TOKENS", "QUOTA", "HIGH", "CREATED", "BY"), rows)


def _high(user: dict[str, Any]) -> str:
    if user.get("high_priority"):
        return "yes"
    return "admin" if user.get("admin") else "no"
