"""Lists your Secrets: their names and dates, never their values."""

from __future__ import annotations

import argparse

from cli.commands import add_json_flag, print_listing


def configure(parser: argparse.ArgumentParser) -> None:
    add_json_flag(parser)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.tables import render_secrets_table

    with ApiClient.from_config() as client:
        answer = client.list_secrets()
    return print_listing(args, answer, "secrets", render_secrets_table,
                         "No secrets. Create one with `flexai secret create NAME`.")
