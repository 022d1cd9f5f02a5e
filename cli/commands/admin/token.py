"""Manages API tokens: `create` prints a new one, `list` shows them (never their values),
`revoke TOKEN_ID` makes one stop working at once, on every server.

Your own tokens; an admin makes and lists another user's with --user USER, lists everyone's
(nodes' too) with --all-users, and revokes any. `create` prints the token once, alone on
standard output (what is said about it goes to standard error); only its hash is stored.
"""

from __future__ import annotations

import argparse
import sys

from cli.commands import add_json_flag


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="make a token and print it")
    create.add_argument("--user", metavar="USER", help="whose (admins only; yours by default)")
    create.add_argument("--label", default="", metavar="TEXT", help="what it is for")
    add_json_flag(create)
    listing = actions.add_parser("list", help="tokens, without their values")
    whose = listing.add_mutually_exclusive_group()
    whose.add_argument("--user", metavar="USER", help="that user's (admins only)")
    whose.add_argument("--all-users", action="store_true",
                       help="every user's and node's (admins only)")  # fmt: skip
    add_json_flag(listing)
    revoke = actions.add_parser("revoke", help="make a token stop working")
    revoke.add_argument("token_id", metavar="TOKEN_ID", help="its id, as `list` shows it")
    add_json_flag(revoke)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.formats import render_json
    from cli.output.tables import render_table

    with ApiClient.from_config() as client:
        if args.action == "create":
            answer = client.create_token(user=args.user, label=args.label)
        elif args.action == "list":
            answer = client.list_tokens(user=args.user, all_users=args.all_users)
        else:
            answer = client.revoke_token(args.token_id)
    if args.json:
        print(render_json(answer))
    elif args.action == "create":
        print(answer["token"])
        print(f"made a token of user {answer['user']} (id {answer['token_id']}); it is shown "
              "this once", file=sys.stderr)  # fmt: skip
    elif args.action == "list":
        rows = [(token["token_id"], token["user_name"] or f"node {token['node_name']}",
                 token["label"], token["created_at"], token.get("created_by"),
                 token.get("revoked_at")) for token in answer["tokens"]]  # fmt: skip
        print(render_table(("ID", "FOR", "LABEL", "CREATED", "BY", "REVOKED"), rows))
    else:
        print(f"revoked token {answer['token_id']}: it no longer works")
    return 0
