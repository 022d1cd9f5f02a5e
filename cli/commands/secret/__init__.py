"""The ``flexai secret`` subcommands, one module each (see :mod:`cli.commands` for the shape).
Imports: cli.client, cli.commands, cli.errors, cli.output, common.contract."""

from __future__ import annotations

import argparse

from common.contract import SECRET_RULE, Refusal, check_secret_name

# In the order `flexai secret --help` lists them.
SECRET_COMMANDS = ("create", "list", "delete")



def secret_name(value: str) -> str:
    try:
        return check_secret_name(value)
    except Refusal as refusal:
        raise argparse.ArgumentTypeError(f"secret name {refusal}") from None


def add_secret_name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", metavar="NAME", type=secret_name, help=f"the secret's name: {SECRET_RULE}"
    )
