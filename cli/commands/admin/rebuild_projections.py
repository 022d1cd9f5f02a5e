"""Rebuilds every view from the ledger's first event, then swaps them in at once.

The server folds the whole ledger into fresh tables while the views in use keep serving and
following it, then replaces them in one transaction: `list` and `inspect` never see empty or
half-built views. This command starts the rebuild and follows it to its end (`--no-wait`:
start it and return; `--status`: show the last rebuild). Needs the admin token.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from cli.commands import add_json_flag

POLL_S = 0.5


def configure(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--no-wait", action="store_true", help="start the rebuild and return")
    what.add_argument("--status", action="store_true",
                      help="show the last rebuild's progress, start nothing")  # fmt: skip
    add_json_flag(parser)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.formats import render_json

    with ApiClient.from_config() as client:
        if args.status:
            progress = client.admin_rebuild_progress()
        else:
            progress = client.admin_rebuild()
            if not args.json:
                print(f"rebuilding the views from the ledger ({progress.get('head', 0)} events)")
            while not args.no_wait and progress.get("state") == "running":
                time.sleep(POLL_S)
                progress = client.admin_rebuild_progress()
    if args.json:
        print(render_json(progress))
    else:
        print(_describe(progress))
    return 1 if progress.get("state") == "failed" else 0


def _describe(progress: dict[str, Any]) -> str:
    state = progress.get("state")
    if state == "idle":
        return "no rebuild has run on this server since it started"
    if state == "running":
        return (f"running since {progress.get('started_at')}: {progress.get('position', 0)} of "
                f"{progress.get('head', 0)} events folded")  # fmt: skip
    if state == "failed":
        return f"the rebuild failed: {progress.get('error')}; the views in use are unchanged"
    rows = progress.get("rows") or {}
    tables = ", ".join(f"{table} {count}" for table, count in rows.items())
    return (f"done in {progress.get('seconds')} s: the views were rebuilt up to ledger position "
            f"{progress.get('position')} and swapped in ({tables} rows)")  # fmt: skip
