"""The fleet's nodes: `list` shows each registered node, its accelerators (busy of all), whether
its agent is alive, and how it keeps jobs apart (ISOLATION: `sandbox`, each job in a sandbox of
its own; `user`, every job as one user, seeing the others; `none`, jobs run as the agent's own
user), with `--wide` the agent's own words on it. Needs an admin's token.
"""

from __future__ import annotations

import argparse

from cli.commands import add_json_flag

COLUMNS = ("NAME", "ACCELS", "TYPE", "BUSY", "ALIVE", "ISOLATION", "LIMITS")


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="the registered nodes and their isolation")
    listing.add_argument("--wide", action="store_true",
                         help="also what each node's agent says its jobs share")
    add_json_flag(listing)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.formats import render_json
    from cli.output.tables import render_table

    with ApiClient.from_config() as client:
        answer = client.list_nodes()
    if args.json:
        print(render_json(answer))
        return 0
    nodes = sorted(answer.get("nodes") or [], key=lambda node: str(node.get("name")))
    rows = []
    for node in nodes:
        isolation = node.get("isolation") or {}
        row = [node.get("name"), node.get("accels"), node.get("accel_type"),
               node.get("busy_accels"), node.get("alive"), isolation.get("level", "unknown"),
               isolation.get("limits") if isolation else None]  # fmt: skip
        if args.wide:
            row.append(isolation.get("detail") or "(an agent from before isolation levels)")
        rows.append(row)
    print(render_table((*COLUMNS, "DETAIL") if args.wide else COLUMNS, rows))
    return 0
