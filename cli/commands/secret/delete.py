"""Deletes a Secret.

Jobs already running keep the value they were given; jobs that name it and build from now on
fail with `secret_not_found`.
"""

from __future__ import annotations

import argparse

from cli.commands.secret import add_secret_name


def configure(parser: argparse.ArgumentParser) -> None:
    add_secret_name(parser)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient

    with ApiClient.from_config() as client:
        client.delete_secret(args.name)
    print(f"Deleted secret {args.name}.")
    return 0
