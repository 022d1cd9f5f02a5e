"""Stops a Training Job.

The job goes to `stop in progress`, then `stopped` once its processes ended and its
accelerators were released, or `stop failed` (inspect the job to read why).
"""

from __future__ import annotations

import argparse

from cli.commands import add_name, add_owner_flag


def configure(parser: argparse.ArgumentParser) -> None:
    add_owner_flag(parser)
    add_name(parser)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient

    with ApiClient.from_config(owner=args.owner) as client:
        job = client.stop_job(args.name)
    name = job.get("name", args.name)
    print(f"Stop requested for training job {name}: status {job.get('status', '-')}.")
    print(f"Watch it with:  flexai training inspect {name}")
    return 0
