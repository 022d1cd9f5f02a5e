"""Deletes a Training Job.

Only a job in a terminal status (rejected, succeeded, failed, stopped, stop failed) can be
deleted: stop a running job first. The job leaves the list, its name is free again, and its
history stays in the ledger for audit; so do its logs, checkpoints and outputs (`flexai
training fetch --id JOB_ID`), until an admin purges them (`flexai admin purge`).
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
        answer = client.delete_job(args.name)
    name = answer.get("name", args.name)
    print(f"Deleted training job {name}; the name {name} is free again.")
    return 0
