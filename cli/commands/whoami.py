"""Shows who your API token acts for: a user (an admin or not), or a node."""

from __future__ import annotations

import argparse

from cli.commands import add_json_flag


def configure(parser: argparse.ArgumentParser) -> None:
    add_json_flag(parser)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.formats import render_json

    with ApiClient.from_config() as client:
        me = client.whoami()
    if args.json:
        print(render_json(me))
    elif me.get("kind") == "node":
        print(f"node {me.get('node')} (token {me.get('token_id')}) at {client.api_url}")
    else:
        role = " (admin)" if me.get("admin") else ""
        print(f"{me.get('user')}{role} (token {me.get('token_id')}) at {client.api_url}")
    return 0
