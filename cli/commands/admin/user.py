"""Manages users: `create NAME [--admin]` prints the new user's first token, `list` lists them.

The token is printed once, alone on standard output (what is said about it goes to standard
error), so that `flexai admin user create alice > alice.token` keeps it; the control plane
stores only its hash. Give it to the user: `flexai login` takes it. Needs an admin's token.
"""

from __future__ import annotations

import argparse
import sys

from cli.commands import add_json_flag


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="make a user and print its first token")
    create.add_argument("name", metavar="NAME", help="lower-case letters, digits, '-' and '_'")
    create.add_argument("--admin", action="store_true", help="an admin: may act on every job")
    add_json_flag(create)
    listing = actions.add_parser("list", help="every user, admin or not, with its token count")
    add_json_flag(listing)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.formats import render_json
    from cli.output.tables import render_table

    with ApiClient.from_config() as client:
        if args.action == "create":
            answer = client.create_user(args.name, admin=args.admin)
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
        rows = [(user["name"], "yes" if user["admin"] else "no", user["tokens"],
                 user["created_at"], user.get("created_by"))
                for user in answer["users"]]  # fmt: skip
        print(render_table(("NAME", "ADMIN", "TOKENS", "CREATED", "BY"), rows))
    return 0
