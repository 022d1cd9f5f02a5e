"""Lists your Secrets: their names and dates, never their values."""

from __future__ import annotations

import argparse

from cli.commands import add_json_flag


def configure(parser: argparse.ArgumentParser) -> None:
    add_json_flag(parser)


def execute(args: argparse.Namespace) -> int:
    from cli.client.api import ApiClient
    from cli.output.formats import render_json
    from cli.output.tables import render_secrets_table

    with ApiClient.from_config() as client:
        answer = client.list_secrets()
    if args.json:
        print(render_json(answer))
        return 0
    secrets = answer.get("secrets") or []
    if not secrets:
        print("No secrets. Create one with `flexai secret create NAME`.")
        return 0
    print(render_secrets_table(secrets))
    return 0
