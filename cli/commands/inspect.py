"""Displays detailed information about a Training Job.

Its spec (repository, revision and resolved commit, requirements, accelerators, nodes, entry
point, environment, secret names), its status and failure reason, its node and accelerators,
its timestamps, and its history: one line per lifecycle event with when it happened, the status
it left the job in, who caused it and the facts behind it.
"""

from __future__ import annotations

import argparse

from cli.commands import add_json_flag, add_name


def configure(parser: argparse.ArgumentParser) -> None:
    add_name(parser)
    add_json_flag(parser)


def execute(args: argparse.Namespace) -> int:
    from cli.client import ApiClient
    from cli.output import render_job, render_json

    with ApiClient.from_config() as client:
        job = client.get_job(args.name)
    print(render_json(job) if args.json else render_job(job))
    return 0
