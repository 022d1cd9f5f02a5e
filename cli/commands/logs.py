"""Displays the logs from a Training Job.

The build and run output, as the node shipped it. With --follow, keeps streaming until the job
reaches a terminal status and every line was shown, then exits; press Ctrl-C to stop following
sooner.
"""

from __future__ import annotations

import argparse
import sys

from cli.commands import add_name


def configure(parser: argparse.ArgumentParser) -> None:
    add_name(parser)
    parser.add_argument(
        "--follow", "-f", action="store_true", help="stream new lines until the job ends"
    )


def execute(args: argparse.Namespace) -> int:
    from cli.client import ApiClient

    out = sys.stdout.buffer
    with ApiClient.from_config() as client:
        for chunk in client.iter_logs(args.name, follow=args.follow):
            out.write(chunk)
            out.flush()
    return 0
