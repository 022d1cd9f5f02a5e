"""Lists all the Training Jobs.

Newest first, deleted jobs left out: name, status, accelerators per node, nodes, when the job
was created and how long it has run.
"""

from __future__ import annotations

import argparse

from cli.commands import add_json_flag


def configure(parser: argparse.ArgumentParser) -> None:
    add_json_flag(parser)


def execute(args: argparse.Namespace) -> int:
    from cli.client import ApiClient
    from cli.output import render_jobs_table, render_json

    with ApiClient.from_config() as client:
        answer = client.list_jobs()
    if args.json:
        print(render_json(answer))
        return 0
    jobs = answer.get("jobs") or []
    if not jobs:
        print("No training jobs. Start one with `flexai training run NAME -u URL -- ENTRY_POINT`.")
        return 0
    print(render_jobs_table(jobs))
    return 0
